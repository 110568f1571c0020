//! Hashes and the webhook signature.
//!
//! Every effect request carries `X-Kgmesh-Signature: t=<unix seconds>,v1=<hex>`
//! where `v1` is HMAC-SHA256, keyed with the deployment's webhook signing
//! secret (its UTF-8 bytes), over `"<t>." + <raw request body>`. A receiver
//! verifies it with [`verify`] or the same three steps in any language:
//! 1. split the header on `,` into `t=` and `v1=`;
//! 2. compute `hex(HMAC_SHA256(secret, t + "." + body))` and compare it with
//!    `v1` in constant time;
//! 3. reject timestamps more than a few minutes away from its own clock (replays).
//!
//! Retries resend the same body with a fresh `t`; deduplicate on `Idempotency-Key`.

use hmac::{Hmac, Mac as _};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// Header carrying the signature.
pub const SIGNATURE_HEADER: &str = "x-kgmesh-signature";
/// Header carrying the idempotency key (stable across retries of one proposal).
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
/// Header carrying the proposal id, for the receiver's logs.
pub const PROPOSAL_HEADER: &str = "x-kgmesh-proposal";

/// Why a signature did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The header is not `t=<unix>,v1=<hex>`.
    #[error("malformed signature header")]
    Malformed,
    /// The timestamp is outside the tolerance.
    #[error("signature timestamp outside the tolerance")]
    Stale,
    /// The MAC does not match.
    #[error("signature does not match")]
    Mismatch,
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The canonical form of a JSON value: object keys sorted, no whitespace.
pub fn canonical_json(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    if let Some(v) = map.get(key) {
                        write(v, out);
                    }
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// The idempotency key of a proposal: the same for every attempt of its effect.
pub fn idempotency_key(proposal_id: &str, arguments_sha256: &str) -> String {
    sha256_hex(format!("{proposal_id}:{arguments_sha256}").as_bytes())
}

fn mac_hex(secret: &[u8], timestamp: i64, body: &[u8]) -> Option<String> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).ok()?;
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(body);
    Some(hex::encode(mac.finalize().into_bytes()))
}

/// The `X-Kgmesh-Signature` value for `body` at `timestamp` (Unix seconds).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    // HMAC accepts keys of any length, so the fallback never happens.
    let mac = mac_hex(secret, timestamp, body).unwrap_or_default();
    format!("t={timestamp},v1={mac}")
}

/// Verifies a signature header against `body`, allowing `tolerance_secs` of
/// clock difference between sender and receiver.
pub fn verify(
    secret: &[u8],
    header: &str,
    body: &[u8],
    now_unix: i64,
    tolerance_secs: i64,
) -> Result<(), SignatureError> {
    let mut timestamp = None;
    let mut given = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", v)) => given = hex::decode(v).ok(),
            _ => {}
        }
    }
    let (Some(timestamp), Some(given)) = (timestamp, given) else {
        return Err(SignatureError::Malformed);
    };
    if (now_unix - timestamp).abs() > tolerance_secs {
        return Err(SignatureError::Stale);
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| SignatureError::Mismatch)?;
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(body);
    // verify_slice compares in constant time.
    mac.verify_slice(&given)
        .map_err(|_| SignatureError::Mismatch)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_ignores_key_order_and_whitespace() {
        let a: Value =
            serde_json::from_str(r#"{"b": 1, "a": {"y": [1, {"d":2,"c":3}], "x": "é\n"}}"#)
                .unwrap();
        let b = json!({"a": {"x": "é\n", "y": [1, {"c": 3, "d": 2}]}, "b": 1});
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(
            canonical_json(&b),
            r#"{"a":{"x":"é\n","y":[1,{"c":3,"d":2}]},"b":1}"#
        );
        assert_ne!(
            sha256_hex(canonical_json(&json!({"a": 1})).as_bytes()),
            sha256_hex(canonical_json(&json!({"a": 2})).as_bytes())
        );
    }

    #[test]
    fn signatures_verify_and_reject_tampering() {
        let secret = b"whsec_test";
        let header = sign(secret, 1_700_000_000, b"{\"a\":1}");
        assert!(header.starts_with("t=1700000000,v1="));
        assert_eq!(
            verify(secret, &header, b"{\"a\":1}", 1_700_000_010, 300),
            Ok(())
        );
        assert_eq!(
            verify(secret, &header, b"{\"a\":2}", 1_700_000_010, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"other", &header, b"{\"a\":1}", 1_700_000_010, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(secret, &header, b"{\"a\":1}", 1_700_009_000, 300),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify(secret, "v1=00", b"", 0, 300),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn idempotency_keys_differ_per_proposal() {
        assert_eq!(idempotency_key("p1", "h"), idempotency_key("p1", "h"));
        assert_ne!(idempotency_key("p1", "h"), idempotency_key("p2", "h"));
    }
}
