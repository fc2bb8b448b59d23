//! Bearer tokens: 32 random bytes, shown once, stored only as their SHA-256.

use base64::Engine;
use rand::RngExt;

use crate::evidence::sha256_hex;

/// A new token: `mira_` + 43 characters of URL-safe base64 (256 random bits).
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill(&mut bytes);
    format!("mira_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The stored form of a token.
pub fn hash_token(token: &str) -> String {
    sha256_hex(token.as_bytes())
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_are_unique_and_hashed() {
        let a = super::new_token();
        assert_ne!(a, super::new_token());
        assert_eq!(a.len(), 48);
        assert_eq!(super::hash_token(&a).len(), 64);
    }
}
