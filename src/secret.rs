//! Secrets at rest — External MCP headers and env, search provider keys — sealed with
//! XChaCha20-Poly1305 (RFC 8439 ChaCha20-Poly1305 with the 192-bit extended nonce of
//! draft-irtf-cfrg-xchacha) under a 256-bit key.
//!
//! A sealed value is standard base64 of `nonce (24 random bytes) || ciphertext || tag`, with
//! the owning row's id as associated data, so a ciphertext copied onto another row does not
//! open. The key is `MIRA_SECRET_KEY` (32 bytes, base64) or `<data-dir>/secret.key` (created
//! on first use, mode 0600); its id (first 16 hex digits of its SHA-256) is stored beside
//! every ciphertext.

use std::path::Path;

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

/// Seals and opens secret values with one key.
pub struct SecretBox {
    cipher: XChaCha20Poly1305,
    key_id: String,
}

impl std::fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretBox").field("key_id", &self.key_id).finish_non_exhaustive()
    }
}

impl SecretBox {
    /// A box over a raw 32-byte key.
    pub fn from_key(key: &[u8]) -> Result<Self, String> {
        let cipher = XChaCha20Poly1305::new_from_slice(key)
            .map_err(|_| format!("a secret key has {KEY_BYTES} bytes, not {}", key.len()))?;
        Ok(Self { cipher, key_id: crate::evidence::sha256_hex(key)[..16].to_owned() })
    }

    /// The key from `MIRA_SECRET_KEY` when set, else from `<data_dir>/secret.key`, created
    /// (mode 0600, 32 random bytes in base64) when missing.
    pub fn load(data_dir: &Path) -> Result<Self, String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        if let Ok(text) = std::env::var("MIRA_SECRET_KEY") {
            let key = b64.decode(text.trim()).map_err(|e| format!("MIRA_SECRET_KEY is not base64: {e}"))?;
            return Self::from_key(&key);
        }
        let file = data_dir.join(KEY_FILE);
        match std::fs::read_to_string(&file) {
            Ok(text) => {
                let key = b64.decode(text.trim()).map_err(|e| format!("{} is not base64: {e}", file.display()))?;
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
                        .map_err(|e| format!("{}: {e}", file.display()))?,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("{}: {e}", file.display())),
                }
                // Another process may have won the race to create it: read what is there.
                Self::load_file(&file)
            }
            Err(e) => Err(format!("{}: {e}", file.display())),
        }
    }

    fn load_file(file: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| format!("{} is not base64: {e}", file.display()))?;
        Self::from_key(&key)
    }

    /// The id of this box's key.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Seals `plaintext` bound to `aad`.
    pub fn seal(&self, plaintext: &str, aad: &str) -> Result<String, String> {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rng().fill(&mut nonce);
        let sealed = self
            .cipher
            .encrypt(&XNonce::from(nonce), Payload { msg: plaintext.as_bytes(), aad: aad.as_bytes() })
            .map_err(|_| "sealing failed".to_owned())?;
        let mut out = Vec::with_capacity(NONCE_BYTES + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(base64::engine::general_purpose::STANDARD.encode(out))
    }

    /// Opens a value sealed by [`SecretBox::seal`] under key `key_id` with `aad`.
    pub fn open(&self, sealed: &str, key_id: &str, aad: &str) -> Result<String, String> {
        if key_id != self.key_id {
            return Err(format!(
                "the secrets were sealed with key {key_id}, but this server holds key {}",
                self.key_id
            ));
        }
        let corrupt = || "the stored secrets do not decrypt (corrupt, or bound to another server)".to_owned();
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
        assert_eq!(b.open(&sealed, b.key_id(), "mcp_a").as_deref(), Ok("hunter2"));
        assert!(b.open(&sealed, b.key_id(), "mcp_b").is_err());
        assert!(b.open(&sealed, "0000", "mcp_a").is_err());
    }
}
