use crate::error::{ErrorCode, ErrorExt};

/// Why a caller context was refused. Messages are safe to show to clients.
#[derive(Debug, thiserror::Error)]
pub enum CallerError {
    /// No context in the request metadata.
    #[error("missing caller context: call through the gateway with a valid token")]
    Missing,
    /// The metadata is not a signed context.
    #[error("malformed caller context")]
    Malformed,
    /// Signed by a key this service does not trust: forged, or auth signs with another key
    /// than the one this service fetched at its start. Refused as unauthenticated either way
    /// (fail closed); the message names the deployment fault an operator can fix.
    #[error(
        "caller context signed by a key this service does not know (if auth's \
         caller-signing.key was replaced, restart every service so each fetches the new one)"
    )]
    UnknownKey,
    /// The signature does not match.
    #[error("caller context signature is invalid")]
    BadSignature,
    /// Past its expiry (or minted in the future).
    #[error("caller context expired")]
    Expired,
    /// A configured key is not a valid ed25519 public key.
    #[error("invalid ed25519 public key: expected base64 of 32 bytes")]
    BadKey,
    /// The caller may not read this namespace.
    #[error("namespace `{0}` is not readable by this caller")]
    NamespaceDenied(String),
    /// An admin-only operation.
    #[error("this operation needs an admin principal")]
    NotAdmin,
    /// An admin-API operation (a write, a grant, anything admin-only) with a context
    /// minted for another purpose, such as an MCP call.
    #[error(
        "this operation belongs to the admin API (REST /api/v1 or the kgmesh CLI) and refuses a context minted for `{0}`: the context of an MCP call may only read and propose, whoever the caller is"
    )]
    NotAdminApi(String),
    /// A role the signed context does not carry.
    #[error(
        "role `{role}` is not one this caller holds (its roles: {held:?}); over HTTP an admin grants a role with the group `role:{role}`, over stdio the launcher asserts it with --role"
    )]
    RoleNotHeld {
        /// The role asked for.
        role: String,
        /// The roles the context carries.
        held: Vec<String>,
    },
}

impl ErrorExt for CallerError {
    fn code(&self) -> ErrorCode {
        match self {
            CallerError::NamespaceDenied(_)
            | CallerError::NotAdmin
            | CallerError::NotAdminApi(_)
            | CallerError::RoleNotHeld { .. } => ErrorCode::PermissionDenied,
            CallerError::BadKey => ErrorCode::InvalidArgument,
            _ => ErrorCode::Unauthenticated,
        }
    }
}

crate::impl_status_from!(CallerError);
