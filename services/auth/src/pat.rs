//! Personal access tokens: `kg_pat_` + 32 random bytes (base64url), stored only
//! as an HMAC-SHA256 under a server-side key. High-entropy tokens need no slow
//! hash; the keyed hash means a leaked table alone cannot confirm a token.

use base64::Engine as _;
use hmac::{Hmac, Mac as _};
use rand::RngCore as _;
use sha2::Sha256;

/// Every kgmesh PAT starts with this.
pub const PAT_PREFIX: &str = "kg_pat_";
/// Characters of a token kept for display (prefix included).
const DISPLAY_PREFIX_LEN: usize = PAT_PREFIX.len() + 6;
/// Random bytes per token.
const SECRET_BYTES: usize = 32;

/// Key for hashing tokens; per deployment, never stored in SQL.
#[derive(Clone)]
pub struct PatHasher {
    key: Vec<u8>,
}

impl PatHasher {
    /// A hasher with this secret key (at least 32 bytes recommended).
    pub fn new(key: Vec<u8>) -> Self {
        Self { key }
    }

    /// Hex HMAC of the token, the only form that is stored.
    pub fn hash(&self, token: &str) -> String {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut mac = match <Hmac<Sha256>>::new_from_slice(&self.key) {
            Ok(mac) => mac,
            Err(_) => return String::new(),
        };
        mac.update(token.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

/// A fresh token and its display prefix.
pub fn generate() -> (String, String) {
    let mut secret = [0u8; SECRET_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let token = format!(
        "{PAT_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    );
    let prefix = token[..DISPLAY_PREFIX_LEN].to_owned();
    (token, prefix)
}

/// Whether `token` has the shape of a kgmesh PAT (cheap check before any lookup).
pub fn looks_valid(token: &str) -> bool {
    let Some(secret) = token.strip_prefix(PAT_PREFIX) else {
        return false;
    };
    secret.len() == 43
        && secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_well_formed_and_hashed_with_the_key() {
        let (a, prefix) = generate();
        let (b, _) = generate();
        assert_ne!(a, b);
        assert!(looks_valid(&a));
        assert!(a.starts_with(&prefix));
        assert!(!looks_valid("kg_pat_short"));
        assert!(!looks_valid(&a.replace("kg_pat_", "xx_pat_")));
        let h1 = PatHasher::new(b"one key of thirty-two bytes long".to_vec());
        let h2 = PatHasher::new(b"another key of thirty-two bytes!".to_vec());
        assert_eq!(h1.hash(&a), h1.hash(&a));
        assert_ne!(h1.hash(&a), h2.hash(&a));
        assert_eq!(h1.hash(&a).len(), 64);
    }
}
