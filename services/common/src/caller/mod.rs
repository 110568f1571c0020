//! The signed caller context: minted by auth, verified by every service.
//!
//! Auth signs the protobuf encoding of a [`CallerContext`] with ed25519; the
//! gateway forwards it untouched in metadata `x-kg-caller-bin`; each service's
//! [`CallerContextLayer`] verifies signature and expiry before the request
//! reaches a handler, which reads it back with [`require_caller`]. A handler
//! that forgets the layer still fails closed: there is nothing to read.

mod error;
mod layer;

use std::sync::Arc;

use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use kg_proto::v1::{AccessFilter, CallerContext, SignedCallerContext};
use prost::Message as _;
use tonic::metadata::MetadataValue;

pub use error::CallerError;
pub use layer::{CallerContextLayer, CallerContextService};

/// gRPC metadata key (binary) that carries the [`SignedCallerContext`].
pub const CALLER_METADATA_KEY: &str = "x-kg-caller-bin";

/// How long a minted context stays valid. Short: the gateway mints one per call.
pub const CONTEXT_TTL_MS: i64 = 60_000;

/// Tolerated clock skew between the minting and the verifying process.
const CLOCK_SKEW_MS: i64 = 5_000;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The private half: only the auth service holds one.
pub struct ContextSigner {
    key: SigningKey,
    key_id: String,
}

impl ContextSigner {
    /// A signer from 32 secret-key bytes.
    pub fn from_secret_bytes(secret: &[u8; 32]) -> Self {
        let key = SigningKey::from_bytes(secret);
        let key_id = key_id_of(&key.verifying_key());
        Self { key, key_id }
    }

    /// A fresh random key (tests, first start of a data dir).
    pub fn generate() -> Self {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let key_id = key_id_of(&key.verifying_key());
        Self { key, key_id }
    }

    /// The secret bytes, for persisting a generated key.
    pub fn secret_bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// The public half, as a verifier would be configured with it.
    pub fn public_key(&self) -> PublicKey {
        PublicKey {
            key_id: self.key_id.clone(),
            key: self.key.verifying_key(),
        }
    }

    /// Signs a context as it is.
    pub fn sign(&self, context: &CallerContext) -> SignedCallerContext {
        let bytes = context.encode_to_vec();
        let signature = self.key.sign(&bytes);
        SignedCallerContext {
            context: bytes,
            signature: signature.to_bytes().to_vec(),
            key_id: self.key_id.clone(),
        }
    }
}

/// A verifying key with its id.
#[derive(Clone, Debug)]
pub struct PublicKey {
    key_id: String,
    key: VerifyingKey,
}

impl PublicKey {
    /// The id services use to pick the key (first 16 hex of SHA-512/ed25519 key bytes).
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Raw 32 public-key bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// From raw 32 public-key bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CallerError> {
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| CallerError::BadKey)?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|_| CallerError::BadKey)?;
        Ok(Self {
            key_id: key_id_of(&key),
            key,
        })
    }

    /// The config form: base64 of the 32 key bytes.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.key.to_bytes())
    }

    /// Parses the config form.
    pub fn from_base64(text: &str) -> Result<Self, CallerError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| CallerError::BadKey)?;
        Self::from_bytes(&bytes)
    }
}

fn key_id_of(key: &VerifyingKey) -> String {
    hex::encode(&key.to_bytes()[..8])
}

/// Verifies signed contexts; every service holds one. Several keys allow rotation.
#[derive(Clone, Debug)]
pub struct ContextVerifier {
    keys: Arc<Vec<PublicKey>>,
}

impl ContextVerifier {
    /// A verifier trusting these keys.
    pub fn new(keys: Vec<PublicKey>) -> Self {
        Self {
            keys: Arc::new(keys),
        }
    }

    /// Checks signature, then expiry, and only then decodes the context.
    pub fn verify(
        &self,
        signed: &SignedCallerContext,
        now_ms: i64,
    ) -> Result<CallerContext, CallerError> {
        let key = self
            .keys
            .iter()
            .find(|k| k.key_id == signed.key_id)
            .ok_or(CallerError::UnknownKey)?;
        let signature =
            Signature::from_slice(&signed.signature).map_err(|_| CallerError::BadSignature)?;
        key.key
            .verify_strict(&signed.context, &signature)
            .map_err(|_| CallerError::BadSignature)?;
        let context =
            CallerContext::decode(signed.context.as_slice()).map_err(|_| CallerError::Malformed)?;
        if context.expires_at_ms + CLOCK_SKEW_MS < now_ms {
            return Err(CallerError::Expired);
        }
        if context.issued_at_ms > now_ms + CLOCK_SKEW_MS {
            return Err(CallerError::Expired);
        }
        Ok(context)
    }
}

/// The verified context a handler works with, put in request extensions by the layer.
#[derive(Clone, Debug)]
pub struct VerifiedCaller(pub Arc<CallerContext>);

/// The verified caller of a gRPC request, or `UNAUTHENTICATED`.
pub fn require_caller<T>(request: &tonic::Request<T>) -> Result<Arc<CallerContext>, tonic::Status> {
    request
        .extensions()
        .get::<VerifiedCaller>()
        .map(|c| c.0.clone())
        .ok_or_else(|| crate::error::to_status(&CallerError::Missing))
}

/// The access filter of `namespace` for this caller, or `PERMISSION_DENIED` naming it.
pub fn access_for<'a>(
    context: &'a CallerContext,
    namespace: &str,
) -> Result<&'a AccessFilter, CallerError> {
    context
        .access
        .iter()
        .find(|a| a.namespace == namespace)
        .ok_or_else(|| CallerError::NamespaceDenied(namespace.to_owned()))
}

/// The `tool` of contexts the gateway mints for its admin API (REST `/api/v1`); the kgmesh
/// CLI's own calls use `admin:<operation>`.
pub const ADMIN_API_TOOL: &str = "admin";

/// The `tool` of contexts the gateway mints for MCP calls, over HTTP and stdio alike.
pub const MCP_TOOL: &str = "mcp";

/// Whether the context was minted for the admin API (see [`ADMIN_API_TOOL`]).
pub fn minted_for_admin_api(context: &CallerContext) -> bool {
    context.tool == ADMIN_API_TOOL
        || context
            .tool
            .strip_prefix(ADMIN_API_TOOL)
            .is_some_and(|rest| rest.starts_with(':'))
}

/// Requires a context minted for the admin API. Every call a service receives carries the
/// caller's context on to the next hop, so a context an MCP call carries is seen by every
/// service that call reaches: bound to reading (and proposing), it is worth nothing to one
/// that would replay it to write, grant or mint.
pub fn require_admin_api(context: &CallerContext) -> Result<(), CallerError> {
    if minted_for_admin_api(context) {
        Ok(())
    } else {
        Err(CallerError::NotAdminApi(context.tool.clone()))
    }
}

/// Requires the admin flag, in a context minted for the admin API.
pub fn require_admin(context: &CallerContext) -> Result<(), CallerError> {
    if !context.is_admin {
        return Err(CallerError::NotAdmin);
    }
    require_admin_api(context)
}

/// Requires `role` to be one of the context's roles (granted over HTTP, asserted by a
/// stdio launcher): a role named in a request body is never trusted by itself.
pub fn require_role(context: &CallerContext, role: &str) -> Result<(), CallerError> {
    if !role.is_empty() && context.roles.iter().any(|held| held == role) {
        Ok(())
    } else {
        Err(CallerError::RoleNotHeld {
            // From a request body: what the message repeats of it is made safe to show.
            role: crate::sanitize::sanitize_text(role, 80),
            held: context.roles.clone(),
        })
    }
}

/// Longest role name a context carries.
pub const MAX_ROLE_NAME: usize = 64;

/// Whether `role` is a role name: a lowercase letter, then lowercase letters, digits and
/// `_`, at most [`MAX_ROLE_NAME`] characters (the names an ontology project declares).
fn is_role_name(role: &str) -> bool {
    let mut chars = role.chars();
    role.len() <= MAX_ROLE_NAME
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// `Ok` for a role name (see [`is_role_name`]), else what to change, naming the role
/// (sanitised: it may come from anywhere).
pub fn check_role_name(role: &str) -> Result<(), String> {
    if is_role_name(role) {
        return Ok(());
    }
    Err(format!(
        "`{}` is not a role name: use a lowercase letter, then lowercase letters, digits or _, at most {MAX_ROLE_NAME} characters",
        crate::sanitize::sanitize_text(role, 80)
    ))
}

/// Attaches a signed context to an outgoing gRPC request.
pub fn attach_caller<T>(request: &mut tonic::Request<T>, signed: &SignedCallerContext) {
    let value = MetadataValue::from_bytes(&signed.encode_to_vec());
    request
        .metadata_mut()
        .insert_bin(CALLER_METADATA_KEY, value);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::error::{ErrorCode, ErrorExt as _};

    fn context(expires_in: i64) -> CallerContext {
        let now = now_ms();
        CallerContext {
            principal_id: "p1".into(),
            issued_at_ms: now,
            expires_at_ms: now + expires_in,
            access: vec![AccessFilter {
                namespace: "demo".into(),
                allow_prefixes: vec![String::new()],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn signed_context_verifies() {
        let signer = ContextSigner::generate();
        let verifier = ContextVerifier::new(vec![signer.public_key()]);
        let signed = signer.sign(&context(CONTEXT_TTL_MS));
        let ctx = verifier.verify(&signed, now_ms()).unwrap();
        assert_eq!(ctx.principal_id, "p1");
        assert!(access_for(&ctx, "demo").is_ok());
        assert!(matches!(
            access_for(&ctx, "other"),
            Err(CallerError::NamespaceDenied(_))
        ));
    }

    #[test]
    fn tampered_expired_and_foreign_contexts_are_refused() {
        let signer = ContextSigner::generate();
        let verifier = ContextVerifier::new(vec![signer.public_key()]);

        let mut tampered = signer.sign(&context(CONTEXT_TTL_MS));
        let mut ctx = CallerContext::decode(tampered.context.as_slice()).unwrap();
        ctx.is_admin = true;
        tampered.context = ctx.encode_to_vec();
        assert!(matches!(
            verifier.verify(&tampered, now_ms()),
            Err(CallerError::BadSignature)
        ));

        let expired = signer.sign(&context(-60_000));
        assert!(matches!(
            verifier.verify(&expired, now_ms()),
            Err(CallerError::Expired)
        ));

        let other = ContextSigner::generate();
        let foreign = other.sign(&context(CONTEXT_TTL_MS));
        assert!(matches!(
            verifier.verify(&foreign, now_ms()),
            Err(CallerError::UnknownKey)
        ));

        // Same key id, other key: a forged signature.
        let mut forged = other.sign(&context(CONTEXT_TTL_MS));
        forged.key_id = signer.public_key().key_id().to_owned();
        assert!(matches!(
            verifier.verify(&forged, now_ms()),
            Err(CallerError::BadSignature)
        ));
    }

    #[test]
    fn admin_operations_take_only_a_context_minted_for_the_admin_api() {
        let mut caller = context(CONTEXT_TTL_MS);
        caller.is_admin = true;
        for tool in [ADMIN_API_TOOL, "admin:ontology"] {
            caller.tool = tool.into();
            assert!(require_admin(&caller).is_ok(), "{tool}");
            assert!(require_admin_api(&caller).is_ok(), "{tool}");
        }
        for tool in [MCP_TOOL, "kg_search", "administer", "admin_x", ""] {
            caller.tool = tool.into();
            let err = require_admin(&caller).unwrap_err();
            assert!(matches!(err, CallerError::NotAdminApi(_)), "{tool}: {err}");
            assert_eq!(err.code(), ErrorCode::PermissionDenied);
            assert!(require_admin_api(&caller).is_err(), "{tool}");
        }
        caller.is_admin = false;
        caller.tool = ADMIN_API_TOOL.into();
        assert!(matches!(require_admin(&caller), Err(CallerError::NotAdmin)));
        assert!(
            require_admin_api(&caller).is_ok(),
            "a writer need not be an admin"
        );
    }

    #[test]
    fn a_role_counts_only_when_the_context_carries_it() {
        let mut caller = context(CONTEXT_TTL_MS);
        caller.roles = vec!["support".into()];
        assert!(require_role(&caller, "support").is_ok());
        for role in ["billing", "", "Support"] {
            let err = require_role(&caller, role).unwrap_err();
            assert!(matches!(err, CallerError::RoleNotHeld { .. }), "{role}");
            assert_eq!(err.code(), ErrorCode::PermissionDenied);
        }
        let message = require_role(&caller, "billing").unwrap_err().to_string();
        assert!(message.contains(r#"its roles: ["support"]"#), "{message}");
        let message = require_role(&caller, "bill\u{1b}[31ming")
            .unwrap_err()
            .to_string();
        assert!(!message.contains('\u{1b}'), "{message}");

        assert!(is_role_name("support") && is_role_name("tier_2"));
        for bad in [
            "",
            "Support",
            "2nd",
            "a-b",
            "a b",
            &"r".repeat(MAX_ROLE_NAME + 1),
        ] {
            assert!(!is_role_name(bad), "{bad}");
        }
    }

    #[test]
    fn public_key_round_trips_base64() {
        let signer = ContextSigner::generate();
        let key = PublicKey::from_base64(&signer.public_key().to_base64()).unwrap();
        assert_eq!(key.key_id(), signer.public_key().key_id());
        assert!(PublicKey::from_base64("not base64!").is_err());
    }
}
