//! Deleting a namespace, the registry's part. The gateway retires the namespace in auth
//! first (no token reaches it from then on), then calls [`FilesService::purge_namespace`]:
//! every registry row of the namespace goes in one transaction, the purge is recorded, and
//! the indexer is asked (`kg.files.v1.<ns>.purged`) to remove the graph, vectors and flags
//! records. Until the indexer reports them gone (`kg.index.v1.<ns>.purged`, recorded by
//! [`run_purge_consumer`]) nothing can be written to the namespace and the gateway refuses to
//! create it again, so a namespace made later under the same name never meets the old one's
//! graph. The blob sweep removes the content once no version names it.

use kg_common::access::validate_namespace;
use kg_common::caller::{now_ms, require_admin};
use kg_proto::v1::{CallerContext, NamespacePurge, NamespacePurged};
use kg_stores::consumer::{self, ConsumerSpec, Handled};
use kg_stores::events;
use kg_stores::sql::SqlBackend;
use prost::Message as _;
use sqlx::{AssertSqlSafe, Row as _};
use tokio_util::sync::CancellationToken;

use crate::error::{FilesError, Result};
use crate::service::FilesService;
use crate::store::FilesStore;

/// Rows one purge removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Purged {
    pub files: i64,
    pub versions: i64,
    pub branches: i64,
    pub releases: i64,
    pub environments: i64,
}

/// The registry's tables in the order a purge empties them (children before the rows their
/// foreign keys name), each with the condition that selects the namespace's rows (`$1`).
/// Constant text, never input.
const PURGE_STATEMENTS: [(&str, &str); 10] = [
    (
        "kg_file_version_links",
        "version_id IN (SELECT version_id FROM kg_file_version_meta WHERE namespace = $1)",
    ),
    ("kg_file_version_meta", "namespace = $1"),
    (
        "kg_environment_deploys",
        "environment_id IN (SELECT environment_id FROM kg_environments WHERE namespace = $1)",
    ),
    ("kg_environments", "namespace = $1"),
    (
        "kg_release_files",
        "release_id IN (SELECT release_id FROM kg_releases WHERE namespace = $1)",
    ),
    ("kg_releases", "namespace = $1"),
    (
        "kg_branch_files",
        "branch_id IN (SELECT branch_id FROM kg_branches WHERE namespace = $1)",
    ),
    ("kg_branches", "namespace = $1"),
    (
        "kg_file_versions",
        "file_id IN (SELECT file_id FROM kg_files WHERE namespace = $1)",
    ),
    ("kg_files", "namespace = $1"),
];

/// The PostgreSQL advisory lock of a namespace's registry rows: an upload or a release takes it
/// shared for its transaction, a purge (or a prune of unnamed versions) exclusive, so a purge
/// waits for the uploads already writing (and removes their rows) and the uploads after it find
/// the purge. SQLite needs none: its writers take turns, and both transactions write before
/// they read.
fn namespace_lock_key(namespace: &str) -> i64 {
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::digest(format!("kg_namespace\u{0}{namespace}").as_bytes());
    let mut key = [0u8; 8];
    key.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(key)
}

/// Takes the namespace's advisory lock for the transaction of `conn` (PostgreSQL only).
async fn lock_namespace(
    store: &FilesStore,
    conn: &mut sqlx::AnyConnection,
    namespace: &str,
    exclusive: bool,
) -> Result<()> {
    if store.sql().backend() != SqlBackend::Postgres {
        return Ok(());
    }
    let statement = if exclusive {
        "SELECT pg_advisory_xact_lock($1)"
    } else {
        "SELECT pg_advisory_xact_lock_shared($1)"
    };
    sqlx::query(statement)
        .bind(namespace_lock_key(namespace))
        .execute(conn)
        .await?;
    Ok(())
}

fn count(rows: u64) -> i64 {
    i64::try_from(rows).unwrap_or(i64::MAX)
}

impl FilesStore {
    /// Inside an upload's (or a release's) transaction, before its first write: waits for a
    /// purge or a prune of the namespace that is committing (PostgreSQL; SQLite's writers take
    /// turns anyway).
    pub(crate) async fn hold_namespace(
        &self,
        conn: &mut sqlx::AnyConnection,
        namespace: &str,
    ) -> Result<()> {
        lock_namespace(self, conn, namespace, false).await
    }

    /// Inside a transaction that removes rows an upload or a release could name again (the
    /// prune of unnamed versions): waits for those writing to the namespace and holds off new
    /// ones until it ends (PostgreSQL; SQLite's writers take turns anyway).
    pub(crate) async fn hold_namespace_exclusive(
        &self,
        conn: &mut sqlx::AnyConnection,
        namespace: &str,
    ) -> Result<()> {
        lock_namespace(self, conn, namespace, true).await
    }

    /// Inside an upload's transaction, after its first write: refuses it while the
    /// namespace's purge is unconfirmed. Dropping the transaction rolls the write back.
    pub(crate) async fn refuse_if_purging(
        &self,
        conn: &mut sqlx::AnyConnection,
        namespace: &str,
    ) -> Result<()> {
        let row = sqlx::query("SELECT purged_at_ms FROM kg_namespace_purges WHERE namespace = $1")
            .bind(namespace)
            .fetch_optional(conn)
            .await?;
        match row.map(|row| row.try_get::<i64, _>(0)).transpose()? {
            Some(0) => Err(FilesError::NamespacePurging(namespace.to_owned())),
            _ => Ok(()),
        }
    }

    /// Removes every row of `namespace` and records its purge as unconfirmed, in one
    /// transaction; returns what it removed and when the purge was asked for. That time is read
    /// once the transaction holds the namespace (after every upload already writing committed),
    /// so each change those uploads published was made before it.
    pub(crate) async fn purge_namespace(&self, namespace: &str) -> Result<(Purged, i64)> {
        let mut tx = self.sql().begin_write().await?;
        lock_namespace(self, &mut tx, namespace, true).await?;
        let mut purged = Purged::default();
        for (table, condition) in PURGE_STATEMENTS {
            let sql = format!("DELETE FROM {table} WHERE {condition}");
            let removed = sqlx::query(AssertSqlSafe(sql))
                .bind(namespace)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            match table {
                "kg_files" => purged.files = count(removed),
                "kg_file_versions" => purged.versions = count(removed),
                "kg_branches" => purged.branches = count(removed),
                "kg_releases" => purged.releases = count(removed),
                "kg_environments" => purged.environments = count(removed),
                _ => {}
            }
        }
        // On SQLite the first delete made this transaction the writer.
        let requested_at_ms = now_ms();
        let updated = sqlx::query(
            "UPDATE kg_namespace_purges SET requested_at_ms = $1, purged_at_ms = 0 WHERE namespace = $2",
        )
        .bind(requested_at_ms)
        .bind(namespace)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if updated == 0 {
            sqlx::query(
                "INSERT INTO kg_namespace_purges (namespace, requested_at_ms, purged_at_ms) VALUES ($1, $2, 0)",
            )
            .bind(namespace)
            .bind(requested_at_ms)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok((purged, requested_at_ms))
    }

    /// The namespace's last purge: (asked for at, confirmed at or 0); `None` when never purged.
    pub(crate) async fn namespace_purge(&self, namespace: &str) -> Result<Option<(i64, i64)>> {
        let row = sqlx::query(
            "SELECT requested_at_ms, purged_at_ms FROM kg_namespace_purges WHERE namespace = $1",
        )
        .bind(namespace)
        .fetch_optional(self.sql().pool())
        .await?;
        row.map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .transpose()
    }

    /// Records the indexer's report on the purge asked for at `requested_at_ms`; `false` when a
    /// later purge was asked for since (its own report is still to come).
    pub(crate) async fn confirm_purge(
        &self,
        namespace: &str,
        requested_at_ms: i64,
        at_ms: i64,
    ) -> Result<bool> {
        let updated = sqlx::query(
            "UPDATE kg_namespace_purges SET purged_at_ms = $1 \
             WHERE namespace = $2 AND requested_at_ms = $3 AND purged_at_ms = 0",
        )
        .bind(at_ms)
        .bind(namespace)
        .bind(requested_at_ms)
        .execute(self.sql().pool())
        .await?
        .rows_affected();
        Ok(updated > 0)
    }

    /// The purges the indexer has not reported done: (namespace, asked for at).
    pub(crate) async fn unconfirmed_purges(&self) -> Result<Vec<(String, i64)>> {
        let rows = sqlx::query(
            "SELECT namespace, requested_at_ms FROM kg_namespace_purges WHERE purged_at_ms = 0 ORDER BY namespace",
        )
        .fetch_all(self.sql().pool())
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect()
    }
}

/// Purges are for the deployment's admins, on a valid namespace name.
fn deployment_admin(caller: &CallerContext, namespace: &str) -> Result<()> {
    require_admin(caller).map_err(|_| FilesError::PurgeDenied)?;
    validate_namespace(namespace)?;
    Ok(())
}

fn purge_answer(namespace: &str, requested_at_ms: i64, purged_at_ms: i64) -> NamespacePurge {
    NamespacePurge {
        namespace: namespace.to_owned(),
        requested_at_ms,
        purged_at_ms,
        ..NamespacePurge::default()
    }
}

impl FilesService {
    /// Admin of the deployment: removes the namespace's registry rows and asks the indexer to
    /// remove its graph and vectors (see the module). Called again, it removes whatever was
    /// registered since and asks again.
    pub async fn purge_namespace(
        &self,
        caller: &CallerContext,
        namespace: &str,
    ) -> Result<NamespacePurge> {
        deployment_admin(caller, namespace)?;
        let (purged, requested_at_ms) = self.store.purge_namespace(namespace).await?;
        self.publish_purge(namespace, requested_at_ms).await?;
        tracing::info!(
            namespace,
            files = purged.files,
            versions = purged.versions,
            branches = purged.branches,
            releases = purged.releases,
            environments = purged.environments,
            "namespace purged from the registry; the indexer is asked to remove its graph and vectors"
        );
        Ok(NamespacePurge {
            files_removed: purged.files,
            versions_removed: purged.versions,
            branches_removed: purged.branches,
            releases_removed: purged.releases,
            environments_removed: purged.environments,
            ..purge_answer(namespace, requested_at_ms, 0)
        })
    }

    /// Admin of the deployment: where the namespace's last purge stands.
    pub async fn namespace_purge(
        &self,
        caller: &CallerContext,
        namespace: &str,
    ) -> Result<NamespacePurge> {
        deployment_admin(caller, namespace)?;
        match self.store.namespace_purge(namespace).await? {
            Some((requested, purged)) => Ok(purge_answer(namespace, requested, purged)),
            None => Err(FilesError::TargetNotFound(format!(
                "a purge of namespace `{namespace}`"
            ))),
        }
    }

    /// Refuses a write into a namespace whose purge the indexer has not reported done.
    pub(crate) async fn refuse_while_purging(&self, namespace: &str) -> Result<()> {
        match self.store.namespace_purge(namespace).await? {
            Some((_, 0)) => Err(FilesError::NamespacePurging(namespace.to_owned())),
            _ => Ok(()),
        }
    }

    /// Records the indexer's report that a namespace's graph and vectors are gone.
    pub async fn apply_purged(&self, event: &NamespacePurged) -> Result<bool> {
        let confirmed = self
            .store
            .confirm_purge(&event.namespace, event.requested_at_ms, now_ms())
            .await?;
        if confirmed {
            tracing::info!(namespace = %event.namespace, "the indexer removed a deleted namespace's graph and vectors");
        }
        Ok(confirmed)
    }

    /// Asks the indexer to remove the namespace's graph and vectors.
    pub(crate) async fn publish_purge(&self, namespace: &str, requested_at_ms: i64) -> Result<()> {
        let event = NamespacePurged {
            namespace: namespace.to_owned(),
            requested_at_ms,
        };
        let subject = events::files_purged_subject(namespace)?;
        let msg_id = format!("purge:{namespace}:{requested_at_ms}");
        events::publish(&self.jetstream, &subject, &msg_id, event.encode_to_vec())
            .await
            .map_err(|err| {
                tracing::error!(error = %err.detail(), namespace, "could not ask the indexer to remove a deleted namespace");
                FilesError::PurgeUnqueued(namespace.to_owned())
            })
    }

    /// Asks again for every purge the indexer has not reported done (after a stream was lost).
    pub(crate) async fn republish_unconfirmed_purges(&self) -> Result<usize> {
        let pending = self.store.unconfirmed_purges().await?;
        for (namespace, requested_at_ms) in &pending {
            self.publish_purge(namespace, *requested_at_ms).await?;
        }
        Ok(pending.len())
    }
}

/// Records the indexer's purge reports from `kg.index.v1.*.purged` until `shutdown`.
pub(crate) async fn run_purge_consumer(
    service: FilesService,
    jetstream: async_nats::jetstream::Context,
    shutdown: CancellationToken,
) -> Result<()> {
    let spec = ConsumerSpec {
        stream: events::INDEX_STREAM.to_owned(),
        durable: "files-purges".to_owned(),
        filter_subject: "kg.index.v1.*.purged".to_owned(),
        max_deliver: 20,
        ack_wait: crate::STATUS_ACK_WAIT,
    };
    consumer::run(&jetstream, &spec, shutdown, |delivery| {
        let service = service.clone();
        let payload = delivery.payload.to_vec();
        async move {
            let Ok(event) = NamespacePurged::decode(payload.as_slice()) else {
                tracing::warn!("dropping an undecodable purge report");
                return Handled::Ack;
            };
            match service.apply_purged(&event).await {
                Ok(_) => Handled::Ack,
                Err(err) => Handled::Retry(err.to_string()),
            }
        }
    })
    .await?;
    Ok(())
}
