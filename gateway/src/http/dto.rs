//! camelCase JSON of the admin REST API, converted from the proto messages.
//! Enums are lowercase strings.

use kg_proto::v1::{
    AuditEvent, Deny, FileInfo, FileStatus, Grant, Group, Namespace, Pat, Permission, Principal,
    PrincipalKind,
};
use serde::Serialize;

use crate::error::ClientError;

pub(crate) fn kind_name(kind: PrincipalKind) -> &'static str {
    match kind {
        PrincipalKind::User => "user",
        PrincipalKind::Agent => "agent",
        PrincipalKind::Service => "service",
        PrincipalKind::Unspecified => "unspecified",
    }
}

pub(crate) fn parse_kind(value: &str) -> Result<PrincipalKind, ClientError> {
    match value {
        "user" => Ok(PrincipalKind::User),
        "agent" => Ok(PrincipalKind::Agent),
        "service" => Ok(PrincipalKind::Service),
        other => Err(ClientError::invalid(format!(
            "kind `{other}` is unknown; use user, agent or service"
        ))),
    }
}

pub(crate) fn permission_name(permission: Permission) -> &'static str {
    match permission {
        Permission::Read => "read",
        Permission::Write => "write",
        Permission::Admin => "admin",
        Permission::Unspecified => "unspecified",
    }
}

pub(crate) fn parse_permission(value: &str) -> Result<Permission, ClientError> {
    match value {
        "read" => Ok(Permission::Read),
        "write" => Ok(Permission::Write),
        "admin" => Ok(Permission::Admin),
        other => Err(ClientError::invalid(format!(
            "permission `{other}` is unknown; use read, write or admin"
        ))),
    }
}

fn status_name(status: FileStatus) -> &'static str {
    match status {
        FileStatus::Pending => "pending",
        FileStatus::Indexed => "indexed",
        FileStatus::Failed => "failed",
        FileStatus::Deleted => "deleted",
        FileStatus::Stored => "stored",
        FileStatus::Unspecified => "unspecified",
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NamespaceJson {
    name: String,
    description: String,
    created_at_ms: i64,
}

impl From<Namespace> for NamespaceJson {
    fn from(n: Namespace) -> Self {
        Self {
            name: n.name,
            description: n.description,
            created_at_ms: n.created_at_ms,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PrincipalJson {
    id: String,
    name: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    acts_for: Option<String>,
    is_admin: bool,
    created_at_ms: i64,
    disabled: bool,
    /// When it was disabled; absent while it is enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    disabled_at_ms: Option<i64>,
}

impl From<Principal> for PrincipalJson {
    fn from(p: Principal) -> Self {
        Self {
            kind: kind_name(p.kind()),
            id: p.id,
            name: p.name,
            acts_for: Some(p.acts_for).filter(|a| !a.is_empty()),
            is_admin: p.is_admin,
            created_at_ms: p.created_at_ms,
            disabled: p.disabled_at_ms != 0,
            disabled_at_ms: Some(p.disabled_at_ms).filter(|at| *at != 0),
        }
    }
}

/// `None` for proto's "unset" empty string, so JSON says `null`.
fn non_empty(value: String) -> Option<String> {
    Some(value).filter(|v| !v.is_empty())
}

/// A grant to a principal or to a group: the other id is `null`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GrantJson {
    id: String,
    principal_id: Option<String>,
    group_id: Option<String>,
    namespace: String,
    permission: &'static str,
    path_prefix: String,
    created_at_ms: i64,
}

impl From<Grant> for GrantJson {
    fn from(g: Grant) -> Self {
        Self {
            permission: permission_name(g.permission()),
            id: g.id,
            principal_id: non_empty(g.principal_id),
            group_id: non_empty(g.group_id),
            namespace: g.namespace,
            path_prefix: g.path_prefix,
            created_at_ms: g.created_at_ms,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupJson {
    id: String,
    name: String,
    member_ids: Vec<String>,
    created_at_ms: i64,
}

impl From<Group> for GroupJson {
    fn from(g: Group) -> Self {
        Self {
            id: g.id,
            name: g.name,
            member_ids: g.member_ids,
            created_at_ms: g.created_at_ms,
        }
    }
}

/// A deny: subject `principalId`, `groupId` or neither (everyone); target
/// `pathPrefix` or `fileId`. Unset fields are `null`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DenyJson {
    id: String,
    namespace: String,
    principal_id: Option<String>,
    group_id: Option<String>,
    path_prefix: Option<String>,
    file_id: Option<String>,
    created_at_ms: i64,
}

impl From<Deny> for DenyJson {
    fn from(d: Deny) -> Self {
        Self {
            id: d.id,
            namespace: d.namespace,
            principal_id: non_empty(d.principal_id),
            group_id: non_empty(d.group_id),
            path_prefix: non_empty(d.path_prefix),
            file_id: non_empty(d.file_id),
            created_at_ms: d.created_at_ms,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AuditEventJson {
    id: String,
    at_ms: i64,
    principal_id: String,
    on_behalf_of: Option<String>,
    tool: String,
    namespaces: Vec<String>,
    /// Namespaces the call covered beyond the (at most 64) listed.
    more_namespaces: u32,
    outcome: String,
    latency_us: i64,
    result_bytes: i64,
    request_id: String,
    transport: String,
    /// For an admin API change, the path it was made on; absent for tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
}

impl From<AuditEvent> for AuditEventJson {
    fn from(e: AuditEvent) -> Self {
        Self {
            id: e.id,
            at_ms: e.at_ms,
            principal_id: e.principal_id,
            on_behalf_of: non_empty(e.on_behalf_of),
            tool: e.tool,
            namespaces: e.namespaces,
            more_namespaces: e.more_namespaces,
            outcome: e.outcome,
            latency_us: e.latency_us,
            result_bytes: e.result_bytes,
            request_id: e.request_id,
            transport: e.transport,
            target: non_empty(e.target),
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PatJson {
    id: String,
    principal_id: String,
    name: String,
    prefix: String,
    created_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_used_at_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked_at_ms: Option<i64>,
}

impl From<Pat> for PatJson {
    fn from(p: Pat) -> Self {
        Self {
            id: p.id,
            principal_id: p.principal_id,
            name: p.name,
            prefix: p.prefix,
            created_at_ms: p.created_at_ms,
            last_used_at_ms: p.last_used_at_ms,
            expires_at_ms: p.expires_at_ms,
            revoked_at_ms: p.revoked_at_ms,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FileJson {
    namespace: String,
    file_id: String,
    path: String,
    version_id: String,
    content_sha256: String,
    size: i64,
    mime: String,
    status: &'static str,
    status_reason: String,
    enabled: bool,
    hidden: bool,
    created_at_ms: i64,
    updated_at_ms: i64,
    chunk_count: i64,
}

impl From<FileInfo> for FileJson {
    fn from(f: FileInfo) -> Self {
        Self {
            status: status_name(f.status()),
            namespace: f.namespace,
            file_id: f.file_id,
            path: f.path,
            version_id: f.version_id,
            content_sha256: f.content_sha256,
            size: f.size,
            mime: f.mime,
            status_reason: f.status_reason,
            enabled: f.enabled,
            hidden: f.hidden,
            created_at_ms: f.created_at_ms,
            updated_at_ms: f.updated_at_ms,
            chunk_count: f.chunk_count,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn enums_are_lowercase_and_fields_camel_case() {
        let file = FileInfo {
            namespace: "demo".into(),
            file_id: "f1".into(),
            path: "a.md".into(),
            status: FileStatus::Failed as i32,
            status_reason: "unsupported type".into(),
            chunk_count: 3,
            ..Default::default()
        };
        let v = serde_json::to_value(FileJson::from(file)).unwrap();
        assert_eq!(v["status"], "failed");
        assert_eq!(v["statusReason"], "unsupported type");
        assert_eq!(v["chunkCount"], 3);
        let p = Principal {
            id: "u1".into(),
            name: "ada".into(),
            kind: PrincipalKind::Agent as i32,
            acts_for: "u0".into(),
            ..Default::default()
        };
        let v = serde_json::to_value(PrincipalJson::from(p)).unwrap();
        assert_eq!(
            v,
            json!({"id": "u1", "name": "ada", "kind": "agent", "actsFor": "u0", "isAdmin": false, "createdAtMs": 0, "disabled": false})
        );
        assert_eq!(parse_permission("write").unwrap(), Permission::Write);
        assert!(
            parse_permission("owner")
                .unwrap_err()
                .message
                .contains("read, write or admin")
        );
        assert!(parse_kind("robot").is_err());

        let g = Grant {
            id: "g1".into(),
            group_id: "grp1".into(),
            namespace: "demo".into(),
            permission: Permission::Read as i32,
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(GrantJson::from(g)).unwrap(),
            json!({"id": "g1", "principalId": null, "groupId": "grp1", "namespace": "demo",
                   "permission": "read", "pathPrefix": "", "createdAtMs": 0})
        );
        let d = Deny {
            id: "d1".into(),
            namespace: "demo".into(),
            file_id: "f1".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(DenyJson::from(d)).unwrap(),
            json!({"id": "d1", "namespace": "demo", "principalId": null, "groupId": null,
                   "pathPrefix": null, "fileId": "f1", "createdAtMs": 0})
        );
        let e = AuditEvent {
            id: "a1".into(),
            tool: "kg_search".into(),
            namespaces: vec!["demo".into()],
            outcome: "ok".into(),
            transport: "http".into(),
            ..Default::default()
        };
        let v = serde_json::to_value(AuditEventJson::from(e)).unwrap();
        assert_eq!(v["onBehalfOf"], json!(null));
        assert_eq!(v["latencyUs"], 0);
        assert_eq!(v["namespaces"], json!(["demo"]));
    }
}
