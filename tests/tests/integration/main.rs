//! Integration tests of the services together over gRPC: one test binary per crate, so a
//! build links it once instead of once per file (disk and link time on 2 cores).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod access_compiler;
mod auth_sql_backends;
mod grpc_fail_closed;
mod indexer_restart;
