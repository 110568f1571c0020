//! Integration tests of the store clients on real FalkorDB, qdrant-edge and servers: one test binary per crate, so a
//! build links it once instead of once per file (disk and link time on 2 cores).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod servers;
mod similar_files;
mod tbox;
mod vector;
