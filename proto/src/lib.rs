//! The gRPC contracts of kgmesh: every service's messages and client/server
//! stubs, generated from `proto/kg/v1/*.proto` at build time. Owns no logic.

/// Version 1 of the kgmesh contracts (`package kg.v1`).
pub mod v1 {
    #![allow(clippy::all, missing_docs, unreachable_pub)]
    tonic::include_proto!("kg.v1");
}
