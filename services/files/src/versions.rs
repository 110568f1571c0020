//! Versions of a namespace. Main is the live registry (`kg_files`); a preview
//! branch overlays file versions on main (uploads to a branch never touch
//! main); a release is an immutable snapshot `file_id -> version_id` of a
//! branch, named by a version string unique per namespace; an environment
//! points at a release and keeps its deploy history. Versions are
//! content-addressed and link data is stored per version, so cutting or
//! deploying a release re-indexes nothing.

use kg_common::access::{SqlColumns, normalize_path, sql_predicate, validate_namespace};
use kg_common::caller::{access_for, now_ms};
use kg_proto::v1::{
    AccessFilter, Branch, BranchFile, CallerContext, Deployment, Environment, LookupTarget,
    Permission, Release, ReleaseTarget, ResolveTargetResponse, TargetFile, environment_target,
    lookup_target, release_target,
};
use kg_stores::sql::SqlStore;
use sha2::{Digest as _, Sha256};
use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row as _};

use crate::error::{FilesError, Result, retry_lost_race};
use crate::service::{FilesService, guess_mime, read_filter, version_id};
use crate::store::manage_predicate;

/// Longest branch, release version or environment name.
const MAX_NAME_LEN: usize = 255;
/// Default and largest page of `ResolveTarget`.
const DEFAULT_RESOLVE_PAGE: u32 = 1000;
const MAX_RESOLVE_PAGE: u32 = 10_000;

/// What a lookup target resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// The live registry.
    Main,
    /// A preview branch overlaid on main.
    Branch { branch_id: String },
    /// A release, directly or through an environment.
    Release {
        release_id: String,
        version: String,
        environment_id: Option<String>,
    },
}

impl Resolved {
    fn kind(&self) -> &'static str {
        match self {
            Resolved::Main => "main",
            Resolved::Branch { .. } => "preview_branch",
            Resolved::Release {
                environment_id: Some(_),
                ..
            } => "environment",
            Resolved::Release { .. } => "release",
        }
    }

    /// The `$2` parameter of [`members_sql`].
    fn key(&self) -> &str {
        match self {
            Resolved::Main => "",
            Resolved::Branch { branch_id } => branch_id,
            Resolved::Release { release_id, .. } => release_id,
        }
    }
}

/// One file version of a resolved target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub file_id: String,
    pub version_id: String,
    pub path: String,
}

/// A subquery with columns (file_id, path, version_id, enabled, hidden) over
/// every file version of the target, before access: `$1` is the namespace,
/// `$2` the branch or release id. Registry flags (enabled, hidden) apply to
/// every target, so disabling a file hides it from releases too.
fn members_sql(resolved: &Resolved) -> &'static str {
    match resolved {
        Resolved::Main => {
            "SELECT file_id, path, version_id, enabled, hidden FROM kg_files \
             WHERE namespace = $1 AND status <> 'deleted' AND $2 = ''"
        }
        Resolved::Branch { .. } => {
            "SELECT f.file_id, f.path, f.version_id, f.enabled, f.hidden FROM kg_files f \
             WHERE f.namespace = $1 AND f.status <> 'deleted' AND NOT EXISTS \
             (SELECT 1 FROM kg_branch_files b WHERE b.branch_id = $2 AND (b.file_id = f.file_id OR b.path = f.path)) \
             UNION ALL \
             SELECT b.file_id, b.path, b.version_id, COALESCE(f.enabled, 1) AS enabled, COALESCE(f.hidden, 0) AS hidden \
             FROM kg_branch_files b LEFT JOIN kg_files f ON f.file_id = b.file_id \
             WHERE b.branch_id = $2 AND b.deleted = 0"
        }
        Resolved::Release { .. } => {
            "SELECT r.file_id, r.path, r.version_id, COALESCE(f.enabled, 1) AS enabled, COALESCE(f.hidden, 0) AS hidden \
             FROM kg_release_files r LEFT JOIN kg_files f ON f.file_id = r.file_id \
             WHERE r.release_id = $2 AND r.release_id IN (SELECT release_id FROM kg_releases WHERE namespace = $1)"
        }
    }
}

/// The access predicate's columns over the [`members_sql`] subquery `m`.
const MEMBER_COLUMNS: SqlColumns<'static> = SqlColumns {
    path: "m.path",
    file_id: "m.file_id",
    enabled: "m.enabled",
    hidden: "m.hidden",
};

fn check_name(what: &str, name: &str, extra: &[char]) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') || extra.contains(&c)
        })
        // Each `/`-separated part starts with a letter or digit: no `..`, `.hidden`,
        // `-flag` or empty part, so a name never reads as a path or an option.
        && name
            .split('/')
            .all(|part| part.starts_with(|c: char| c.is_ascii_alphanumeric()));
    if ok {
        Ok(())
    } else {
        let allowed: String = extra.iter().map(|c| format!(", `{c}`")).collect();
        let parts = if extra.contains(&'/') {
            "each `/`-separated part starting"
        } else {
            "starting"
        };
        Err(FilesError::Invalid(format!(
            "invalid {what} `{}`: use 1-{MAX_NAME_LEN} characters: letters, digits, `.`, `_`, `-`{allowed}, {parts} with a letter or digit",
            name.chars().take(80).collect::<String>()
        )))
    }
}

fn branch_from(row: &AnyRow, namespace: &str) -> Result<Branch> {
    Ok(Branch {
        namespace: namespace.to_owned(),
        branch_id: row.try_get("branch_id")?,
        name: row.try_get("name")?,
        created_at_ms: row.try_get("created_at_ms")?,
        created_by: row.try_get("created_by")?,
        changed_files: row.try_get("changed_files")?,
    })
}

fn release_from(row: &AnyRow, namespace: &str) -> Result<Release> {
    Ok(Release {
        namespace: namespace.to_owned(),
        release_id: row.try_get("release_id")?,
        version: row.try_get("version")?,
        branch_id: row.try_get("branch_id")?,
        created_at_ms: row.try_get("created_at_ms")?,
        created_by: row.try_get("created_by")?,
        file_count: row.try_get("file_count")?,
        note: row.try_get("note")?,
    })
}

/// The access predicate's columns over a branch's or release's file rows `x`, with the
/// registry row `f` of the same file id left-joined for its flags (as [`members_sql`]).
const COUNT_COLUMNS: SqlColumns<'static> = SqlColumns {
    path: "x.path",
    file_id: "x.file_id",
    enabled: "COALESCE(f.enabled, 1)",
    hidden: "COALESCE(f.hidden, 0)",
};

/// Columns of a branch row; `changed_files` counts only the branch's files that
/// `predicate` (over [`COUNT_COLUMNS`]) lets the caller see.
fn branch_columns(predicate: &str) -> String {
    format!(
        "b.branch_id, b.name, b.created_at_ms, b.created_by, \
         (SELECT COUNT(*) FROM kg_branch_files x LEFT JOIN kg_files f ON f.file_id = x.file_id \
         WHERE x.branch_id = b.branch_id AND {predicate}) AS changed_files"
    )
}

/// Columns of a release row; `file_count` counts only the release's files that
/// `predicate` (over [`COUNT_COLUMNS`]) lets the caller see.
fn release_columns(predicate: &str) -> String {
    format!(
        "r.release_id, r.version, r.branch_id, r.note, r.created_at_ms, r.created_by, \
         (SELECT COUNT(*) FROM kg_release_files x LEFT JOIN kg_files f ON f.file_id = x.file_id \
         WHERE x.release_id = r.release_id AND {predicate}) AS file_count"
    )
}

/// SQL for branches, releases and environments.
#[derive(Clone)]
pub(crate) struct VersionStore {
    sql: SqlStore,
}

/// A branch upload whose metadata and links the registry lacks: not parsed yet.
pub(crate) struct UnparsedBranchUpload {
    pub(crate) namespace: String,
    pub(crate) file: BranchFile,
    pub(crate) blob_key: String,
}

impl VersionStore {
    /// Up to `limit` branch uploads not parsed yet (no metadata stored for their version),
    /// after `(branch_id, file_id)` in that order: what a replay queues again.
    pub(crate) async fn unparsed_branch_uploads(
        &self,
        after: (&str, &str),
        limit: u32,
    ) -> Result<Vec<UnparsedBranchUpload>> {
        let rows = sqlx::query(
            "SELECT br.namespace, b.branch_id, b.file_id, b.path, b.version_id, b.content_sha256, \
             b.blob_key, b.size, b.mime FROM kg_branch_files b \
             JOIN kg_branches br ON br.branch_id = b.branch_id \
             WHERE b.deleted = 0 \
             AND NOT EXISTS (SELECT 1 FROM kg_file_version_meta m WHERE m.version_id = b.version_id) \
             AND (b.branch_id > $1 OR (b.branch_id = $1 AND b.file_id > $2)) \
             ORDER BY b.branch_id, b.file_id LIMIT $3",
        )
        .bind(after.0.to_owned())
        .bind(after.1.to_owned())
        .bind(i64::from(limit))
        .fetch_all(self.sql.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(UnparsedBranchUpload {
                    namespace: row.try_get("namespace")?,
                    file: BranchFile {
                        branch_id: row.try_get("branch_id")?,
                        file_id: row.try_get("file_id")?,
                        path: row.try_get("path")?,
                        version_id: row.try_get("version_id")?,
                        content_sha256: row.try_get("content_sha256")?,
                        size: row.try_get("size")?,
                        mime: row.try_get("mime")?,
                    },
                    blob_key: row.try_get("blob_key")?,
                })
            })
            .collect()
    }

    /// The tables come with the registry's migrations.
    pub(crate) fn new(sql: SqlStore) -> Self {
        Self { sql }
    }

    /// The readable, visible file versions of `resolved`, by path; at most
    /// `limit` after `after_path` when a limit is given.
    pub(crate) async fn members(
        &self,
        namespace: &str,
        resolved: &Resolved,
        filter: &AccessFilter,
        after_path: &str,
        limit: Option<u32>,
    ) -> Result<Vec<Member>> {
        let predicate = sql_predicate(filter, MEMBER_COLUMNS, 3);
        let after = 3 + predicate.params.len();
        let limit = limit.map(|l| format!(" LIMIT {l}")).unwrap_or_default();
        // Hidden files are never part of a graph or a target listing.
        let sql = format!(
            "SELECT m.file_id, m.path, m.version_id FROM ({}) m WHERE m.hidden = 0 AND {} AND m.path > ${after} ORDER BY m.path{limit}",
            members_sql(resolved),
            predicate.text
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(resolved.key());
        for p in &predicate.params {
            query = query.bind(p);
        }
        let rows = query.bind(after_path).fetch_all(self.sql.pool()).await?;
        rows.iter()
            .map(|r| {
                Ok(Member {
                    file_id: r.try_get("file_id")?,
                    version_id: r.try_get("version_id")?,
                    path: r.try_get("path")?,
                })
            })
            .collect()
    }

    /// How many readable, visible files `resolved` has.
    async fn count_members(
        &self,
        namespace: &str,
        resolved: &Resolved,
        filter: &AccessFilter,
    ) -> Result<i64> {
        let predicate = sql_predicate(filter, MEMBER_COLUMNS, 3);
        let sql = format!(
            "SELECT COUNT(*) AS n FROM ({}) m WHERE m.hidden = 0 AND {}",
            members_sql(resolved),
            predicate.text
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(resolved.key());
        for p in &predicate.params {
            query = query.bind(p);
        }
        Ok(query.fetch_one(self.sql.pool()).await?.try_get("n")?)
    }

    /// A branch by id or name; `changed_files` counts what `filter` (a [`read_filter`])
    /// lets the caller see.
    async fn branch_row(
        &self,
        namespace: &str,
        id_or_name: &str,
        filter: &AccessFilter,
    ) -> Result<Option<Branch>> {
        let predicate = manage_predicate(filter, COUNT_COLUMNS, 3);
        let sql = format!(
            "SELECT {} FROM kg_branches b WHERE b.namespace = $1 AND (b.branch_id = $2 OR b.name = $2)",
            branch_columns(&predicate.text)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(id_or_name);
        for p in &predicate.params {
            query = query.bind(p);
        }
        let row = query.fetch_optional(self.sql.pool()).await?;
        row.as_ref().map(|r| branch_from(r, namespace)).transpose()
    }

    /// A release by id or version; `file_count` counts what `filter` (a [`read_filter`])
    /// lets the caller see.
    async fn release_row(
        &self,
        namespace: &str,
        column: &str,
        key: &str,
        filter: &AccessFilter,
    ) -> Result<Option<Release>> {
        let column = if column == "version" {
            "version"
        } else {
            "release_id"
        };
        let predicate = manage_predicate(filter, COUNT_COLUMNS, 3);
        let sql = format!(
            "SELECT {} FROM kg_releases r WHERE r.namespace = $1 AND r.{column} = $2",
            release_columns(&predicate.text)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(namespace).bind(key);
        for p in &predicate.params {
            query = query.bind(p);
        }
        let row = query.fetch_optional(self.sql.pool()).await?;
        row.as_ref().map(|r| release_from(r, namespace)).transpose()
    }

    async fn environment_row(
        &self,
        namespace: &str,
        column: &str,
        key: &str,
    ) -> Result<Option<Environment>> {
        let column = if column == "name" {
            "name"
        } else {
            "environment_id"
        };
        let sql = format!(
            "SELECT e.environment_id, e.name, e.release_id, e.updated_at_ms, r.version FROM kg_environments e \
             JOIN kg_releases r ON r.release_id = e.release_id WHERE e.namespace = $1 AND e.{column} = $2"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(key)
            .fetch_optional(self.sql.pool())
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let environment_id: String = row.try_get("environment_id")?;
        let history = self.history(&environment_id).await?;
        Ok(Some(Environment {
            namespace: namespace.to_owned(),
            environment_id,
            name: row.try_get("name")?,
            release_id: row.try_get("release_id")?,
            release_version: row.try_get("version")?,
            updated_at_ms: row.try_get("updated_at_ms")?,
            history,
        }))
    }

    async fn history(&self, environment_id: &str) -> Result<Vec<Deployment>> {
        let rows = sqlx::query(
            "SELECT d.release_id, r.version, d.deployed_at_ms, d.deployed_by FROM kg_environment_deploys d \
             JOIN kg_releases r ON r.release_id = d.release_id WHERE d.environment_id = $1 ORDER BY d.seq DESC",
        )
        .bind(environment_id)
        .fetch_all(self.sql.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Deployment {
                    release_id: r.try_get("release_id")?,
                    release_version: r.try_get("version")?,
                    deployed_at_ms: r.try_get("deployed_at_ms")?,
                    deployed_by: r.try_get("deployed_by")?,
                })
            })
            .collect()
    }

    /// Resolves a lookup target; unresolved targets are `TargetNotFound`
    /// naming what was looked up.
    pub(crate) async fn resolve(
        &self,
        namespace: &str,
        target: Option<&LookupTarget>,
    ) -> Result<Resolved> {
        let kind = target.and_then(|t| t.kind.as_ref());
        match kind {
            None => Ok(Resolved::Main),
            Some(lookup_target::Kind::PreviewBranch(b)) => {
                let key = if b.branch_id.is_empty() {
                    &b.branch_name
                } else {
                    &b.branch_id
                };
                if key.is_empty() {
                    return Ok(Resolved::Main);
                }
                // Only the id is used: count nothing.
                let found = self
                    .branch_row(namespace, key, &AccessFilter::default())
                    .await?;
                // An id names a branch by id, a name by name: never cross over.
                let found = found.filter(|br| {
                    if b.branch_id.is_empty() {
                        br.name == b.branch_name
                    } else {
                        br.branch_id == b.branch_id
                    }
                });
                match found {
                    Some(br) => Ok(Resolved::Branch {
                        branch_id: br.branch_id,
                    }),
                    None => Err(FilesError::TargetNotFound(format!(
                        "preview branch `{}` in namespace `{namespace}`",
                        clip(key)
                    ))),
                }
            }
            Some(lookup_target::Kind::Release(r)) => self.resolve_release(namespace, r).await,
            Some(lookup_target::Kind::Environment(e)) => {
                let (column, key) = match &e.selector {
                    Some(environment_target::Selector::EnvironmentId(id)) => ("environment_id", id),
                    Some(environment_target::Selector::EnvironmentName(name)) => ("name", name),
                    None => {
                        return Err(FilesError::Invalid(
                            "an environment target needs environment_id or environment_name"
                                .to_owned(),
                        ));
                    }
                };
                match self.environment_row(namespace, column, key).await? {
                    Some(env) => Ok(Resolved::Release {
                        release_id: env.release_id,
                        version: env.release_version,
                        environment_id: Some(env.environment_id),
                    }),
                    None => Err(FilesError::TargetNotFound(format!(
                        "environment `{}` in namespace `{namespace}`",
                        clip(key)
                    ))),
                }
            }
        }
    }

    async fn resolve_release(&self, namespace: &str, target: &ReleaseTarget) -> Result<Resolved> {
        let (column, key, what) = match &target.selector {
            Some(release_target::Selector::ReleaseId(id)) => ("release_id", id, "release"),
            Some(release_target::Selector::ReleaseVersion(v)) => ("version", v, "release version"),
            None => {
                return Err(FilesError::Invalid(
                    "a release target needs release_id or release_version".to_owned(),
                ));
            }
        };
        // Only the id and version are used: count nothing.
        match self
            .release_row(namespace, column, key, &AccessFilter::default())
            .await?
        {
            Some(r) => Ok(Resolved::Release {
                release_id: r.release_id,
                version: r.version,
                environment_id: None,
            }),
            None => Err(FilesError::TargetNotFound(format!(
                "{what} `{}` in namespace `{namespace}`",
                clip(key)
            ))),
        }
    }
}

/// A looked-up key as shown in an error (bounded).
fn clip(key: &str) -> String {
    key.chars().take(MAX_NAME_LEN).collect()
}

fn require(
    caller: &CallerContext,
    namespace: &str,
    permission: Permission,
) -> Result<AccessFilter> {
    validate_namespace(namespace)?;
    let access = access_for(caller, namespace)?;
    if access.permission < permission as i32 {
        return Err(match permission {
            Permission::Admin => FilesError::AdminDenied(namespace.to_owned()),
            _ => FilesError::WriteDenied(namespace.to_owned()),
        });
    }
    Ok(access.clone())
}

/// Admin of the whole namespace: a release and an environment change what every folder serves,
/// so an admin grant on one folder is not enough.
fn require_namespace_admin(caller: &CallerContext, namespace: &str) -> Result<AccessFilter> {
    let access = require(caller, namespace, Permission::Admin)?;
    if !access.admin_prefixes.iter().any(String::is_empty) {
        return Err(FilesError::AdminDenied(namespace.to_owned()));
    }
    Ok(access)
}

impl FilesService {
    /// Creates a preview branch of main.
    pub async fn create_branch(
        &self,
        caller: &CallerContext,
        namespace: &str,
        name: &str,
    ) -> Result<Branch> {
        require(caller, namespace, Permission::Write)?;
        check_name("branch name", name, &['/'])?;
        // Commands take a branch "id or name", and `main` (or none) means main itself: a
        // branch of either shape would be written to by one command and read past by another.
        if name.eq_ignore_ascii_case("main") {
            return Err(FilesError::Invalid(format!(
                "invalid branch name `{name}`: `main` names the namespace's main line; choose another name"
            )));
        }
        if uuid::Uuid::parse_str(name).is_ok() {
            return Err(FilesError::Invalid(format!(
                "invalid branch name `{name}`: it has the shape of a branch id, which commands would take for one; choose a name that is not a UUID"
            )));
        }
        // Releases and environments start from a branch, and branch uploads need one.
        self.refuse_while_purging(namespace).await?;
        let exists = || {
            FilesError::Exists(format!(
                "branch `{name}` already exists in namespace `{namespace}`"
            ))
        };
        if self
            .versions
            .branch_row(namespace, name, &AccessFilter::default())
            .await?
            .is_some()
        {
            return Err(exists());
        }
        let branch = Branch {
            namespace: namespace.to_owned(),
            branch_id: uuid::Uuid::now_v7().to_string(),
            name: name.to_owned(),
            created_at_ms: now_ms(),
            created_by: caller.principal_id.clone(),
            changed_files: 0,
        };
        // In a transaction like an upload's: a purge committing meanwhile is waited for (the
        // namespace's lock on PostgreSQL) and then seen, so no branch outlives its namespace.
        let mut tx = self.versions.sql.begin_write().await?;
        self.store.hold_namespace(&mut tx, namespace).await?;
        sqlx::query(
            "INSERT INTO kg_branches (branch_id, namespace, name, created_at_ms, created_by) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&branch.branch_id)
        .bind(namespace)
        .bind(name)
        .bind(branch.created_at_ms)
        .bind(&branch.created_by)
        .execute(&mut *tx)
        .await
        // Created by another call since the check above.
        .map_err(|err| match FilesError::from(err) {
            err if err.is_unique_violation() => exists(),
            err => err,
        })?;
        self.store.refuse_if_purging(&mut tx, namespace).await?;
        tx.commit().await?;
        Ok(branch)
    }

    /// The namespace's preview branches, by name.
    pub async fn list_branches(
        &self,
        caller: &CallerContext,
        namespace: &str,
    ) -> Result<Vec<Branch>> {
        let access = require(caller, namespace, Permission::Read)?;
        let predicate = manage_predicate(&read_filter(&access), COUNT_COLUMNS, 2);
        let sql = format!(
            "SELECT {} FROM kg_branches b WHERE b.namespace = $1 ORDER BY b.name",
            branch_columns(&predicate.text)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(namespace);
        for p in &predicate.params {
            query = query.bind(p);
        }
        let rows = query.fetch_all(self.versions.sql.pool()).await?;
        rows.iter().map(|r| branch_from(r, namespace)).collect()
    }

    /// Stores `content` at `path` on a preview branch; main keeps its version.
    /// A path that exists on main keeps its file id, so the branch overrides it.
    pub async fn upload_to_branch(
        &self,
        caller: &CallerContext,
        namespace: &str,
        branch: &str,
        path: &str,
        content: &[u8],
        mime: &str,
    ) -> Result<BranchFile> {
        validate_namespace(namespace)?;
        let path = normalize_path(path)?;
        let access = Self::writable(caller, namespace, &path)?;
        if content.len() > self.max_upload_bytes {
            return Err(FilesError::TooLarge {
                size: content.len(),
                limit: self.max_upload_bytes,
            });
        }
        let Some(branch) = self
            .versions
            .branch_row(namespace, branch, &AccessFilter::default())
            .await?
        else {
            return Err(FilesError::TargetNotFound(format!(
                "preview branch `{}` in namespace `{namespace}`",
                clip(branch)
            )));
        };
        // Two uploads of one path new to the branch at once make a file id each, and the
        // second breaks UNIQUE(branch_id, path): it reads again and joins the first's id.
        let (file, blob_key) = retry_lost_race(|| {
            self.store_branch_file(access, namespace, &branch.branch_id, &path, content, mime)
        })
        .await?;
        let msg_id = format!("{}:{}:branch", file.branch_id, file.version_id);
        if let Err(err) = self
            .publish_branch_upload(namespace, &file, &blob_key, &msg_id)
            .await
        {
            // Stored, but without a title and links until uploaded again: say so, as a main
            // upload does (a retry within the dedupe window is not dropped: nothing was queued).
            tracing::error!(error = %err.detail(), path = %file.path, "could not publish branch upload");
            return Err(FilesError::QueueUnavailable);
        }
        Ok(file)
    }

    /// Queues a branch upload for parsing. The indexer parses branch uploads for metadata and
    /// links only (never the graph, which holds main) and reports them per version id like
    /// any FileIndexed.
    pub(crate) async fn publish_branch_upload(
        &self,
        namespace: &str,
        file: &BranchFile,
        blob_key: &str,
        msg_id: &str,
    ) -> std::result::Result<(), kg_stores::StoreError> {
        let event = kg_proto::v1::FileChanged {
            namespace: namespace.to_owned(),
            file_id: file.file_id.clone(),
            version_id: file.version_id.clone(),
            path: file.path.clone(),
            mime: file.mime.clone(),
            blob_key: blob_key.to_owned(),
            content_sha256: file.content_sha256.clone(),
            size: file.size,
            op: kg_proto::v1::FileChangeOp::Upsert as i32,
            enabled: true,
            hidden: false,
            changed_at_ms: now_ms(),
            requeued: false,
            flags_version: 0,
            rebuild_at_ms: 0,
        };
        let subject = format!("kg.files.v1.{namespace}.branch");
        kg_stores::events::publish(
            &self.jetstream,
            &subject,
            msg_id,
            prost::Message::encode_to_vec(&event),
        )
        .await
    }

    /// One try at storing a branch upload; the file and its blob's key.
    async fn store_branch_file(
        &self,
        access: &AccessFilter,
        namespace: &str,
        branch_id: &str,
        path: &str,
        content: &[u8],
        mime: &str,
    ) -> Result<(BranchFile, String)> {
        let pool = self.versions.sql.pool();
        let on_branch = sqlx::query(
            "SELECT b.file_id, COALESCE(f.hidden, 0) AS hidden FROM kg_branch_files b \
             LEFT JOIN kg_files f ON f.file_id = b.file_id WHERE b.branch_id = $1 AND b.path = $2",
        )
        .bind(branch_id)
        .bind(path)
        .fetch_optional(pool)
        .await?;
        let existing = match on_branch {
            Some(row) => Some((
                row.try_get::<String, _>("file_id")?,
                row.try_get::<i64, _>("hidden")? != 0,
            )),
            None => self
                .store
                .by_path_unfiltered(namespace, path)
                .await?
                .map(|main| (main.file_id, main.hidden)),
        };
        // The upload answers with the file id: never one of a file the caller may not see.
        let file_id = match existing {
            Some((file_id, hidden)) => {
                Self::may_overwrite(access, namespace, &file_id, hidden)?;
                file_id
            }
            None => uuid::Uuid::now_v7().to_string(),
        };
        let content_sha256 = hex::encode(Sha256::digest(content));
        let blob_key = self.blobs.put(content).await?;
        let file = BranchFile {
            branch_id: branch_id.to_owned(),
            version_id: version_id(&file_id, &content_sha256),
            file_id,
            path: path.to_owned(),
            content_sha256,
            size: i64::try_from(content.len()).unwrap_or(i64::MAX),
            mime: guess_mime(path, mime),
        };
        // One upsert: a delete and an insert would let two uploads of the file at once both
        // find nothing to delete and then break the key.
        sqlx::query(
            "INSERT INTO kg_branch_files (branch_id, file_id, path, version_id, content_sha256, blob_key, size, mime, deleted, updated_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, $9) \
             ON CONFLICT (branch_id, file_id) DO UPDATE SET path = excluded.path, version_id = excluded.version_id, \
             content_sha256 = excluded.content_sha256, blob_key = excluded.blob_key, size = excluded.size, \
             mime = excluded.mime, deleted = 0, updated_at_ms = excluded.updated_at_ms",
        )
        .bind(&file.branch_id)
        .bind(&file.file_id)
        .bind(&file.path)
        .bind(&file.version_id)
        .bind(&file.content_sha256)
        .bind(&blob_key)
        .bind(file.size)
        .bind(&file.mime)
        .bind(now_ms())
        .execute(pool)
        .await?;
        Ok((file, blob_key))
    }

    /// Cuts an immutable release: a snapshot of every file version of a
    /// branch (main when `branch` is empty). Nothing is re-indexed.
    pub async fn create_release(
        &self,
        caller: &CallerContext,
        namespace: &str,
        version: &str,
        branch: &str,
        note: &str,
    ) -> Result<Release> {
        let access = require_namespace_admin(caller, namespace)?;
        let counted = read_filter(&access);
        check_name("release version", version, &['+'])?;
        let resolved = if branch.is_empty() || branch == "main" {
            Resolved::Main
        } else {
            match self
                .versions
                .branch_row(namespace, branch, &AccessFilter::default())
                .await?
            {
                Some(b) => Resolved::Branch {
                    branch_id: b.branch_id,
                },
                None => {
                    return Err(FilesError::TargetNotFound(format!(
                        "preview branch `{}` in namespace `{namespace}`",
                        clip(branch)
                    )));
                }
            }
        };
        if self
            .versions
            .release_row(namespace, "version", version, &AccessFilter::default())
            .await?
            .is_some()
        {
            return Err(release_exists(namespace, version));
        }
        let release_id = uuid::Uuid::now_v7().to_string();
        let now = now_ms();
        let note: String = note.chars().take(4096).collect();
        let pool = self.versions.sql.pool();
        let mut tx = pool.begin().await?;
        // Like an upload's: a prune of unnamed versions waits for the snapshot to commit, and a
        // snapshot taken after one sees what it left.
        self.store.hold_namespace(&mut tx, namespace).await?;
        sqlx::query(
            "INSERT INTO kg_releases (release_id, namespace, version, branch_id, note, created_at_ms, created_by) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&release_id)
        .bind(namespace)
        .bind(version)
        .bind(resolved.key())
        .bind(&note)
        .bind(now)
        .bind(&caller.principal_id)
        .execute(&mut *tx)
        .await
        // Created by another call since the check above.
        .map_err(|err| match FilesError::from(err) {
            err if err.is_unique_violation() => release_exists(namespace, version),
            err => err,
        })?;
        let snapshot = format!(
            "INSERT INTO kg_release_files (release_id, file_id, path, version_id) SELECT $3, m.file_id, m.path, m.version_id FROM ({}) m",
            members_sql(&resolved)
        );
        sqlx::query(AssertSqlSafe(snapshot))
            .bind(namespace)
            .bind(resolved.key())
            .bind(&release_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.versions
            .release_row(namespace, "release_id", &release_id, &counted)
            .await?
            .ok_or_else(|| FilesError::Engine("release vanished after insert".to_owned()))
    }

    /// The namespace's releases, newest first.
    pub async fn list_releases(
        &self,
        caller: &CallerContext,
        namespace: &str,
    ) -> Result<Vec<Release>> {
        let access = require(caller, namespace, Permission::Read)?;
        let predicate = manage_predicate(&read_filter(&access), COUNT_COLUMNS, 2);
        let sql = format!(
            "SELECT {} FROM kg_releases r WHERE r.namespace = $1 ORDER BY r.created_at_ms DESC, r.release_id DESC",
            release_columns(&predicate.text)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(namespace);
        for p in &predicate.params {
            query = query.bind(p);
        }
        let rows = query.fetch_all(self.versions.sql.pool()).await?;
        rows.iter().map(|r| release_from(r, namespace)).collect()
    }

    /// Points `environment` (created on first deploy) at a release and
    /// records the deployment.
    pub async fn deploy_environment(
        &self,
        caller: &CallerContext,
        namespace: &str,
        environment: &str,
        release: &ReleaseTarget,
    ) -> Result<Environment> {
        require_namespace_admin(caller, namespace)?;
        check_name("environment name", environment, &[])?;
        let Resolved::Release { release_id, .. } =
            self.versions.resolve_release(namespace, release).await?
        else {
            return Err(FilesError::Engine(
                "a release resolved to a branch".to_owned(),
            ));
        };
        // Deploys of one environment at once race for its row (first deploy) and for the next
        // history number; the one that loses reads again and lands after the other.
        let environment_id =
            retry_lost_race(|| self.record_deploy(caller, namespace, environment, &release_id))
                .await?;
        self.versions
            .environment_row(namespace, "environment_id", &environment_id)
            .await?
            .ok_or_else(|| FilesError::Engine("environment vanished after deploy".to_owned()))
    }

    /// One try at pointing `environment` at `release_id` and numbering the deploy; returns
    /// the environment's id.
    async fn record_deploy(
        &self,
        caller: &CallerContext,
        namespace: &str,
        environment: &str,
        release_id: &str,
    ) -> Result<String> {
        let now = now_ms();
        let pool = self.versions.sql.pool();
        let mut tx = pool.begin().await?;
        // Writes first: on SQLite a transaction that read first cannot write once another
        // writer committed (SQLITE_BUSY_SNAPSHOT), while one that writes first waits its turn.
        let moved = sqlx::query(
            "UPDATE kg_environments SET release_id = $1, updated_at_ms = $2 WHERE namespace = $3 AND name = $4",
        )
        .bind(release_id)
        .bind(now)
        .bind(namespace)
        .bind(environment)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() == 0 {
            sqlx::query(
                "INSERT INTO kg_environments (environment_id, namespace, name, release_id, updated_at_ms) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(uuid::Uuid::now_v7().to_string())
            .bind(namespace)
            .bind(environment)
            .bind(release_id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        let environment_id: String = sqlx::query(
            "SELECT environment_id FROM kg_environments WHERE namespace = $1 AND name = $2",
        )
        .bind(namespace)
        .bind(environment)
        .fetch_one(&mut *tx)
        .await?
        .try_get("environment_id")?;
        // Numbered in the same statement, so two deploys cannot take one number unnoticed
        // (PostgreSQL: the second breaks the key and the deploy retries).
        sqlx::query(
            "INSERT INTO kg_environment_deploys (environment_id, seq, release_id, deployed_at_ms, deployed_by) \
             SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4 FROM kg_environment_deploys WHERE environment_id = $1",
        )
        .bind(&environment_id)
        .bind(release_id)
        .bind(now)
        .bind(&caller.principal_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(environment_id)
    }

    /// The namespace's environments with their deploy history, by name.
    pub async fn list_environments(
        &self,
        caller: &CallerContext,
        namespace: &str,
    ) -> Result<Vec<Environment>> {
        require(caller, namespace, Permission::Read)?;
        let rows =
            sqlx::query("SELECT name FROM kg_environments WHERE namespace = $1 ORDER BY name")
                .bind(namespace)
                .fetch_all(self.versions.sql.pool())
                .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let name: String = row.try_get("name")?;
            if let Some(env) = self
                .versions
                .environment_row(namespace, "name", &name)
                .await?
            {
                out.push(env);
            }
        }
        Ok(out)
    }

    /// The readable file versions a lookup target selects, a page by path.
    pub async fn resolve_target(
        &self,
        caller: &CallerContext,
        namespace: &str,
        target: Option<&LookupTarget>,
        limit: u32,
        after_path: &str,
    ) -> Result<ResolveTargetResponse> {
        let access = require(caller, namespace, Permission::Read)?;
        let limit = match limit {
            0 => DEFAULT_RESOLVE_PAGE,
            n if n > MAX_RESOLVE_PAGE => {
                return Err(FilesError::Invalid(format!(
                    "limit {n} is over the maximum of {MAX_RESOLVE_PAGE}"
                )));
            }
            n => n,
        };
        let resolved = self.versions.resolve(namespace, target).await?;
        let files = self
            .versions
            .members(namespace, &resolved, &access, after_path, Some(limit))
            .await?;
        let total = self
            .versions
            .count_members(namespace, &resolved, &access)
            .await?;
        let next_after_path = if files.len() == limit as usize {
            files.last().map(|m| m.path.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        let mut out = ResolveTargetResponse {
            kind: resolved.kind().to_owned(),
            files: files
                .into_iter()
                .map(|m| TargetFile {
                    file_id: m.file_id,
                    version_id: m.version_id,
                    path: m.path,
                })
                .collect(),
            next_after_path,
            total,
            ..Default::default()
        };
        match resolved {
            Resolved::Main => {}
            Resolved::Branch { branch_id } => out.branch_id = branch_id,
            Resolved::Release {
                release_id,
                version,
                environment_id,
            } => {
                out.release_id = release_id;
                out.release_version = version;
                out.environment_id = environment_id.unwrap_or_default();
            }
        }
        Ok(out)
    }
}

fn release_exists(namespace: &str, version: &str) -> FilesError {
    FilesError::Exists(format!(
        "release `{version}` already exists in namespace `{namespace}`; releases are immutable, pick a new version"
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("release version", "v1.2.0", &['+']).is_ok());
        assert!(check_name("release version", "v1.2.0+build.5", &['+']).is_ok());
        assert!(check_name("branch name", "feature/links", &['/']).is_ok());
        assert!(check_name("environment name", "prod/eu", &[]).is_err());
        assert!(check_name("environment name", "", &[]).is_err());
        assert!(check_name("environment name", &"a".repeat(256), &[]).is_err());
        for refused in [
            "../evil",
            "feature/../main",
            "feature//x",
            "/main",
            "main/",
            ".hidden",
            "-f",
        ] {
            let err = check_name("branch name", refused, &['/']).unwrap_err();
            assert!(
                err.to_string().contains("starting with a letter or digit"),
                "{err}"
            );
        }
        assert!(check_name("release version", "1.0.0-rc.1", &['+']).is_ok());
        let err = check_name("release version", "v 1", &['+']).unwrap_err();
        assert!(err.to_string().contains("`+`"), "{err}");
    }
}
