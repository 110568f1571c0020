//! The crate's error type and the tool-level error codes of generated tools.

use kg_common::error::{ErrorCode, ErrorExt};

/// Errors of the ontology service (gRPC level: the tool-level outcomes of
/// generated tools travel in the result JSON, see [`ToolError`]).
#[derive(Debug, thiserror::Error)]
pub enum OntologyError {
    /// The project file is unreadable or malformed.
    #[error("{0}")]
    Project(String),
    /// Validation found problems; each says what to change.
    #[error("the project has {} problem(s):\n  - {}", .0.len(), .0.join("\n  - "))]
    Invalid(Vec<String>),
    /// A TBox draft has problems; each says what to change.
    #[error("the TBox draft has {} problem(s):\n  - {}", .0.len(), .0.join("\n  - "))]
    InvalidTbox(Vec<String>),
    /// No project is loaded.
    #[error("no ontology project is loaded: start the service with a project directory")]
    NoProject,
    /// A request field is wrong.
    #[error("{0}")]
    BadRequest(String),
    /// Something named does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The state does not allow the call.
    #[error("{0}")]
    Conflict(String),
    /// Admin rights needed.
    #[error("{0}")]
    Denied(String),
    /// A store this call needs is down or did not answer; the message is ours, the detail
    /// stays in the log.
    #[error("{0}")]
    Unavailable(String),
    /// Store failure; detail stays in the log.
    #[error("store: {0}")]
    Store(String),
}

/// Result alias.
pub type Result<T, E = OntologyError> = std::result::Result<T, E>;

impl ErrorExt for OntologyError {
    fn code(&self) -> ErrorCode {
        match self {
            OntologyError::Project(_)
            | OntologyError::Invalid(_)
            | OntologyError::InvalidTbox(_)
            | OntologyError::BadRequest(_) => ErrorCode::InvalidArgument,
            OntologyError::NoProject | OntologyError::Conflict(_) => ErrorCode::FailedPrecondition,
            OntologyError::NotFound(_) => ErrorCode::NotFound,
            OntologyError::Denied(_) => ErrorCode::PermissionDenied,
            OntologyError::Unavailable(_) => ErrorCode::Unavailable,
            OntologyError::Store(_) => ErrorCode::Internal,
        }
    }
}

kg_common::impl_status_from!(OntologyError);

impl From<sqlx::Error> for OntologyError {
    fn from(err: sqlx::Error) -> Self {
        OntologyError::Store(err.to_string())
    }
}

impl From<kg_stores::StoreError> for OntologyError {
    fn from(err: kg_stores::StoreError) -> Self {
        match err.code() {
            // Our own words (what was invalid and why), never a driver's.
            ErrorCode::InvalidArgument => OntologyError::BadRequest(err.to_string()),
            ErrorCode::Unavailable | ErrorCode::Timeout => {
                tracing::warn!(error = %kg_common::error::detail(&err), "store unavailable");
                // "event bus is unavailable", "sql store timed out": names no address.
                OntologyError::Unavailable(format!("the {err}; retry shortly"))
            }
            _ => OntologyError::Store(err.to_string()),
        }
    }
}

/// Tool-level codes of generated tools: governance refusals and the separate
/// configuration/transport errors, as the result's `error` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCode {
    /// The asserted role is not in `policy.roles`.
    DeniedRole,
    /// `requires` does not hold.
    PreconditionFailed,
    /// No record with that identity.
    NotFound,
    /// More than one row shares that identity.
    AmbiguousIdentity,
    /// No approval declared and the server did not opt in to auto effects.
    AutoEffectsDisabled,
    /// `approval.when` references a parameter the call did not supply.
    ApprovalUnevaluable,
    /// Arguments do not match the tool's input.
    InvalidArguments,
    /// The effect cannot be rendered.
    EffectMisconfigured,
    /// The object is not in the compiled project.
    UnknownObject,
    /// No such generated tool.
    UnknownTool,
    /// A service this call needs did not answer and nothing was done: retry shortly.
    Unavailable,
    /// A fault on our side; details in the log.
    InternalError,
}

impl ToolCode {
    /// The stable string.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCode::DeniedRole => "denied_role",
            ToolCode::PreconditionFailed => "precondition_failed",
            ToolCode::NotFound => "not_found",
            ToolCode::AmbiguousIdentity => "ambiguous_identity",
            ToolCode::AutoEffectsDisabled => "auto_effects_disabled",
            ToolCode::ApprovalUnevaluable => "approval_unevaluable",
            ToolCode::InvalidArguments => "invalid_arguments",
            ToolCode::EffectMisconfigured => "effect_misconfigured",
            ToolCode::UnknownObject => "unknown_object",
            ToolCode::UnknownTool => "unknown_tool",
            ToolCode::Unavailable => "unavailable",
            ToolCode::InternalError => "internal_error",
        }
    }
}

/// A tool-level error: a stable code and a model-safe message.
#[derive(Debug, Clone)]
pub struct ToolError {
    /// The code.
    pub code: ToolCode,
    /// Safe to show a model; never store text.
    pub message: String,
}

impl ToolError {
    /// A tool error.
    pub fn new(code: ToolCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// An internal error: `detail` goes to the log only.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "generated tool failed");
        Self::new(
            ToolCode::InternalError,
            "internal error; the details are in the server log",
        )
    }

    /// `{"error": code, "message": …}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"error": self.code.as_str(), "message": self.message})
    }
}

impl From<sqlx::Error> for ToolError {
    fn from(err: sqlx::Error) -> Self {
        ToolError::internal(err)
    }
}
