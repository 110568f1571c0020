//! Integration tests of the graph service on real FalkorDB and qdrant-edge: one test binary per crate, so a
//! build links it once instead of once per file (disk and link time on 2 cores).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cypher_table;
mod graph_service;
mod navigation;
mod similar;
