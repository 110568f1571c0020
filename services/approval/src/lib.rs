//! kg-approval: will own proposals of governed actions, the human decisions on
//! them and the execution of approved effects. It is a separate process no
//! model can address: MCP can only submit proposals.
//!
//! Only the contract exists so far: `kg.v1.Approval` in
//! `proto/kg/v1/approval.proto`. No server is built from this crate yet and
//! `kgmesh up` does not start one, so nothing answers with made-up data.

pub use kg_proto::v1::approval_server::{Approval, ApprovalServer};
