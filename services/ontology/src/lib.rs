//! kg-ontology: will own each namespace's published TBox (entity and relation
//! types the indexer extracts with) and compiled ontology projects whose
//! objects become generated MCP tools.
//!
//! Only the contract exists so far: `kg.v1.Ontology` in
//! `proto/kg/v1/ontology.proto`. No server is built from this crate yet and
//! `kgmesh up` does not start one, so nothing answers with made-up data.

pub use kg_proto::v1::ontology_server::{Ontology, OntologyServer};
