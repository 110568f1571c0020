//! The gRPC contracts of kgmesh: every service's messages and client/server
//! stubs, generated from `proto/kg/v1/*.proto` at build time, and the few limits
//! both ends of a call must agree on. Owns no logic.

/// Version 1 of the kgmesh contracts (`package kg.v1`).
pub mod v1 {
    #![allow(clippy::all, missing_docs, unreachable_pub)]
    tonic::include_proto!("kg.v1");
    include!(concat!(env!("OUT_DIR"), "/kg_v1_methods.rs"));
}

/// Limits of the v1 calls that a caller must respect to be served at all.
pub mod limits {
    /// Most chunk keys one `Graph.Packages` call may name (the top-k hard maximum); a
    /// caller with more keys splits them over several calls.
    pub const PACKAGE_KEYS_PER_CALL: usize = 32;
    /// Longest chunk key, entity key or file id a service accepts in a request, in bytes.
    /// The indexer makes every entity key it writes fit (a long name is cut and hashed).
    pub const MAX_KEY_BYTES: usize = 256;
    /// Most namespaces one audit event lists; it counts the rest in `more_namespaces`.
    pub const AUDIT_NAMESPACES: usize = 64;
    /// Most characters of an audit event's `target` (the path an admin API change was made on).
    pub const AUDIT_TARGET_LEN: usize = 2048;
    /// Least and most milliseconds one attempt of a webhook effect may wait: the ontology
    /// refuses an effect outside them and the approval service runs within them.
    pub const EFFECT_TIMEOUT_MS: (u32, u32) = (100, 60_000);
    /// Most attempts of one webhook effect.
    pub const EFFECT_MAX_ATTEMPTS: u32 = 10;
    /// Largest arguments of one proposal, as compact JSON, in bytes.
    pub const PROPOSAL_ARGUMENTS_BYTES: usize = 64 * 1024;
}
