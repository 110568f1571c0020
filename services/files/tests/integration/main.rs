//! Integration tests of the files service on real stores: one test binary per crate, so a
//! build links it once instead of once per file (disk and link time on 2 cores).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod blob_sweep;
mod branch_metadata;
mod common;
mod file_tools;
mod knowledge_graph;
mod lost_stream;
mod mixed_access;
mod namespace_purge;
mod reindex;
mod unqueued;
mod upload_race;
mod version_links;
mod version_prune;
