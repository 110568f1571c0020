//! Personal access tokens: `kg_pat_` + base64url(6-byte deployment tag || 32
//! random bytes), stored only as an HMAC-SHA256 under a server-side key.
//! High-entropy tokens need no slow hash; the keyed hash means a leaked table
//! alone cannot confirm a token. The tag (first 6 bytes of sha256 of the
//! deployment id) lets a deployment refuse another one's tokens before any
//! lookup; it is not secret and proves nothing on its own.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac as _};
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};

/// Every kgmesh PAT starts with this.
pub const PAT_PREFIX: &str = "kg_pat_";
/// Bytes of the deployment tag at the start of the token body.
const TAG_BYTES: usize = 6;
/// Random bytes per token.
const SECRET_BYTES: usize = 32;
/// Characters of the encoded body: base64 of 38 bytes without padding.
const BODY_CHARS: usize = ((TAG_BYTES + SECRET_BYTES) * 4).div_ceil(3);
/// Characters of the encoded tag (6 bytes encode to exactly 8 characters, so
/// the random part starts on a character boundary).
const TAG_CHARS: usize = TAG_BYTES / 3 * 4;
/// Characters of a token kept for display: prefix, tag, and 6 characters of
/// the random part so tokens of one deployment can be told apart.
const DISPLAY_PREFIX_LEN: usize = PAT_PREFIX.len() + TAG_CHARS + 6;

/// Which deployment minted a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeploymentTag([u8; TAG_BYTES]);

impl DeploymentTag {
    /// The tag of a deployment: the first 6 bytes of sha256(deployment_id).
    pub(crate) fn of(deployment_id: &str) -> Self {
        let digest = Sha256::digest(deployment_id.as_bytes());
        let mut tag = [0u8; TAG_BYTES];
        tag.copy_from_slice(&digest[..TAG_BYTES]);
        Self(tag)
    }
}

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

/// A fresh token of deployment `tag`, and its display prefix.
pub(crate) fn generate(tag: DeploymentTag) -> (String, String) {
    let mut body = [0u8; TAG_BYTES + SECRET_BYTES];
    body[..TAG_BYTES].copy_from_slice(&tag.0);
    rand::rngs::OsRng.fill_bytes(&mut body[TAG_BYTES..]);
    let token = format!("{PAT_PREFIX}{}", URL_SAFE_NO_PAD.encode(body));
    let prefix = token[..DISPLAY_PREFIX_LEN].to_owned();
    (token, prefix)
}

/// The deployment tag of a well-formed token; `None` for anything that does
/// not have the exact shape (prefix, 51 canonical base64url characters).
pub(crate) fn parse(token: &str) -> Option<DeploymentTag> {
    let body = token.strip_prefix(PAT_PREFIX)?;
    if body.len() != BODY_CHARS
        || !body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return None;
    }
    // The engine refuses non-zero trailing bits, so each token has one spelling.
    let bytes = URL_SAFE_NO_PAD.decode(body).ok()?;
    let tag: [u8; TAG_BYTES] = bytes.get(..TAG_BYTES)?.try_into().ok()?;
    Some(DeploymentTag(tag))
}

/// Whether `token` has the shape of a kgmesh PAT (cheap check before any lookup).
pub fn looks_valid(token: &str) -> bool {
    parse(token).is_some()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_well_formed_and_hashed_with_the_key() {
        let tag = DeploymentTag::of("dep-1");
        let (a, prefix) = generate(tag);
        let (b, prefix_b) = generate(tag);
        assert_ne!(a, b);
        assert_ne!(
            prefix, prefix_b,
            "display prefixes include random characters"
        );
        assert_eq!(a.len(), PAT_PREFIX.len() + 51);
        assert!(looks_valid(&a));
        assert!(a.starts_with(&prefix));
        assert!(!looks_valid("kg_pat_short"));
        assert!(!looks_valid(&a.replace("kg_pat_", "xx_pat_")));
        assert!(!looks_valid(&format!("{a}A")));
        assert!(!looks_valid(&a[..a.len() - 1]));
        let h1 = PatHasher::new(b"one key of thirty-two bytes long".to_vec());
        let h2 = PatHasher::new(b"another key of thirty-two bytes!".to_vec());
        assert_eq!(h1.hash(&a), h1.hash(&a));
        assert_ne!(h1.hash(&a), h2.hash(&a));
        assert_eq!(h1.hash(&a).len(), 64);
    }

    #[test]
    fn tokens_carry_their_deployment() {
        let one = DeploymentTag::of("dep-1");
        let two = DeploymentTag::of("dep-2");
        assert_ne!(one, two);
        let (a, _) = generate(one);
        let (b, _) = generate(two);
        assert_eq!(parse(&a), Some(one));
        assert_eq!(parse(&b), Some(two));
        // All tokens of a deployment share the encoded tag.
        let (c, _) = generate(one);
        assert_eq!(
            a[..PAT_PREFIX.len() + TAG_CHARS],
            c[..PAT_PREFIX.len() + TAG_CHARS]
        );
    }

    #[test]
    fn old_format_and_non_canonical_tokens_are_refused() {
        // The pre-tag format: 32 bytes, 43 characters.
        assert!(!looks_valid(&format!("{PAT_PREFIX}{}", "A".repeat(43))));
        // 51 characters whose last one carries non-zero trailing bits.
        let (token, _) = generate(DeploymentTag::of("dep-1"));
        let mut chars: Vec<char> = token.chars().collect();
        let last = chars.len() - 1;
        // 38 bytes leave 2 unused low bits in the final character, zero in a
        // canonical token; 'B' (value 1) sets one of them.
        chars[last] = 'B';
        let mangled: String = chars.into_iter().collect();
        assert!(!looks_valid(&mangled));
        assert!(!looks_valid(&format!("{PAT_PREFIX}{}", "=".repeat(51))));
    }
}
