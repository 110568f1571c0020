//! kg-stores: the store code shared by the kgmesh services.
//!
//! It owns the FalkorDB graph access (`graph`: one graph per namespace, indexes, JSON rows),
//! the SQL pool and migrations over SQLite or PostgreSQL (`sql`), the NATS JetStream streams
//! and subjects of ingest (`events`), the published TBox per namespace in JetStream KV (`tbox`),
//! content-addressed blobs (`blobs`), a chunk's text identity (`chunk_text`), the vector index over
//! embedded Qdrant or a Qdrant server with its access-filter compiler (`vector`), and the embedded
//! servers that tests and `kgmesh up` start from the dev-deps virtualenv (`embedded`).
//! It knows nothing about requests, callers or permissions; services bring those.

pub mod blobs;
pub mod chunk_text;
pub mod consumer;
pub mod embedded;
pub mod error;
pub mod events;
pub mod graph;
pub mod sql;
pub mod tbox;
pub mod vector;

pub use error::StoreError;
