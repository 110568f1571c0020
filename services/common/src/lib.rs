//! kg-common: what every kgmesh binary shares and nothing store-specific.
//!
//! It owns the stable error codes and their one mapping to gRPC, the signed
//! caller context (signing, verification, the tower layer every service runs),
//! access-filter compilation into store predicates, the gRPC server stack and
//! client channels (balanced, with mutual TLS between services when configured),
//! configuration loading, telemetry (with credentials masked in every log
//! line), metrics and untrusted-text sanitising.
//! It never talks to a store.

pub mod access;
pub mod balance;
pub mod caller;
pub mod config;
pub mod error;
pub mod grpc;
pub mod metrics;
pub mod readiness;
pub mod redact;
pub mod sanitize;
pub mod tbox_patterns;
pub mod telemetry;
pub mod tls;
pub mod tool_names;

pub use error::{ErrorCode, ErrorExt};
