//! Integration tests of retrieval on real FalkorDB and qdrant-edge: one test binary per crate, so a
//! build links it once instead of once per file (disk and link time on 2 cores).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bm25;
mod co_annotation;
mod common;
mod entity_search;
mod entity_vector;
mod filters;
mod graph_expand;
mod missing_index;
mod search;
mod trace;
mod vector;
