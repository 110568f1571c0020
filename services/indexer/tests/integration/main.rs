//! Integration tests of the indexer on real NATS, FalkorDB and qdrant-edge: one test binary per crate, so a
//! build links it once instead of once per file (disk and link time on 2 cores).
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The FalkorDB client's futures nest deep enough that proving one Send (a reader task) needs more.
#![recursion_limit = "256"]

mod branch_uploads;
mod entities;
mod fast_path;
mod formats_graph;
mod graph_replace;
mod llm_extractor;
mod lost_bus;
mod namespace_purge;
mod progress_acks;
mod rebuild;
mod stores;
mod stream_compaction;
mod two_replicas;
mod vector_backfill;
