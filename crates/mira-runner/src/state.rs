//! The runner's state directory: the device key (`device.key`, mode 0600, never sent
//! anywhere), the enrollment (`device.json`: server, device id, the pinned control plane key)
//! and the job journal (`journal/`, [`crate::journal`]).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use ed25519_dalek::{SigningKey, VerifyingKey};
use rand::RngExt;
use serde::{Deserialize, Serialize};

/// File of the device's private key (hex of the 32-byte Ed25519 seed).
pub const KEY_FILE: &str = "device.key";
/// File of the enrollment.
pub const DEVICE_FILE: &str = "device.json";

/// What enrollment recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Enrolled {
    /// The control plane's base URL.
    pub server: String,
    /// The device id.
    pub device_id: String,
    /// The device's name at enrollment.
    pub name: String,
    /// The control plane's Ed25519 public key (hex), pinned: jobs signed by any other key
    /// are refused.
    pub server_public_key: String,
}

/// The default state directory: `$MIRA_RUNNER_DIR`, else `$XDG_CONFIG_HOME/mira-runner`,
/// else `~/.config/mira-runner`.
pub fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME") {
        return PathBuf::from(dir).join("mira-runner");
    }
    std::env::var_os("HOME")
        .map_or_else(|| PathBuf::from(".mira-runner"), |h| PathBuf::from(h).join(".config/mira-runner"))
}

/// Creates the state directory (mode 0700) if missing.
pub fn ensure_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// Generates a new device key in `dir` (mode 0600). Refuses to overwrite one.
pub fn new_key(dir: &Path) -> anyhow::Result<SigningKey> {
    let mut seed = [0u8; 32];
    rand::rng().fill(&mut seed);
    let path = dir.join(KEY_FILE);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {} (is this device already enrolled?)", path.display()))?;
    f.write_all(format!("{}\n", hex::encode(seed)).as_bytes())?;
    f.sync_all()?;
    Ok(mira_core::remote::signing_key(&seed))
}

/// Loads the device key; refuses a key file that others can read.
pub fn load_key(dir: &Path) -> anyhow::Result<SigningKey> {
    let path = dir.join(KEY_FILE);
    let meta =
        std::fs::metadata(&path).with_context(|| format!("{} (run `mira runner enroll` first)", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        bail!(
            "{} is readable by others (mode {:o}); it must be 0600",
            path.display(),
            meta.permissions().mode() & 0o777
        );
    }
    let text = std::fs::read_to_string(&path)?;
    let seed: [u8; 32] = hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .with_context(|| format!("{} is not a 32-byte hex key", path.display()))?;
    Ok(mira_core::remote::signing_key(&seed))
}

/// Writes the enrollment record.
pub fn save_enrolled(dir: &Path, enrolled: &Enrolled) -> anyhow::Result<()> {
    let tmp = dir.join(format!("{DEVICE_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(enrolled)?)?;
    std::fs::rename(&tmp, dir.join(DEVICE_FILE))?;
    Ok(())
}

/// Reads the enrollment record and the pinned key.
pub fn load_enrolled(dir: &Path) -> anyhow::Result<(Enrolled, VerifyingKey)> {
    let path = dir.join(DEVICE_FILE);
    let text = std::fs::read(&path).with_context(|| format!("{} (run `mira runner enroll` first)", path.display()))?;
    let enrolled: Enrolled =
        serde_json::from_slice(&text).with_context(|| format!("{} does not parse", path.display()))?;
    let key = mira_core::remote::parse_public(&enrolled.server_public_key)
        .with_context(|| format!("{}: the pinned server key is not an Ed25519 key", path.display()))?;
    Ok((enrolled, key))
}
