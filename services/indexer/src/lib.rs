//! kg-indexer: turns ingest events into the namespace graph.
//!
//! A durable JetStream consumer of `kg.files.v1.*.changed` reads each file
//! version's blob, parses it, chunks it with exact offsets, builds the heading
//! outline, embeds the chunks into the vector index, and writes chunks, outline
//! and file nodes to FalkorDB idempotently, then publishes `kg.index.v1.<ns>.indexed`.
//! Deletes and flag changes apply to graph and vectors at once, on consumers of their own that
//! do not wait behind an ingest backlog. A deleted namespace's graph and vectors are removed,
//! and its queued changes dropped (see `purge`). Change events every consumer acknowledged are
//! removed from the stream (see `compaction`). Serves no request traffic.

#![recursion_limit = "256"]

pub mod backfill;
pub mod branch;
pub mod compaction;
pub mod document;
pub mod entities;
pub mod entity_writer;
mod flags;
pub mod graph_writer;
mod lanes;
pub mod pipeline;
mod purge;
pub mod settings;
pub mod sparse;
pub mod vector_writer;
mod worker;

pub use settings::IndexerSettings;

/// A JetStream call failed; the caller retries or redelivers.
pub(crate) fn events_err(err: impl Into<kg_stores::error::BoxError>) -> kg_stores::StoreError {
    kg_stores::StoreError::unavailable(kg_stores::error::StoreKind::Events, err)
}
pub use vector_writer::Vectors;
pub use worker::{IndexerConfig, IndexerError, run};
