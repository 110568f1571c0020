//! SQL access for the auth service (SQLite or PostgreSQL through one pool).

use kg_proto::v1::{
    AuditEvent, Deny, Grant, Group, Namespace, Pat, Permission, Principal, PrincipalKind,
};
use kg_stores::sql::{SqlBackend, SqlStore};
use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row as _};

use crate::error::{AuthError, Result};
use crate::resolve::{DenyRow, GrantRow};
use crate::service::Subject;

/// Groups named `role:<name>` grant the role `<name>` to their members.
pub const ROLE_GROUP_PREFIX: &str = "role:";

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

fn namespace_from(row: &AnyRow) -> Result<Namespace> {
    Ok(Namespace {
        name: row.try_get("name")?,
        description: row.try_get("description")?,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

/// A namespace whose deletion has begun.
#[derive(Debug, Clone)]
pub(crate) struct Retired {
    pub namespace: Namespace,
    pub retired_at_ms: i64,
    /// Removed by the call that retired it; 0 when an earlier call did.
    pub grants_removed: i64,
    pub denies_removed: i64,
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
        disabled_at_ms: row
            .try_get::<Option<i64>, _>("disabled_at_ms")?
            .unwrap_or(0),
    })
}

/// The columns [`principal_from`] reads.
const PRINCIPAL_COLUMNS: &str = "id, name, kind, acts_for, is_admin, created_at_ms, disabled_at_ms";

const GRANT_COLUMNS: &str =
    "id, principal_id, group_id, namespace, permission, path_prefix, created_at_ms";

fn grant_from(row: &AnyRow) -> Result<Grant> {
    Ok(Grant {
        id: row.try_get("id")?,
        principal_id: row
            .try_get::<Option<String>, _>("principal_id")?
            .unwrap_or_default(),
        group_id: row
            .try_get::<Option<String>, _>("group_id")?
            .unwrap_or_default(),
        namespace: row.try_get("namespace")?,
        permission: permission_from(&row.try_get::<String, _>("permission")?) as i32,
        path_prefix: row.try_get("path_prefix")?,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

const DENY_COLUMNS: &str =
    "id, namespace, principal_id, group_id, path_prefix, file_id, created_at_ms";

fn deny_from(row: &AnyRow) -> Result<Deny> {
    Ok(Deny {
        id: row.try_get("id")?,
        namespace: row.try_get("namespace")?,
        principal_id: row
            .try_get::<Option<String>, _>("principal_id")?
            .unwrap_or_default(),
        group_id: row
            .try_get::<Option<String>, _>("group_id")?
            .unwrap_or_default(),
        path_prefix: row.try_get("path_prefix")?,
        file_id: row.try_get("file_id")?,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

const AUDIT_COLUMNS: &str = "id, at_ms, principal_id, on_behalf_of, tool, namespaces, outcome, latency_us, result_bytes, request_id, transport, more_namespaces, target";

fn audit_from(row: &AnyRow) -> Result<AuditEvent> {
    let namespaces: String = row.try_get("namespaces")?;
    Ok(AuditEvent {
        id: row.try_get("id")?,
        at_ms: row.try_get("at_ms")?,
        principal_id: row.try_get("principal_id")?,
        on_behalf_of: row.try_get("on_behalf_of")?,
        tool: row.try_get("tool")?,
        namespaces: serde_json::from_str(&namespaces)
            .map_err(|e| AuthError::Corrupt(format!("audit namespaces: {e}")))?,
        outcome: row.try_get("outcome")?,
        latency_us: row.try_get("latency_us")?,
        result_bytes: row.try_get("result_bytes")?,
        request_id: row.try_get("request_id")?,
        transport: row.try_get("transport")?,
        more_namespaces: u32::try_from(row.try_get::<i64, _>("more_namespaces")?)
            .map_err(|e| AuthError::Corrupt(format!("audit more_namespaces: {e}")))?,
        target: row.try_get("target")?,
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

/// `None` for "", so optional ids are stored as NULL.
fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
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
    /// The stored hash, compared in constant time with the computed one.
    pub token_hash: String,
    pub expires_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
    /// When the token was last recorded as used (minute resolution, see [`PAT_TOUCH_MS`]).
    pub last_used_at_ms: Option<i64>,
    /// When the user an agent acts for was disabled (`None`: enabled, or not an agent).
    pub acts_for_disabled_at_ms: Option<i64>,
    pub principal: Principal,
}

/// Tables whose every change moves the access epoch.
const EPOCH_TABLES: &[&str] = &[
    "kg_namespaces",
    "kg_principals",
    "kg_groups",
    "kg_group_members",
    "kg_grants",
    "kg_denies",
];

/// The PAT columns Authorize depends on; `last_used_at_ms` (rewritten by use) is not one.
const EPOCH_PAT_COLUMNS: &str = "token_hash, principal_id, expires_at_ms, revoked_at_ms";

/// `pg_advisory_xact_lock` key serialising the first admin's creation ("kgboot" in ASCII).
const BOOTSTRAP_LOCK: i64 = 0x6b67_626f_6f74;

/// `pg_advisory_xact_lock` key serialising changes to who is an enabled admin ("kgadmin").
const ADMIN_SET_LOCK: i64 = 0x006b_6761_646d_696e;

/// `pg_advisory_xact_lock` key serialising the trigger DDL ("kgepoch" in ASCII).
const EPOCH_DDL_LOCK: i64 = 0x006b_6765_706f_6368;

const EPOCH_BUMP: &str = "UPDATE kg_auth_epoch SET epoch = epoch + 1 WHERE id = 1";

fn sqlite_epoch_triggers() -> Vec<String> {
    let mut statements = Vec::new();
    for table in EPOCH_TABLES {
        for op in ["INSERT", "UPDATE", "DELETE"] {
            statements.push(format!(
                "CREATE TRIGGER IF NOT EXISTS {table}_epoch_{} AFTER {op} ON {table} \
                 BEGIN {EPOCH_BUMP}; END",
                op.to_lowercase()
            ));
        }
    }
    for (name, event) in [
        ("insert", "INSERT".to_owned()),
        ("delete", "DELETE".to_owned()),
        ("update", format!("UPDATE OF {EPOCH_PAT_COLUMNS}")),
    ] {
        statements.push(format!(
            "CREATE TRIGGER IF NOT EXISTS kg_pats_epoch_{name} AFTER {event} ON kg_pats \
             BEGIN {EPOCH_BUMP}; END"
        ));
    }
    statements
}

fn postgres_epoch_triggers() -> Vec<String> {
    let mut statements = vec![
        // Replicas starting together would race on the catalog rows otherwise.
        format!("SELECT pg_advisory_xact_lock({EPOCH_DDL_LOCK})"),
        format!(
            "CREATE OR REPLACE FUNCTION kg_auth_epoch_bump() RETURNS trigger LANGUAGE plpgsql AS \
         $body$ BEGIN {EPOCH_BUMP}; RETURN NULL; END $body$"
        ),
    ];
    for table in EPOCH_TABLES {
        statements.push(format!(
            "CREATE OR REPLACE TRIGGER {table}_epoch AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE \
             ON {table} FOR EACH STATEMENT EXECUTE FUNCTION kg_auth_epoch_bump()"
        ));
    }
    statements.push(format!(
        "CREATE OR REPLACE TRIGGER kg_pats_epoch AFTER INSERT OR DELETE OR TRUNCATE OR UPDATE OF \
         {EPOCH_PAT_COLUMNS} ON kg_pats FOR EACH STATEMENT EXECUTE FUNCTION kg_auth_epoch_bump()"
    ));
    statements
}

/// How stale a PAT's `last_used_at_ms` may get before a use rewrites it: hot tokens must not
/// turn every call into a write.
pub(crate) const PAT_TOUCH_MS: i64 = 60_000;

impl AuthStore {
    /// A probe of the database, for the service's health.
    pub(crate) fn health_probe(&self) -> kg_common::grpc::StoreProbe {
        self.sql.health_probe()
    }

    pub(crate) async fn open(sql: SqlStore) -> Result<Self> {
        sql.migrate(&MIGRATOR).await?;
        let store = Self { sql };
        store.ensure_epoch_triggers().await?;
        Ok(store)
    }

    /// Creates (or replaces) the triggers that move `kg_auth_epoch` forward with every change
    /// Authorize could see, in the changing statement's own transaction. Triggers rather than
    /// code in each write: no write path, present or future, and no operator's hand-written
    /// SQL can change access without the epoch saying so.
    async fn ensure_epoch_triggers(&self) -> Result<()> {
        let statements = match self.sql.backend() {
            SqlBackend::Sqlite => sqlite_epoch_triggers(),
            SqlBackend::Postgres => postgres_epoch_triggers(),
        };
        let mut tx = self.sql.begin_write().await?;
        for statement in statements {
            sqlx::query(AssertSqlSafe(statement))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The current access epoch (see migration 1003).
    pub(crate) async fn access_epoch(&self) -> Result<i64> {
        let row = sqlx::query("SELECT epoch FROM kg_auth_epoch WHERE id = 1")
            .fetch_optional(self.sql.pool())
            .await?;
        match row {
            Some(row) => Ok(row.try_get(0)?),
            // Fail closed: without an epoch nothing can be trusted from memory.
            None => Err(AuthError::Corrupt("kg_auth_epoch has no row".to_owned())),
        }
    }

    pub(crate) async fn create_namespace(&self, ns: &Namespace) -> Result<()> {
        let inserted = sqlx::query(
            "INSERT INTO kg_namespaces (name, description, created_at_ms) VALUES ($1, $2, $3)",
        )
        .bind(&ns.name)
        .bind(&ns.description)
        .bind(ns.created_at_ms)
        .execute(self.sql.pool())
        .await;
        match inserted {
            Ok(_) => Ok(()),
            Err(e) if is_unique_violation(&e) => match self.retired_at(&ns.name).await? {
                Some(_) => Err(AuthError::FailedPrecondition(format!(
                    "namespace `{}` is being deleted; finish with `kgmesh ns delete {}` (it \
                     resumes where the deletion stopped), then create it again",
                    ns.name, ns.name
                ))),
                None => Err(AuthError::AlreadyExists(format!("namespace `{}`", ns.name))),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// When `name`'s deletion began: `None` for a live namespace or one that does not exist.
    async fn retired_at(&self, name: &str) -> Result<Option<i64>> {
        let row = sqlx::query("SELECT retired_at_ms FROM kg_namespaces WHERE name = $1")
            .bind(name)
            .fetch_optional(self.sql.pool())
            .await?;
        Ok(match row {
            Some(row) => row.try_get("retired_at_ms")?,
            None => None,
        })
    }

    /// The live namespaces (retired ones are being deleted and reach nobody).
    pub(crate) async fn list_namespaces(&self) -> Result<Vec<Namespace>> {
        let rows = sqlx::query(
            "SELECT name, description, created_at_ms FROM kg_namespaces \
             WHERE retired_at_ms IS NULL ORDER BY name",
        )
        .fetch_all(self.sql.pool())
        .await?;
        rows.iter().map(namespace_from).collect()
    }

    /// Begins deleting `name`, in one transaction: its grants and denies go and it is marked
    /// retired at `at_ms` (which moves the access epoch, so no cached resolution outlives it).
    /// A namespace already retired is answered as it is; `None` when there is no such namespace.
    pub(crate) async fn retire_namespace(&self, name: &str, at_ms: i64) -> Result<Option<Retired>> {
        let mut tx = self.sql.begin_write().await?;
        let Some(row) = sqlx::query(
            "SELECT name, description, created_at_ms, retired_at_ms FROM kg_namespaces WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(None);
        };
        let namespace = namespace_from(&row)?;
        if let Some(retired_at_ms) = row.try_get::<Option<i64>, _>("retired_at_ms")? {
            return Ok(Some(Retired {
                namespace,
                retired_at_ms,
                grants_removed: 0,
                denies_removed: 0,
            }));
        }
        let grants_removed = sqlx::query("DELETE FROM kg_grants WHERE namespace = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let denies_removed = sqlx::query("DELETE FROM kg_denies WHERE namespace = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("UPDATE kg_namespaces SET retired_at_ms = $1 WHERE name = $2")
            .bind(at_ms)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(Retired {
            namespace,
            retired_at_ms: at_ms,
            grants_removed: i64::try_from(grants_removed).unwrap_or(i64::MAX),
            denies_removed: i64::try_from(denies_removed).unwrap_or(i64::MAX),
        }))
    }

    /// Forgets the retired namespace `name`, freeing its name; `false` when there is none.
    /// Grants or denies put while it was being retired go with it.
    pub(crate) async fn delete_namespace(&self, name: &str) -> Result<bool> {
        let mut tx = self.sql.begin_write().await?;
        let Some(row) = sqlx::query("SELECT retired_at_ms FROM kg_namespaces WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(false);
        };
        if row.try_get::<Option<i64>, _>("retired_at_ms")?.is_none() {
            return Err(AuthError::FailedPrecondition(format!(
                "namespace `{name}` is live: retire it first (`kgmesh ns delete {name}` does both)"
            )));
        }
        sqlx::query("DELETE FROM kg_grants WHERE namespace = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM kg_denies WHERE namespace = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM kg_namespaces WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
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
        let sql = format!("SELECT {PRINCIPAL_COLUMNS} FROM kg_principals WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(self.sql.pool())
            .await?;
        row.as_ref().map(principal_from).transpose()
    }

    pub(crate) async fn list_principals(&self) -> Result<Vec<Principal>> {
        let sql =
            format!("SELECT {PRINCIPAL_COLUMNS} FROM kg_principals ORDER BY created_at_ms, id");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(self.sql.pool())
            .await?;
        rows.iter().map(principal_from).collect()
    }

    /// Disables principal `id` at `at_ms` (kept when it already is disabled), or enables it
    /// with `None`. Refuses to disable the last enabled admin, checked in the same transaction
    /// as the change: on PostgreSQL under an advisory lock, as two admins disabling each other
    /// at once would each see the other still enabled (SQLite runs one writer at a time).
    /// `None` when no such principal exists.
    pub(crate) async fn set_principal_disabled(
        &self,
        id: &str,
        at_ms: Option<i64>,
    ) -> Result<Option<Principal>> {
        let mut tx = self.sql.begin_write().await?;
        if self.sql.backend() == SqlBackend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(ADMIN_SET_LOCK)
                .execute(&mut *tx)
                .await?;
        }
        let sql = format!("SELECT {PRINCIPAL_COLUMNS} FROM kg_principals WHERE id = $1");
        let Some(row) = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(None);
        };
        let principal = principal_from(&row)?;
        if at_ms.is_some() && principal.is_admin && principal.disabled_at_ms == 0 {
            let others = sqlx::query(
                "SELECT COUNT(*) AS n FROM kg_principals \
                 WHERE is_admin = 1 AND disabled_at_ms IS NULL AND id <> $1",
            )
            .bind(id)
            .fetch_one(&mut *tx)
            .await?
            .try_get::<i64, _>("n")?;
            if others == 0 {
                return Err(AuthError::FailedPrecondition(format!(
                    "`{id}` is the last enabled admin: make or enable another admin first, so \
                     that someone can still administer this deployment"
                )));
            }
        }
        // A repeat changes nothing: a disabled principal keeps the time it was first disabled.
        match at_ms {
            Some(at_ms) => {
                sqlx::query(
                    "UPDATE kg_principals SET disabled_at_ms = $1 \
                     WHERE id = $2 AND disabled_at_ms IS NULL",
                )
                .bind(at_ms)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            }
            None => {
                sqlx::query(
                    "UPDATE kg_principals SET disabled_at_ms = NULL \
                     WHERE id = $1 AND disabled_at_ms IS NOT NULL",
                )
                .bind(id)
                .execute(&mut *tx)
                .await?;
            }
        }
        let sql = format!("SELECT {PRINCIPAL_COLUMNS} FROM kg_principals WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let principal = principal_from(&row)?;
        tx.commit().await?;
        Ok(Some(principal))
    }

    /// Creates `admin` only when no admin exists, in one statement; on PostgreSQL under an
    /// advisory lock, as two transactions would both see no admin and both insert (SQLite
    /// runs one writer at a time). Whether it was created.
    pub(crate) async fn create_first_admin(&self, admin: &Principal) -> Result<bool> {
        let mut tx = self.sql.begin_write().await?;
        if self.sql.backend() == SqlBackend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(BOOTSTRAP_LOCK)
                .execute(&mut *tx)
                .await?;
        }
        let created = sqlx::query(
            "INSERT INTO kg_principals (id, name, kind, acts_for, is_admin, created_at_ms) \
             SELECT $1, $2, $3, NULL, 1, $4 \
             WHERE NOT EXISTS (SELECT 1 FROM kg_principals WHERE is_admin = 1)",
        )
        .bind(&admin.id)
        .bind(&admin.name)
        .bind(kind_str(admin.kind()))
        .bind(admin.created_at_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(created == 1)
    }

    pub(crate) async fn namespace_exists(&self, name: &str) -> Result<bool> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n FROM kg_namespaces WHERE name = $1 AND retired_at_ms IS NULL",
        )
        .bind(name)
        .fetch_one(self.sql.pool())
        .await?;
        Ok(row.try_get::<i64, _>("n")? > 0)
    }

    pub(crate) async fn group_exists(&self, id: &str) -> Result<bool> {
        let row = sqlx::query("SELECT COUNT(*) AS n FROM kg_groups WHERE id = $1")
            .bind(id)
            .fetch_one(self.sql.pool())
            .await?;
        Ok(row.try_get::<i64, _>("n")? > 0)
    }

    /// Upserts a grant of `g.principal_id` or `g.group_id` (exactly one is set).
    pub(crate) async fn put_grant(&self, g: &Grant) -> Result<Grant> {
        // Column names come from this fixed pair, never from input.
        let (column, subject_id) = if g.group_id.is_empty() {
            ("principal_id", g.principal_id.as_str())
        } else {
            ("group_id", g.group_id.as_str())
        };
        // Re-granting the same (subject, namespace, prefix) updates the permission.
        let update = format!(
            "UPDATE kg_grants SET permission = $1 WHERE {column} = $2 AND namespace = $3 AND path_prefix = $4"
        );
        let run_update = || {
            sqlx::query(AssertSqlSafe(update.clone()))
                .bind(permission_str(g.permission()))
                .bind(subject_id)
                .bind(&g.namespace)
                .bind(&g.path_prefix)
                .execute(self.sql.pool())
        };
        if run_update().await?.rows_affected() == 0 {
            let inserted = sqlx::query(
                "INSERT INTO kg_grants (id, principal_id, group_id, namespace, permission, path_prefix, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(&g.id)
            .bind(non_empty(&g.principal_id))
            .bind(non_empty(&g.group_id))
            .bind(&g.namespace)
            .bind(permission_str(g.permission()))
            .bind(&g.path_prefix)
            .bind(g.created_at_ms)
            .execute(self.sql.pool())
            .await;
            match inserted {
                Ok(_) => {}
                // A concurrent put inserted the same grant first: update it.
                Err(e) if is_unique_violation(&e) => {
                    run_update().await?;
                }
                Err(e) if is_fk_violation(&e) => {
                    return Err(AuthError::NotFound(format!(
                        "subject `{subject_id}` or namespace `{}`",
                        g.namespace
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let select = format!(
            "SELECT {GRANT_COLUMNS} FROM kg_grants WHERE {column} = $1 AND namespace = $2 AND path_prefix = $3"
        );
        let row = sqlx::query(AssertSqlSafe(select))
            .bind(subject_id)
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

    /// Direct grants of one subject, or every grant for [`Subject::Everyone`].
    pub(crate) async fn list_grants(&self, subject: &Subject) -> Result<Vec<Grant>> {
        let (filter, id) = match subject {
            Subject::Principal(id) => ("WHERE principal_id = $1", Some(id)),
            Subject::Group(id) => ("WHERE group_id = $1", Some(id)),
            Subject::Everyone => ("", None),
        };
        let sql = format!(
            "SELECT {GRANT_COLUMNS} FROM kg_grants {filter} ORDER BY namespace, path_prefix, principal_id, group_id"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(id) = id {
            query = query.bind(id.clone());
        }
        let rows = query.fetch_all(self.sql.pool()).await?;
        rows.iter().map(grant_from).collect()
    }

    /// A principal's effective grants (its own and its groups') and the denies
    /// naming it, its groups or everyone. One statement, so one snapshot on
    /// both backends: a concurrent change is seen whole or not at all.
    pub(crate) async fn access_rows(
        &self,
        principal_id: &str,
    ) -> Result<(Vec<GrantRow>, Vec<DenyRow>)> {
        let rows = sqlx::query(
            "SELECT 'grant' AS kind, namespace, permission, path_prefix, '' AS file_id FROM kg_grants \
               WHERE (principal_id = $1 OR group_id IN (SELECT group_id FROM kg_group_members WHERE principal_id = $1)) \
               AND namespace IN (SELECT name FROM kg_namespaces WHERE retired_at_ms IS NULL) \
             UNION ALL \
             SELECT 'deny' AS kind, namespace, '' AS permission, path_prefix, file_id FROM kg_denies \
               WHERE principal_id = $1 OR group_id IN (SELECT group_id FROM kg_group_members WHERE principal_id = $1) OR subject_key = '*'",
        )
        .bind(principal_id)
        .fetch_all(self.sql.pool())
        .await?;
        let mut grants = Vec::new();
        let mut denies = Vec::new();
        for row in &rows {
            let namespace: String = row.try_get("namespace")?;
            let path_prefix: String = row.try_get("path_prefix")?;
            if row.try_get::<String, _>("kind")? == "grant" {
                grants.push(GrantRow {
                    namespace,
                    permission: permission_from(&row.try_get::<String, _>("permission")?),
                    path_prefix,
                });
            } else {
                denies.push(DenyRow {
                    namespace,
                    path_prefix,
                    file_id: row.try_get("file_id")?,
                });
            }
        }
        Ok((grants, denies))
    }

    /// Roles of a principal: the names after `role:` of the groups it is in
    /// (`role:support` grants the role `support`), sorted.
    pub(crate) async fn roles_of(&self, principal_id: &str) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT g.name FROM kg_groups g JOIN kg_group_members m ON m.group_id = g.id \
             WHERE m.principal_id = $1 AND g.name LIKE 'role:%' ORDER BY g.name",
        )
        .bind(principal_id)
        .fetch_all(self.sql.pool())
        .await?;
        let mut roles = Vec::new();
        for row in &rows {
            let name: String = row.try_get(0)?;
            if let Some(role) = name.strip_prefix(ROLE_GROUP_PREFIX)
                && !role.is_empty()
            {
                roles.push(role.to_owned());
            }
        }
        Ok(roles)
    }

    pub(crate) async fn create_group(&self, group: &Group) -> Result<()> {
        sqlx::query("INSERT INTO kg_groups (id, name, created_at_ms) VALUES ($1, $2, $3)")
            .bind(&group.id)
            .bind(&group.name)
            .bind(group.created_at_ms)
            .execute(self.sql.pool())
            .await
            .map_err(|e| {
                if is_unique_violation(&e) {
                    AuthError::AlreadyExists(format!("group `{}`", group.name))
                } else {
                    e.into()
                }
            })?;
        Ok(())
    }

    pub(crate) async fn get_group(&self, id: &str) -> Result<Option<Group>> {
        let Some(row) = sqlx::query("SELECT id, name, created_at_ms FROM kg_groups WHERE id = $1")
            .bind(id)
            .fetch_optional(self.sql.pool())
            .await?
        else {
            return Ok(None);
        };
        let members = sqlx::query(
            "SELECT principal_id FROM kg_group_members WHERE group_id = $1 ORDER BY principal_id",
        )
        .bind(id)
        .fetch_all(self.sql.pool())
        .await?;
        Ok(Some(Group {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            created_at_ms: row.try_get("created_at_ms")?,
            member_ids: members
                .iter()
                .map(|m| m.try_get("principal_id"))
                .collect::<Result<_, _>>()?,
        }))
    }

    pub(crate) async fn list_groups(&self) -> Result<Vec<Group>> {
        let rows = sqlx::query("SELECT id, name, created_at_ms FROM kg_groups ORDER BY name")
            .fetch_all(self.sql.pool())
            .await?;
        let members = sqlx::query(
            "SELECT group_id, principal_id FROM kg_group_members ORDER BY group_id, principal_id",
        )
        .fetch_all(self.sql.pool())
        .await?;
        let mut by_group: std::collections::HashMap<String, Vec<String>> =
            std::collections::HashMap::new();
        for m in &members {
            by_group
                .entry(m.try_get("group_id")?)
                .or_default()
                .push(m.try_get("principal_id")?);
        }
        rows.iter()
            .map(|r| {
                let id: String = r.try_get("id")?;
                Ok(Group {
                    member_ids: by_group.remove(&id).unwrap_or_default(),
                    id,
                    name: r.try_get("name")?,
                    created_at_ms: r.try_get("created_at_ms")?,
                })
            })
            .collect()
    }

    /// Adds a member; adding an existing member changes nothing.
    pub(crate) async fn add_group_member(
        &self,
        group_id: &str,
        principal_id: &str,
        now_ms: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO kg_group_members (group_id, principal_id, added_at_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (group_id, principal_id) DO NOTHING",
        )
        .bind(group_id)
        .bind(principal_id)
        .bind(now_ms)
        .execute(self.sql.pool())
        .await
        .map_err(|e| {
            if is_fk_violation(&e) {
                AuthError::NotFound(format!("group `{group_id}` or principal `{principal_id}`"))
            } else {
                e.into()
            }
        })?;
        Ok(())
    }

    pub(crate) async fn remove_group_member(
        &self,
        group_id: &str,
        principal_id: &str,
    ) -> Result<()> {
        sqlx::query("DELETE FROM kg_group_members WHERE group_id = $1 AND principal_id = $2")
            .bind(group_id)
            .bind(principal_id)
            .execute(self.sql.pool())
            .await?;
        Ok(())
    }

    /// Stores a deny, or returns the identical one already stored.
    pub(crate) async fn put_deny(&self, deny: &Deny, subject_key: &str) -> Result<Deny> {
        sqlx::query(
            "INSERT INTO kg_denies (id, namespace, principal_id, group_id, subject_key, path_prefix, file_id, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (namespace, subject_key, path_prefix, file_id) DO NOTHING",
        )
        .bind(&deny.id)
        .bind(&deny.namespace)
        .bind(non_empty(&deny.principal_id))
        .bind(non_empty(&deny.group_id))
        .bind(subject_key)
        .bind(&deny.path_prefix)
        .bind(&deny.file_id)
        .bind(deny.created_at_ms)
        .execute(self.sql.pool())
        .await
        .map_err(|e| {
            if is_fk_violation(&e) {
                AuthError::NotFound(format!("subject or namespace `{}`", deny.namespace))
            } else {
                e.into()
            }
        })?;
        let sql = format!(
            "SELECT {DENY_COLUMNS} FROM kg_denies WHERE namespace = $1 AND subject_key = $2 AND path_prefix = $3 AND file_id = $4"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(&deny.namespace)
            .bind(subject_key)
            .bind(&deny.path_prefix)
            .bind(&deny.file_id)
            .fetch_one(self.sql.pool())
            .await?;
        deny_from(&row)
    }

    pub(crate) async fn delete_deny(&self, id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM kg_denies WHERE id = $1")
            .bind(id)
            .execute(self.sql.pool())
            .await?;
        Ok(done.rows_affected() > 0)
    }

    pub(crate) async fn list_denies(&self, namespace: Option<&str>) -> Result<Vec<Deny>> {
        let filter = if namespace.is_some() {
            "WHERE namespace = $1"
        } else {
            ""
        };
        let sql = format!(
            "SELECT {DENY_COLUMNS} FROM kg_denies {filter} ORDER BY namespace, created_at_ms, id"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(ns) = namespace {
            query = query.bind(ns.to_owned());
        }
        let rows = query.fetch_all(self.sql.pool()).await?;
        rows.iter().map(deny_from).collect()
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

    pub(crate) async fn get_pat(&self, id: &str) -> Result<Option<Pat>> {
        let row = sqlx::query(
            "SELECT id, principal_id, name, prefix, created_at_ms, last_used_at_ms, expires_at_ms, revoked_at_ms FROM kg_pats WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.sql.pool())
        .await?;
        row.as_ref().map(pat_from).transpose()
    }

    /// Replaces the secret of a live PAT; false when it is revoked (or gone).
    /// The old hash is overwritten, so the old token matches nothing.
    pub(crate) async fn rotate_pat(
        &self,
        id: &str,
        token_hash: &str,
        prefix: &str,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE kg_pats SET token_hash = $1, prefix = $2, last_used_at_ms = NULL WHERE id = $3 AND revoked_at_ms IS NULL",
        )
        .bind(token_hash)
        .bind(prefix)
        .bind(id)
        .execute(self.sql.pool())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Revokes a live PAT, only one `owner` holds when named (the check is the statement's
    /// own, not a read before it); false when there is no such live PAT.
    pub(crate) async fn revoke_pat(
        &self,
        id: &str,
        owner: Option<&str>,
        now_ms: i64,
    ) -> Result<bool> {
        let done = match owner {
            None => {
                sqlx::query(
                    "UPDATE kg_pats SET revoked_at_ms = $1 WHERE id = $2 AND revoked_at_ms IS NULL",
                )
                .bind(now_ms)
                .bind(id)
                .execute(self.sql.pool())
                .await?
            }
            Some(owner) => {
                sqlx::query(
                    "UPDATE kg_pats SET revoked_at_ms = $1 WHERE id = $2 AND principal_id = $3 AND revoked_at_ms IS NULL",
                )
                .bind(now_ms)
                .bind(id)
                .bind(owner)
                .execute(self.sql.pool())
                .await?
            }
        };
        if done.rows_affected() > 0 {
            return Ok(true);
        }
        // Revoking a revoked PAT is done already (a retried call, or a script run twice);
        // one that does not exist, or is another's, stays "not found".
        let revoked = sqlx::query(
            "SELECT 1 FROM kg_pats WHERE id = $1 AND ($2 = '' OR principal_id = $2) \
             AND revoked_at_ms IS NOT NULL",
        )
        .bind(id)
        .bind(owner.unwrap_or_default())
        .fetch_optional(self.sql.pool())
        .await?;
        Ok(revoked.is_some())
    }

    pub(crate) async fn pat_owner(&self, token_hash: &str) -> Result<Option<PatOwner>> {
        let row = sqlx::query(
            "SELECT t.id AS pat_id, t.token_hash, t.expires_at_ms, t.revoked_at_ms, t.last_used_at_ms, \
             p.id, p.name, p.kind, p.acts_for, p.is_admin, p.created_at_ms, p.disabled_at_ms, \
             u.disabled_at_ms AS acts_for_disabled_at_ms \
             FROM kg_pats t JOIN kg_principals p ON p.id = t.principal_id \
             LEFT JOIN kg_principals u ON u.id = p.acts_for WHERE t.token_hash = $1",
        )
        .bind(token_hash)
        .fetch_optional(self.sql.pool())
        .await?;
        row.map(|r| {
            Ok(PatOwner {
                pat_id: r.try_get("pat_id")?,
                token_hash: r.try_get("token_hash")?,
                expires_at_ms: r.try_get("expires_at_ms")?,
                revoked_at_ms: r.try_get("revoked_at_ms")?,
                last_used_at_ms: r.try_get("last_used_at_ms")?,
                acts_for_disabled_at_ms: r.try_get("acts_for_disabled_at_ms")?,
                principal: principal_from(&r)?,
            })
        })
        .transpose()
    }

    pub(crate) async fn touch_pat(&self, pat_id: &str, now_ms: i64) -> Result<()> {
        // The guard repeats the caller's check, for two callers racing on one token.
        sqlx::query(
            "UPDATE kg_pats SET last_used_at_ms = $1 WHERE id = $2 AND (last_used_at_ms IS NULL OR last_used_at_ms < $3)",
        )
        .bind(now_ms)
        .bind(pat_id)
        .bind(now_ms - PAT_TOUCH_MS)
        .execute(self.sql.pool())
        .await?;
        Ok(())
    }

    pub(crate) async fn insert_audit(&self, e: &AuditEvent) -> Result<()> {
        let namespaces = serde_json::to_string(&e.namespaces)
            .map_err(|err| AuthError::Corrupt(format!("audit namespaces: {err}")))?;
        let sql = format!(
            "INSERT INTO kg_audit ({AUDIT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(&e.id)
            .bind(e.at_ms)
            .bind(&e.principal_id)
            .bind(&e.on_behalf_of)
            .bind(&e.tool)
            .bind(namespaces)
            .bind(&e.outcome)
            .bind(e.latency_us)
            .bind(e.result_bytes)
            .bind(&e.request_id)
            .bind(&e.transport)
            .bind(i64::from(e.more_namespaces))
            .bind(&e.target)
            .execute(self.sql.pool())
            .await?;
        Ok(())
    }

    /// Deletes at most `batch` audit events recorded before `before_ms`, oldest first; how
    /// many it deleted.
    pub(crate) async fn delete_audit_before(&self, before_ms: i64, batch: i64) -> Result<u64> {
        let deleted = sqlx::query(
            "DELETE FROM kg_audit WHERE id IN \
             (SELECT id FROM kg_audit WHERE at_ms < $1 ORDER BY at_ms, id LIMIT $2)",
        )
        .bind(before_ms)
        .bind(batch)
        .execute(self.sql.pool())
        .await?;
        Ok(deleted.rows_affected())
    }

    /// Audit events, newest first, at most `fetch` of them.
    pub(crate) async fn list_audit(&self, q: &AuditQuery, fetch: i64) -> Result<Vec<AuditEvent>> {
        let mut clauses: Vec<String> = Vec::new();
        let mut binds: Vec<Bind> = Vec::new();
        // Pushes a value and returns its `$N` number.
        let param = |value: Bind, binds: &mut Vec<Bind>| {
            binds.push(value);
            binds.len()
        };
        if let Some(p) = &q.principal_id {
            let n = param(Bind::Text(p.clone()), &mut binds);
            clauses.push(format!("principal_id = ${n}"));
        }
        if let Some(t) = &q.tool {
            let n = param(Bind::Text(t.clone()), &mut binds);
            clauses.push(format!("tool = ${n}"));
        }
        if let Some(since) = q.since_ms {
            let n = param(Bind::Int(since), &mut binds);
            clauses.push(format!("at_ms >= ${n}"));
        }
        if let Some(until) = q.until_ms {
            let n = param(Bind::Int(until), &mut binds);
            clauses.push(format!("at_ms < ${n}"));
        }
        if let Some((at, id)) = &q.after {
            // Keyset: strictly older than the last row already returned.
            let a = param(Bind::Int(*at), &mut binds);
            let i = param(Bind::Text(id.clone()), &mut binds);
            clauses.push(format!("(at_ms < ${a} OR (at_ms = ${a} AND id < ${i}))"));
        }
        let limit = param(Bind::Int(fetch), &mut binds);
        let filter = if clauses.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", clauses.join(" AND "))
        };
        let sql = format!(
            "SELECT {AUDIT_COLUMNS} FROM kg_audit {filter} ORDER BY at_ms DESC, id DESC LIMIT ${limit}"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for b in binds {
            query = match b {
                Bind::Text(s) => query.bind(s),
                Bind::Int(i) => query.bind(i),
            };
        }
        let rows = query.fetch_all(self.sql.pool()).await?;
        rows.iter().map(audit_from).collect()
    }
}

/// A value bound to a dynamically built query.
enum Bind {
    Text(String),
    Int(i64),
}

/// Filters of an audit query, validated by the service.
#[derive(Debug, Default)]
pub(crate) struct AuditQuery {
    pub principal_id: Option<String>,
    pub tool: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// Keyset position: only events strictly older than this (at_ms, id).
    pub after: Option<(i64, String)>,
}
