//! Integration tests of the embedder against MiniLM, an OpenAI-compatible server and an HTTPS endpoint: one test binary per crate, so a
//! build links it once instead of once per file (disk and link time on 2 cores).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod https_endpoint;
mod minilm;
mod openai_server;
mod query_priority;
