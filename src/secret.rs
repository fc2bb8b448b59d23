//! Secrets at rest — External MCP headers and env, search provider keys — sealed with
//! XChaCha20-Poly1305 (RFC 8439 ChaCha20-Poly1305 with the 192-bit extended nonce of
//! draft-irtf-cfrg-xchacha) under a 256-bit key.
//!
//! A sealed value is standard base64 of `nonce (24 random bytes) || ciphertext || tag`, with
//! the owning row's id as associated data, so a ciphertext copied onto another row does not
//! open. The key is `MIRA_SECRET_KEY` (32 bytes, base64) or `<data-dir>/secret.key` (created
//! on first use, mode 0600); its id (first 16 hex digits of its SHA-256) is stored beside
//! every ciphertext.

use std::path::{Path, PathBuf};

use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngExt;

/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// Bytes of a nonce.
pub const NONCE_BYTES: usize = 24;
/// Name of the key file in the data directory.
pub const KEY_FILE: &str = "secret.key";

/// Why a key cannot be loaded, or a value cannot be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The key is not [`KEY_BYTES`] long (its length in bytes).
    #[error("a secret key has {KEY_BYTES} bytes, not {0}")]
    KeyLength(usize),
    /// `MIRA_SECRET_KEY` or the key file is not base64.
    #[error("{what} is not base64: {source}")]
    NotBase64 {
        /// `MIRA_SECRET_KEY` or the key file's path.
        what: String,
        /// The decoder's error.
        source: base64::DecodeError,
    },
    /// The key file cannot be read or created.
    #[error("{}: {source}", path.display())]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Encryption failed.
    #[error("sealing failed")]
    Seal,
    /// The value was sealed under another key.
    #[error("the secrets were sealed with key {sealed_with}, but this server holds key {held}")]
    OtherKey {
        /// Id of the key the value was sealed with.
        sealed_with: String,
        /// Id of this server's key.
        held: String,
    },
    /// The value does not decrypt: not base64, too short, a wrong tag or associated data, or
    /// not UTF-8.
    #[error("the stored secrets do not decrypt (corrupt, or bound to another server)")]
    Corrupt,
}

/// Seals and opens secret values with one key.
pub struct SecretBox {
    cipher: XChaCha20Poly1305,
    key_id: String,
    /// SHA-256 of a label and the key: the root of [`SecretBox::derive_seed`].
    derive_root: [u8; 32],
}

impl std::fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretBox").field("key_id", &self.key_id).finish_non_exhaustive()
    }
}

impl SecretBox {
    /// A box over a raw 32-byte key.
    pub fn from_key(key: &[u8]) -> Result<Self, SecretError> {
        let cipher = XChaCha20Poly1305::new_from_slice(key).map_err(|_| SecretError::KeyLength(key.len()))?;
        use sha2::Digest;
        let derive_root: [u8; 32] =
            sha2::Sha256::new().chain_update(b"mira-derive-v1\n").chain_update(key).finalize().into();
        Ok(Self { cipher, key_id: crate::evidence::sha256_hex(key)[..16].to_owned(), derive_root })
    }

    /// The key from `MIRA_SECRET_KEY` when set, else from `<data_dir>/secret.key`, created
    /// (mode 0600, 32 random bytes in base64) when missing.
    pub fn load(data_dir: &Path) -> Result<Self, SecretError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        if let Ok(text) = std::env::var("MIRA_SECRET_KEY") {
            let key = b64
                .decode(text.trim())
                .map_err(|source| SecretError::NotBase64 { what: "MIRA_SECRET_KEY".into(), source })?;
            return Self::from_key(&key);
        }
        let file = data_dir.join(KEY_FILE);
        match std::fs::read_to_string(&file) {
            Ok(text) => {
                let key = b64
                    .decode(text.trim())
                    .map_err(|source| SecretError::NotBase64 { what: file.display().to_string(), source })?;
                Self::from_key(&key)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; KEY_BYTES];
                rand::rng().fill(&mut key);
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&file) {
                    Ok(mut f) => f
                        .write_all(format!("{}\n", b64.encode(key)).as_bytes())
                        .map_err(|source| SecretError::KeyFile { path: file.clone(), source })?,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(source) => return Err(SecretError::KeyFile { path: file, source }),
                }
                // Another process may have won the race to create it: read what is there.
                Self::load_file(&file)
            }
            Err(source) => Err(SecretError::KeyFile { path: file, source }),
        }
    }

    fn load_file(file: &Path) -> Result<Self, SecretError> {
        let text =
            std::fs::read_to_string(file).map_err(|source| SecretError::KeyFile { path: file.to_owned(), source })?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|source| SecretError::NotBase64 { what: file.display().to_string(), source })?;
        Self::from_key(&key)
    }

    /// 32 bytes derived from this key for the purpose `label` (SHA-256 of a root derived from
    /// the key and the label): keys that follow the secret key without being it, such as the
    /// control plane's Ed25519 job-signing key (`label` `runner-signing`, docs/runner.md).
    pub fn derive_seed(&self, label: &str) -> [u8; 32] {
        use sha2::Digest;
        sha2::Sha256::new().chain_update(self.derive_root).chain_update(label.as_bytes()).finalize().into()
    }

    /// The id of this box's key.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Seals `plaintext` bound to `aad`.
    pub fn seal(&self, plaintext: &str, aad: &str) -> Result<String, SecretError> {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rng().fill(&mut nonce);
        let sealed = self
            .cipher
            .encrypt(&XNonce::from(nonce), Payload { msg: plaintext.as_bytes(), aad: aad.as_bytes() })
            .map_err(|_| SecretError::Seal)?;
        let mut out = Vec::with_capacity(NONCE_BYTES + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(base64::engine::general_purpose::STANDARD.encode(out))
    }

    /// Opens a value sealed by [`SecretBox::seal`] under key `key_id` with `aad`.
    pub fn open(&self, sealed: &str, key_id: &str, aad: &str) -> Result<String, SecretError> {
        if key_id != self.key_id {
            return Err(SecretError::OtherKey { sealed_with: key_id.to_owned(), held: self.key_id.clone() });
        }
        let corrupt = || SecretError::Corrupt;
        let raw = base64::engine::general_purpose::STANDARD.decode(sealed).map_err(|_| corrupt())?;
        if raw.len() <= NONCE_BYTES {
            return Err(corrupt());
        }
        let (nonce, body) = raw.split_at(NONCE_BYTES);
        let nonce: [u8; NONCE_BYTES] = nonce.try_into().map_err(|_| corrupt())?;
        let plain = self
            .cipher
            .decrypt(&XNonce::from(nonce), Payload { msg: body, aad: aad.as_bytes() })
            .map_err(|_| corrupt())?;
        String::from_utf8(plain).map_err(|_| corrupt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_aad() {
        let b = SecretBox::from_key(&[7u8; 32]).unwrap_or_else(|e| panic!("{e}"));
        let sealed = b.seal("hunter2", "mcp_a").unwrap_or_else(|e| panic!("{e}"));
        assert!(!sealed.contains("hunter2"));
        assert_eq!(b.open(&sealed, b.key_id(), "mcp_a").ok().as_deref(), Some("hunter2"));
        assert!(matches!(b.open(&sealed, b.key_id(), "mcp_b"), Err(SecretError::Corrupt)));
        assert!(matches!(b.open(&sealed, "0000", "mcp_a"), Err(SecretError::OtherKey { .. })));
        assert!(matches!(SecretBox::from_key(&[1u8; 16]), Err(SecretError::KeyLength(16))));
    }
}
