//! kg-indexer: turns ingest events into the namespace graph.
//!
//! A durable JetStream consumer of `kg.files.v1.*.changed` reads each file
//! version's blob, parses it, chunks it with exact offsets, builds the heading
//! outline and writes chunks, outline and file nodes to FalkorDB
//! idempotently, then publishes `kg.index.v1.<ns>.indexed`. Deletes and flag
//! changes apply to the graph at once. Serves no request traffic.

#![recursion_limit = "256"]

pub mod document;
pub mod graph_writer;
pub mod pipeline;
mod worker;

pub use worker::{IndexerConfig, IndexerError, run};
