//! The SQL pool shared by auth, files, ontology and approval: SQLite locally, PostgreSQL in
//! production, one code path through `sqlx::AnyPool`.
//!
//! Conventions every service follows so one migration set runs on both backends:
//! - DDL both accept: `TEXT`, `BIGINT`, `DOUBLE PRECISION`; ids are TEXT uuids; no
//!   `AUTOINCREMENT`/`SERIAL`; booleans are `BIGINT` 0/1 (the Any driver decodes a SQLite
//!   `BOOLEAN` column as an integer, not a `bool`).
//! - Placeholders are `$1, $2, …` on both (SQLite reads `$N` as parameter N; verified in
//!   `tests/integration/servers.rs`).
//! - Each service has its own `Migrator` with a disjoint version range, and all of them share
//!   the `_sqlx_migrations` table, so [`SqlStore::migrate`] ignores versions it does not know.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{AnyPool, ConnectOptions, Connection, Executor};

use crate::error::{StoreError, StoreKind};

/// The database behind a [`SqlStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlBackend {
    /// A SQLite file (`sqlite://path`).
    Sqlite,
    /// PostgreSQL (`postgres://…`).
    Postgres,
}

/// A pooled SQL connection for one database.
#[derive(Clone)]
pub struct SqlStore {
    pool: AnyPool,
    backend: SqlBackend,
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

const MAX_CONNECTIONS: u32 = 10;
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

impl SqlStore {
    /// Connects to `sqlite://path` (the file and its directory are created when missing; WAL,
    /// 5 s busy timeout, foreign keys on) or `postgres://user:pass@host:port/db`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = backend_of(url)?;
        let url = match backend {
            SqlBackend::Sqlite => prepare_sqlite_url(url).await?,
            SqlBackend::Postgres => url.to_owned(),
        };
        let options: AnyConnectOptions = url.parse().map_err(|err| StoreError::InvalidInput {
            what: "database url",
            reason: format!("cannot parse it: {err}"),
        })?;
        // Statements are logged at TRACE on target `sqlx::query` (off unless a subscriber asks
        // for it; never "slow"): a debugging aid, and how the ontology tests record every
        // statement a SQLite warehouse runs (SQLite has no server-side statement log).
        let options = options
            .log_statements(log::LevelFilter::Trace)
            .log_slow_statements(log::LevelFilter::Off, Duration::MAX);

        if backend == SqlBackend::Sqlite {
            // WAL is a property of the file: switch once, before the pool opens connections
            // that could contend for the exclusive lock the switch needs.
            let mut conn = sqlx::AnyConnection::connect_with(&options).await?;
            conn.execute("PRAGMA journal_mode = WAL").await?;
            conn.close().await?;
        }

        let mut pool_options = AnyPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT);
        if backend == SqlBackend::Sqlite {
            pool_options = pool_options.after_connect(sqlite_after_connect);
        }
        let pool = pool_options.connect_with(options).await?;
        Ok(SqlStore { pool, backend })
    }

    /// The pool, for queries. Use `$1, $2, …` placeholders on both backends.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Begins a transaction that will write. On SQLite it takes the write lock at once
    /// (`BEGIN IMMEDIATE`, waiting out the busy timeout for it): a deferred transaction that
    /// reads first and then writes fails at once with `SQLITE_BUSY_SNAPSHOT` (517) when another
    /// writer committed in between, whatever the busy timeout, and under an ingest that made a
    /// namespace delete answer 500 now and then. On PostgreSQL, a plain `BEGIN`.
    pub async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        match self.backend {
            SqlBackend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await,
            SqlBackend::Postgres => self.pool.begin().await,
        }
    }

    /// Which database this is.
    pub fn backend(&self) -> SqlBackend {
        self.backend
    }

    /// Applies `migrator`'s pending migrations. Versions applied by other services'
    /// migrators in the same database are ignored rather than reported as missing; each
    /// service numbers its own in a block of a thousand (auth 1xxx, files 2xxx, ...). A
    /// version in one of `migrator`'s blocks that it does not know was applied by a newer
    /// release, and is refused ([`StoreError::SchemaNewer`]): this release would run on
    /// tables it does not understand (a namespace being deleted would come back, say).
    pub async fn migrate(&self, migrator: &Migrator) -> Result<(), StoreError> {
        self.refuse_newer_schema(migrator).await?;
        let mut own = Migrator::with_migrations(migrator.iter().cloned().collect());
        own.set_ignore_missing(true);
        own.run(&self.pool).await.map_err(map_migrate_error)
    }

    async fn refuse_newer_schema(&self, migrator: &Migrator) -> Result<(), StoreError> {
        let exists = match self.backend {
            SqlBackend::Sqlite => {
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'"
            }
            SqlBackend::Postgres => {
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = '_sqlx_migrations'"
            }
        };
        let tables: i64 = sqlx::query_scalar(exists).fetch_one(&self.pool).await?;
        if tables == 0 {
            return Ok(());
        }
        let known: BTreeSet<i64> = migrator.iter().map(|m| m.version).collect();
        let blocks: BTreeSet<i64> = known.iter().map(|v| v / 1_000).collect();
        let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
            .fetch_all(&self.pool)
            .await?;
        let unknown: Vec<i64> = applied
            .into_iter()
            .filter(|v| blocks.contains(&(v / 1_000)) && !known.contains(v))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(StoreError::SchemaNewer { versions: unknown })
        }
    }

    /// A probe for a service's health: whether the database answers a trivial statement
    /// now (the error is dropped: it may name the server).
    pub fn health_probe(&self) -> kg_common::grpc::StoreProbe {
        let pool = self.pool.clone();
        std::sync::Arc::new(move || {
            let pool = pool.clone();
            Box::pin(async move { sqlx::query("SELECT 1").execute(&pool).await.is_ok() })
        })
    }

    /// Closes every connection; later calls fail with `Unavailable`.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn sqlite_after_connect(
    conn: &mut sqlx::AnyConnection,
    _meta: sqlx::pool::PoolConnectionMetadata,
) -> BoxFuture<'_, Result<(), sqlx::Error>> {
    Box::pin(async move {
        // NORMAL is durable across application crashes in WAL mode and much faster than FULL.
        conn.execute("PRAGMA synchronous = NORMAL").await?;
        conn.execute("PRAGMA foreign_keys = ON").await?;
        conn.execute("PRAGMA busy_timeout = 5000").await?;
        Ok(())
    })
}

fn backend_of(url: &str) -> Result<SqlBackend, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(SqlBackend::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(SqlBackend::Postgres)
    } else {
        Err(StoreError::InvalidInput {
            what: "database url",
            reason: "expected sqlite://path or postgres://user:pass@host:port/db".into(),
        })
    }
}

/// Adds `mode=rwc` (create when missing) unless the URL sets a mode, and creates the
/// file's directory.
async fn prepare_sqlite_url(url: &str) -> Result<String, StoreError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    let in_memory = path.is_empty() || path == ":memory:";
    if !in_memory
        && let Some(dir) = Path::new(path).parent()
        && !dir.as_os_str().is_empty()
    {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|err| StoreError::internal(StoreKind::Sql, err))?;
    }
    let has_mode = query.is_some_and(|q| q.split('&').any(|kv| kv.starts_with("mode=")));
    Ok(match (has_mode || in_memory, query) {
        (true, _) => url.to_owned(),
        (false, Some(_)) => format!("{url}&mode=rwc"),
        (false, None) => format!("{url}?mode=rwc"),
    })
}

/// Whether a query failed because the database could not be reached (no connection within the
/// pool's timeout, or the connection broke), rather than for anything about the query: the
/// caller may retry it. The services' own SQL error types sort sqlx errors by it.
pub fn is_unreachable(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::PoolTimedOut | sqlx::Error::Io(_))
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        use sqlx::error::ErrorKind;
        let store = StoreKind::Sql;
        match err {
            sqlx::Error::RowNotFound => StoreError::NotFound { what: "row".into() },
            sqlx::Error::PoolTimedOut => StoreError::timeout(store, err),
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => StoreError::unavailable(store, err),
            sqlx::Error::Database(db) => {
                let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
                if db.kind() == ErrorKind::UniqueViolation {
                    StoreError::AlreadyExists {
                        what: "record".into(),
                        source: db.to_string().into(),
                    }
                } else if code == "57014" || code == "5" || code == "6" {
                    // PostgreSQL query_canceled (statement_timeout); SQLite BUSY / LOCKED
                    // after busy_timeout ran out.
                    StoreError::timeout(store, db.to_string())
                } else if code.starts_with("08") || code == "57P01" || code == "57P03" {
                    // PostgreSQL connection exceptions, admin shutdown, cannot connect now.
                    StoreError::unavailable(store, db.to_string())
                } else {
                    StoreError::internal(store, db)
                }
            }
            other => StoreError::internal(store, other),
        }
    }
}

fn map_migrate_error(err: MigrateError) -> StoreError {
    match err {
        MigrateError::Execute(inner) => inner.into(),
        other => StoreError::internal(StoreKind::Sql, format!("migration failed: {other}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn backend_is_read_from_the_scheme() {
        assert_eq!(backend_of("sqlite://a.db").unwrap(), SqlBackend::Sqlite);
        assert_eq!(backend_of("sqlite::memory:").unwrap(), SqlBackend::Sqlite);
        assert_eq!(
            backend_of("postgres://u:p@h/db").unwrap(),
            SqlBackend::Postgres
        );
        assert_eq!(
            backend_of("postgresql://u:p@h/db").unwrap(),
            SqlBackend::Postgres
        );
        assert!(backend_of("mysql://x").is_err());
    }

    #[tokio::test]
    async fn sqlite_urls_get_create_mode_and_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nested/deeper/kg.db");
        let url = format!("sqlite://{}", file.display());
        assert_eq!(
            prepare_sqlite_url(&url).await.unwrap(),
            format!("{url}?mode=rwc")
        );
        assert!(dir.path().join("nested/deeper").is_dir());
        let with_query = format!("{url}?cache=shared");
        assert_eq!(
            prepare_sqlite_url(&with_query).await.unwrap(),
            format!("{with_query}&mode=rwc")
        );
        let read_only = format!("{url}?mode=ro");
        assert_eq!(prepare_sqlite_url(&read_only).await.unwrap(), read_only);
        assert_eq!(
            prepare_sqlite_url("sqlite::memory:").await.unwrap(),
            "sqlite::memory:"
        );
    }
}
