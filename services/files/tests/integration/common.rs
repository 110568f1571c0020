//! What several scenarios share.

use kg_common::caller::now_ms;
use kg_proto::v1::{AccessFilter, CallerContext, Permission};

/// A caller who may write anywhere in `namespace`, valid for an hour.
pub fn writer(namespace: &str) -> CallerContext {
    let now = now_ms();
    CallerContext {
        principal_id: "files-test".into(),
        access: vec![AccessFilter {
            namespace: namespace.into(),
            allow_prefixes: vec![String::new()],
            permission: Permission::Write as i32,
            ..Default::default()
        }],
        issued_at_ms: now,
        expires_at_ms: now + 3_600_000,
        ..Default::default()
    }
}
