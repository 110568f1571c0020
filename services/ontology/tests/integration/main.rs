//! Integration tests of the ontology service on real SQLite: one test binary per crate, so a
//! build links it once instead of once per file (disk and link time on 2 cores).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod approval_flow;
mod shop;
mod sqlite_statement_trace;
mod tbox_publish;
mod watch_stop;
