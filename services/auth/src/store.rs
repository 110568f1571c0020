//! SQL access for the auth service (SQLite or PostgreSQL through one pool).

use kg_proto::v1::{Grant, Namespace, Pat, Permission, Principal, PrincipalKind};
use kg_stores::sql::SqlStore;
use sqlx::Row as _;
use sqlx::any::AnyRow;

use crate::error::{AuthError, Result};
use crate::resolve::GrantRow;

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

pub(crate) fn permission_str(p: Permission) -> &'static str {
    match p {
        Permission::Read => "read",
        Permission::Write => "write",
        Permission::Admin => "admin",
        Permission::Unspecified => "none",
    }
}

fn permission_from(s: &str) -> Permission {
    match s {
        "read" => Permission::Read,
        "write" => Permission::Write,
        "admin" => Permission::Admin,
        _ => Permission::Unspecified,
    }
}

pub(crate) fn kind_str(k: PrincipalKind) -> &'static str {
    match k {
        PrincipalKind::User => "user",
        PrincipalKind::Agent => "agent",
        PrincipalKind::Service => "service",
        PrincipalKind::Unspecified => "unspecified",
    }
}

fn kind_from(s: &str) -> PrincipalKind {
    match s {
        "user" => PrincipalKind::User,
        "agent" => PrincipalKind::Agent,
        "service" => PrincipalKind::Service,
        _ => PrincipalKind::Unspecified,
    }
}

fn principal_from(row: &AnyRow) -> Result<Principal> {
    Ok(Principal {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        kind: kind_from(&row.try_get::<String, _>("kind")?) as i32,
        acts_for: row
            .try_get::<Option<String>, _>("acts_for")?
            .unwrap_or_default(),
        is_admin: row.try_get::<i64, _>("is_admin")? != 0,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

fn grant_from(row: &AnyRow) -> Result<Grant> {
    Ok(Grant {
        id: row.try_get("id")?,
        principal_id: row.try_get("principal_id")?,
        namespace: row.try_get("namespace")?,
        permission: permission_from(&row.try_get::<String, _>("permission")?) as i32,
        path_prefix: row.try_get("path_prefix")?,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

fn pat_from(row: &AnyRow) -> Result<Pat> {
    Ok(Pat {
        id: row.try_get("id")?,
        principal_id: row.try_get("principal_id")?,
        name: row.try_get("name")?,
        prefix: row.try_get("prefix")?,
        created_at_ms: row.try_get("created_at_ms")?,
        last_used_at_ms: row.try_get("last_used_at_ms")?,
        expires_at_ms: row.try_get("expires_at_ms")?,
        revoked_at_ms: row.try_get("revoked_at_ms")?,
    })
}

/// Whether an error is a unique-constraint violation (both backends).
fn is_unique_violation(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => db.is_unique_violation(),
        _ => false,
    }
}

/// Whether an error is a foreign-key violation (both backends).
fn is_fk_violation(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => db.is_foreign_key_violation(),
        _ => false,
    }
}

/// The auth tables.
#[derive(Clone)]
pub(crate) struct AuthStore {
    sql: SqlStore,
}

/// A PAT joined with its principal, as `Authorize` needs it.
pub(crate) struct PatOwner {
    pub pat_id: String,
    pub expires_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
    pub principal: Principal,
}

impl AuthStore {
    pub(crate) async fn open(sql: SqlStore) -> Result<Self> {
        sql.migrate(&MIGRATOR).await?;
        Ok(Self { sql })
    }

    pub(crate) async fn create_namespace(&self, ns: &Namespace) -> Result<()> {
        sqlx::query(
            "INSERT INTO kg_namespaces (name, description, created_at_ms) VALUES ($1, $2, $3)",
        )
        .bind(&ns.name)
        .bind(&ns.description)
        .bind(ns.created_at_ms)
        .execute(self.sql.pool())
        .await
        .map_err(|e| {
            if is_unique_violation(&e) {
                AuthError::AlreadyExists(format!("namespace `{}`", ns.name))
            } else {
                e.into()
            }
        })?;
        Ok(())
    }

    pub(crate) async fn list_namespaces(&self) -> Result<Vec<Namespace>> {
        let rows =
            sqlx::query("SELECT name, description, created_at_ms FROM kg_namespaces ORDER BY name")
                .fetch_all(self.sql.pool())
                .await?;
        rows.iter()
            .map(|r| {
                Ok(Namespace {
                    name: r.try_get("name")?,
                    description: r.try_get("description")?,
                    created_at_ms: r.try_get("created_at_ms")?,
                })
            })
            .collect()
    }

    pub(crate) async fn namespace_names(&self) -> Result<Vec<String>> {
        Ok(self
            .list_namespaces()
            .await?
            .into_iter()
            .map(|n| n.name)
            .collect())
    }

    pub(crate) async fn create_principal(&self, p: &Principal) -> Result<()> {
        sqlx::query(
            "INSERT INTO kg_principals (id, name, kind, acts_for, is_admin, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&p.id)
        .bind(&p.name)
        .bind(kind_str(p.kind()))
        .bind(if p.acts_for.is_empty() { None } else { Some(p.acts_for.clone()) })
        .bind(i64::from(p.is_admin))
        .bind(p.created_at_ms)
        .execute(self.sql.pool())
        .await
        .map_err(|e| {
            if is_fk_violation(&e) {
                AuthError::NotFound(format!("principal `{}` (actsFor)", p.acts_for))
            } else {
                e.into()
            }
        })?;
        Ok(())
    }

    pub(crate) async fn get_principal(&self, id: &str) -> Result<Option<Principal>> {
        let row = sqlx::query("SELECT id, name, kind, acts_for, is_admin, created_at_ms FROM kg_principals WHERE id = $1")
            .bind(id)
            .fetch_optional(self.sql.pool())
            .await?;
        row.as_ref().map(principal_from).transpose()
    }

    pub(crate) async fn list_principals(&self) -> Result<Vec<Principal>> {
        let rows = sqlx::query(
            "SELECT id, name, kind, acts_for, is_admin, created_at_ms FROM kg_principals ORDER BY created_at_ms, id",
        )
        .fetch_all(self.sql.pool())
        .await?;
        rows.iter().map(principal_from).collect()
    }

    pub(crate) async fn any_admin(&self) -> Result<bool> {
        let row = sqlx::query("SELECT COUNT(*) AS n FROM kg_principals WHERE is_admin = 1")
            .fetch_one(self.sql.pool())
            .await?;
        Ok(row.try_get::<i64, _>("n")? > 0)
    }

    pub(crate) async fn put_grant(&self, g: &Grant) -> Result<Grant> {
        // Re-granting the same (principal, namespace, prefix) updates the permission.
        let updated = sqlx::query(
            "UPDATE kg_grants SET permission = $1 WHERE principal_id = $2 AND namespace = $3 AND path_prefix = $4",
        )
        .bind(permission_str(g.permission()))
        .bind(&g.principal_id)
        .bind(&g.namespace)
        .bind(&g.path_prefix)
        .execute(self.sql.pool())
        .await?;
        if updated.rows_affected() == 0 {
            sqlx::query(
                "INSERT INTO kg_grants (id, principal_id, namespace, permission, path_prefix, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&g.id)
            .bind(&g.principal_id)
            .bind(&g.namespace)
            .bind(permission_str(g.permission()))
            .bind(&g.path_prefix)
            .bind(g.created_at_ms)
            .execute(self.sql.pool())
            .await
            .map_err(|e| {
                if is_fk_violation(&e) {
                    AuthError::NotFound(format!("principal `{}` or namespace `{}`", g.principal_id, g.namespace))
                } else {
                    e.into()
                }
            })?;
        }
        let row = sqlx::query(
            "SELECT id, principal_id, namespace, permission, path_prefix, created_at_ms FROM kg_grants WHERE principal_id = $1 AND namespace = $2 AND path_prefix = $3",
        )
        .bind(&g.principal_id)
        .bind(&g.namespace)
        .bind(&g.path_prefix)
        .fetch_one(self.sql.pool())
        .await?;
        grant_from(&row)
    }

    pub(crate) async fn delete_grant(&self, id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM kg_grants WHERE id = $1")
            .bind(id)
            .execute(self.sql.pool())
            .await?;
        Ok(done.rows_affected() > 0)
    }

    pub(crate) async fn list_grants(&self, principal_id: Option<&str>) -> Result<Vec<Grant>> {
        let rows = match principal_id {
            Some(p) => {
                sqlx::query(
                    "SELECT id, principal_id, namespace, permission, path_prefix, created_at_ms FROM kg_grants WHERE principal_id = $1 ORDER BY namespace, path_prefix",
                )
                .bind(p)
                .fetch_all(self.sql.pool())
                .await?
            }
            None => {
                sqlx::query(
                    "SELECT id, principal_id, namespace, permission, path_prefix, created_at_ms FROM kg_grants ORDER BY principal_id, namespace, path_prefix",
                )
                .fetch_all(self.sql.pool())
                .await?
            }
        };
        rows.iter().map(grant_from).collect()
    }

    pub(crate) async fn grant_rows(&self, principal_id: &str) -> Result<Vec<GrantRow>> {
        Ok(self
            .list_grants(Some(principal_id))
            .await?
            .into_iter()
            .map(|g| GrantRow {
                permission: g.permission(),
                namespace: g.namespace,
                path_prefix: g.path_prefix,
            })
            .collect())
    }

    pub(crate) async fn create_pat(&self, pat: &Pat, token_hash: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO kg_pats (id, principal_id, name, prefix, token_hash, created_at_ms, expires_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&pat.id)
        .bind(&pat.principal_id)
        .bind(&pat.name)
        .bind(&pat.prefix)
        .bind(token_hash)
        .bind(pat.created_at_ms)
        .bind(pat.expires_at_ms)
        .execute(self.sql.pool())
        .await
        .map_err(|e| {
            if is_fk_violation(&e) {
                AuthError::NotFound(format!("principal `{}`", pat.principal_id))
            } else {
                e.into()
            }
        })?;
        Ok(())
    }

    pub(crate) async fn list_pats(&self, principal_id: Option<&str>) -> Result<Vec<Pat>> {
        let rows = match principal_id {
            Some(p) => {
                sqlx::query(
                    "SELECT id, principal_id, name, prefix, created_at_ms, last_used_at_ms, expires_at_ms, revoked_at_ms FROM kg_pats WHERE principal_id = $1 ORDER BY created_at_ms, id",
                )
                .bind(p)
                .fetch_all(self.sql.pool())
                .await?
            }
            None => {
                sqlx::query(
                    "SELECT id, principal_id, name, prefix, created_at_ms, last_used_at_ms, expires_at_ms, revoked_at_ms FROM kg_pats ORDER BY created_at_ms, id",
                )
                .fetch_all(self.sql.pool())
                .await?
            }
        };
        rows.iter().map(pat_from).collect()
    }

    pub(crate) async fn revoke_pat(&self, id: &str, now_ms: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE kg_pats SET revoked_at_ms = $1 WHERE id = $2 AND revoked_at_ms IS NULL",
        )
        .bind(now_ms)
        .bind(id)
        .execute(self.sql.pool())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    pub(crate) async fn pat_owner(&self, token_hash: &str) -> Result<Option<PatOwner>> {
        let row = sqlx::query(
            "SELECT t.id AS pat_id, t.expires_at_ms, t.revoked_at_ms, p.id, p.name, p.kind, p.acts_for, p.is_admin, p.created_at_ms \
             FROM kg_pats t JOIN kg_principals p ON p.id = t.principal_id WHERE t.token_hash = $1",
        )
        .bind(token_hash)
        .fetch_optional(self.sql.pool())
        .await?;
        row.map(|r| {
            Ok(PatOwner {
                pat_id: r.try_get("pat_id")?,
                expires_at_ms: r.try_get("expires_at_ms")?,
                revoked_at_ms: r.try_get("revoked_at_ms")?,
                principal: principal_from(&r)?,
            })
        })
        .transpose()
    }

    pub(crate) async fn touch_pat(&self, pat_id: &str, now_ms: i64) -> Result<()> {
        // Only write when the stored value is a minute old: keeps hot tokens from
        // turning every call into a write.
        sqlx::query(
            "UPDATE kg_pats SET last_used_at_ms = $1 WHERE id = $2 AND (last_used_at_ms IS NULL OR last_used_at_ms < $3)",
        )
        .bind(now_ms)
        .bind(pat_id)
        .bind(now_ms - 60_000)
        .execute(self.sql.pool())
        .await?;
        Ok(())
    }
}
