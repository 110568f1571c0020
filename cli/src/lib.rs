//! The `kgmesh` command's library: the in-process mesh composition used by
//! `kgmesh up` and the end-to-end tests, the admin REST client, and ingest.
//! Only this crate and `tests/` depend on the service crates.

#![recursion_limit = "256"]

pub mod approval_child;
pub mod client;
pub mod config;
pub mod ingest;
pub mod mesh;
mod parts;
pub mod percentiles;
pub mod serve;

pub use mesh::{Mesh, MeshInfo, MeshOptions};
