//! Metadata and links per file version, as the indexer reports them in `FileIndexed`.
//!
//! Stored once per `version_id` (versions are content-addressed, so a branch or release that
//! pins a version reuses its rows). Broken-ness of an internal link is not stored: it depends
//! on which files exist in the branch or release being read, so [`LivePaths::resolve`] decides
//! it when the link graph is built.

use std::collections::{HashMap, HashSet};

use kg_proto::v1::{FileIndexed, FileStatus, VersionLink, VersionLinkKind, VersionLinkSyntax};
use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row as _};

use crate::error::Result;
use crate::service::FilesService;

/// Link rows per INSERT statement (8 binds each: far below SQLite's and PostgreSQL's limits).
const INSERT_BATCH: usize = 100;
/// Version ids per SELECT.
const SELECT_BATCH: usize = 200;

/// Where a stored link points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// A namespace path (`target_path`); broken or not is decided by [`LivePaths::resolve`].
    Internal,
    /// A URL.
    External,
    /// Cannot name any file (escapes the root, empty, script/data URL): always broken.
    Invalid,
}

impl LinkKind {
    fn as_str(self) -> &'static str {
        match self {
            LinkKind::Internal => "internal",
            LinkKind::External => "external",
            LinkKind::Invalid => "invalid",
        }
    }

    fn parse(s: &str) -> LinkKind {
        match s {
            "internal" => LinkKind::Internal,
            "external" => LinkKind::External,
            _ => LinkKind::Invalid,
        }
    }
}

/// How the link was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkSyntax {
    /// `[text](target)` or `<a href>`.
    Link,
    /// `![alt](src)` or `<img src>`.
    Image,
    /// `[[Page]]`.
    Wiki,
}

impl LinkSyntax {
    fn as_str(self) -> &'static str {
        match self {
            LinkSyntax::Link => "link",
            LinkSyntax::Image => "image",
            LinkSyntax::Wiki => "wiki",
        }
    }

    fn parse(s: &str) -> LinkSyntax {
        match s {
            "image" => LinkSyntax::Image,
            "wiki" => LinkSyntax::Wiki,
            _ => LinkSyntax::Link,
        }
    }
}

/// Metadata of one file version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionMetadata {
    pub version_id: String,
    pub namespace: String,
    pub file_id: String,
    /// The file's path when its links were resolved.
    pub source_path: String,
    pub title: Option<String>,
    pub doc_type: Option<String>,
    pub tags: Vec<String>,
    /// `YYYY-MM-DD`.
    pub document_date: Option<String>,
    pub effective_from: Option<String>,
    pub effective_to: Option<String>,
    pub collections: Vec<String>,
    /// Links the indexer could not carry (its event size cap); the graph is partial when > 0.
    pub links_omitted: u32,
}

/// One link of a file version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionLinkRecord {
    /// Position among the document's links (the edge `ordinal`).
    pub ordinal: u32,
    pub kind: LinkKind,
    pub syntax: LinkSyntax,
    /// Internal: normalised path; external: the URL; invalid: empty.
    pub target_path: String,
    /// The destination as written.
    pub raw_target: String,
    pub fragment: Option<String>,
    pub label: String,
}

/// A version's metadata with its links in ordinal order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionLinks {
    pub meta: VersionMetadata,
    pub links: Vec<VersionLinkRecord>,
}

/// What a link means against a set of live files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkResolution {
    /// An edge to the live file at this path.
    File(String),
    /// An external URL.
    External(String),
    /// An internal target that names no live file, or an invalid one.
    Broken,
}

/// The paths of the files visible in the branch or release being read, for resolving links.
#[derive(Debug, Clone, Default)]
pub struct LivePaths {
    paths: HashSet<String>,
    /// Lowercased file name without `.md` -> paths, for wiki links written by name only.
    by_stem: HashMap<String, Vec<String>>,
}

impl LivePaths {
    pub fn new(paths: impl IntoIterator<Item = String>) -> Self {
        let mut live = LivePaths::default();
        for path in paths {
            let name = path.rsplit('/').next().unwrap_or(&path);
            let stem = name.strip_suffix(".md").unwrap_or(name).to_lowercase();
            live.by_stem.entry(stem).or_default().push(path.clone());
            live.paths.insert(path);
        }
        live
    }

    /// Resolves `link`: the target path itself; for a folder link (`guide/`) its `index.md`
    /// or `README.md`; for an extensionless target (`setup`, `[[Setup]]`) `setup.md` or
    /// `setup/index.md`; for a wiki link the one live file with that name anywhere (two or
    /// more such files: broken, as it is ambiguous). Anything else is broken.
    pub fn resolve(&self, link: &VersionLinkRecord) -> LinkResolution {
        match link.kind {
            LinkKind::External => return LinkResolution::External(link.target_path.clone()),
            LinkKind::Invalid => return LinkResolution::Broken,
            LinkKind::Internal => {}
        }
        let target = link.target_path.as_str();
        let candidates: Vec<String> = if let Some(folder) = target.strip_suffix('/') {
            vec![format!("{folder}/index.md"), format!("{folder}/README.md")]
        } else {
            let name = target.rsplit('/').next().unwrap_or(target);
            let mut c = vec![target.to_owned()];
            if !name.contains('.') {
                c.push(format!("{target}.md"));
                c.push(format!("{target}/index.md"));
            }
            c
        };
        if let Some(hit) = candidates.into_iter().find(|c| self.paths.contains(c)) {
            return LinkResolution::File(hit);
        }
        if link.syntax == LinkSyntax::Wiki {
            let name = target.rsplit('/').next().unwrap_or(target);
            let stem = name.strip_suffix(".md").unwrap_or(name).to_lowercase();
            if let Some([only]) = self.by_stem.get(&stem).map(Vec::as_slice) {
                return LinkResolution::File(only.clone());
            }
        }
        LinkResolution::Broken
    }
}

fn none_if_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn json_list(items: &[String]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_owned())
}

fn parse_list(s: &str) -> Vec<String> {
    serde_json::from_str(s).unwrap_or_default()
}

fn meta_from(row: &AnyRow) -> Result<VersionMetadata> {
    Ok(VersionMetadata {
        version_id: row.try_get("version_id")?,
        namespace: row.try_get("namespace")?,
        file_id: row.try_get("file_id")?,
        source_path: row.try_get("source_path")?,
        title: none_if_empty(row.try_get("title")?),
        doc_type: none_if_empty(row.try_get("doc_type")?),
        tags: parse_list(&row.try_get::<String, _>("tags")?),
        document_date: none_if_empty(row.try_get("document_date")?),
        effective_from: none_if_empty(row.try_get("effective_from")?),
        effective_to: none_if_empty(row.try_get("effective_to")?),
        collections: parse_list(&row.try_get::<String, _>("collections")?),
        links_omitted: u32::try_from(row.try_get::<i64, _>("links_omitted")?).unwrap_or(u32::MAX),
    })
}

fn link_from(row: &AnyRow) -> Result<(String, VersionLinkRecord)> {
    Ok((
        row.try_get("version_id")?,
        VersionLinkRecord {
            ordinal: u32::try_from(row.try_get::<i64, _>("ordinal")?).unwrap_or(u32::MAX),
            kind: LinkKind::parse(&row.try_get::<String, _>("kind")?),
            syntax: LinkSyntax::parse(&row.try_get::<String, _>("syntax")?),
            target_path: row.try_get("target_path")?,
            raw_target: row.try_get("raw_target")?,
            fragment: none_if_empty(row.try_get("fragment")?),
            label: row.try_get("label")?,
        },
    ))
}

fn link_record(link: &VersionLink) -> VersionLinkRecord {
    VersionLinkRecord {
        ordinal: link.ordinal,
        kind: match link.kind() {
            VersionLinkKind::Internal => LinkKind::Internal,
            VersionLinkKind::External => LinkKind::External,
            VersionLinkKind::Invalid | VersionLinkKind::Unspecified => LinkKind::Invalid,
        },
        syntax: match link.syntax() {
            VersionLinkSyntax::Image => LinkSyntax::Image,
            VersionLinkSyntax::Wiki => LinkSyntax::Wiki,
            VersionLinkSyntax::Link | VersionLinkSyntax::Unspecified => LinkSyntax::Link,
        },
        target_path: link.target_path.clone(),
        raw_target: link.raw_target.clone(),
        fragment: none_if_empty(link.fragment.clone()),
        label: link.label.clone(),
    }
}

/// `$from, $from+1, ...`: `count` numbered placeholders.
pub(crate) fn placeholders(from: usize, count: usize) -> String {
    (from..from + count)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl FilesService {
    /// Stores the metadata and links an INDEXED event carries for its version, replacing any
    /// earlier rows of that version (a re-index after an indexer upgrade). Other events, and
    /// events from indexers that send no metadata, store nothing. Returns whether it stored.
    pub async fn store_version_links(&self, event: &FileIndexed) -> Result<bool> {
        if event.status != FileStatus::Indexed as i32 || event.version_id.is_empty() {
            return Ok(false);
        }
        let Some(meta) = &event.meta else {
            return Ok(false);
        };
        let mut links: Vec<VersionLinkRecord> = event.links.iter().map(link_record).collect();
        links.sort_by_key(|l| l.ordinal);
        links.dedup_by_key(|l| l.ordinal);

        let mut tx = self.store.sql().begin_write().await?;
        sqlx::query("DELETE FROM kg_file_version_links WHERE version_id = $1")
            .bind(&event.version_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM kg_file_version_meta WHERE version_id = $1")
            .bind(&event.version_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO kg_file_version_meta (version_id, namespace, file_id, source_path, title, doc_type, tags, collections, document_date, effective_from, effective_to, link_count, links_omitted, indexed_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        )
        .bind(&event.version_id)
        .bind(&event.namespace)
        .bind(&event.file_id)
        .bind(&meta.source_path)
        .bind(&meta.title)
        .bind(&meta.doc_type)
        .bind(json_list(&meta.tags))
        .bind(json_list(&meta.collections))
        .bind(&meta.document_date)
        .bind(&meta.effective_from)
        .bind(&meta.effective_to)
        .bind(i64::try_from(links.len()).unwrap_or(i64::MAX))
        .bind(i64::from(meta.links_omitted))
        .bind(event.indexed_at_ms)
        .execute(&mut *tx)
        .await?;
        for batch in links.chunks(INSERT_BATCH) {
            let values: Vec<String> = (0..batch.len())
                .map(|i| format!("({})", placeholders(i * 8 + 1, 8)))
                .collect();
            let sql = format!(
                "INSERT INTO kg_file_version_links (version_id, ordinal, kind, syntax, target_path, raw_target, fragment, label) VALUES {}",
                values.join(", ")
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for link in batch {
                query = query
                    .bind(&event.version_id)
                    .bind(i64::from(link.ordinal))
                    .bind(link.kind.as_str())
                    .bind(link.syntax.as_str())
                    .bind(&link.target_path)
                    .bind(&link.raw_target)
                    .bind(link.fragment.clone().unwrap_or_default())
                    .bind(&link.label);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Metadata and ordered links of each of `version_ids` that has been indexed, in the order
    /// asked (unknown or never-indexed versions are left out). No access check: the caller
    /// (the link-graph reader) passes only versions it has already filtered for the caller,
    /// and must still filter link targets the same way.
    pub async fn version_links(&self, version_ids: &[String]) -> Result<Vec<VersionLinks>> {
        let mut metas: HashMap<String, VersionMetadata> = HashMap::new();
        let mut links: HashMap<String, Vec<VersionLinkRecord>> = HashMap::new();
        let mut unique: Vec<&String> = version_ids.iter().collect();
        unique.sort();
        unique.dedup();
        let pool = self.store.sql().pool();
        for batch in unique.chunks(SELECT_BATCH) {
            let marks = placeholders(1, batch.len());
            let meta_sql = format!(
                "SELECT version_id, namespace, file_id, source_path, title, doc_type, tags, collections, document_date, effective_from, effective_to, links_omitted \
                 FROM kg_file_version_meta WHERE version_id IN ({marks})"
            );
            let mut query = sqlx::query(AssertSqlSafe(meta_sql));
            for id in batch {
                query = query.bind(id.as_str());
            }
            for row in query.fetch_all(pool).await? {
                let meta = meta_from(&row)?;
                metas.insert(meta.version_id.clone(), meta);
            }
            let link_sql = format!(
                "SELECT version_id, ordinal, kind, syntax, target_path, raw_target, fragment, label \
                 FROM kg_file_version_links WHERE version_id IN ({marks}) ORDER BY version_id, ordinal"
            );
            let mut query = sqlx::query(AssertSqlSafe(link_sql));
            for id in batch {
                query = query.bind(id.as_str());
            }
            for row in query.fetch_all(pool).await? {
                let (version_id, link) = link_from(&row)?;
                links.entry(version_id).or_default().push(link);
            }
        }
        let mut seen = HashSet::new();
        Ok(version_ids
            .iter()
            .filter(|id| seen.insert(id.as_str()))
            .filter_map(|id| {
                let meta = metas.remove(id)?;
                Some(VersionLinks {
                    links: links.remove(id).unwrap_or_default(),
                    meta,
                })
            })
            .collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn link(kind: LinkKind, syntax: LinkSyntax, target: &str) -> VersionLinkRecord {
        VersionLinkRecord {
            ordinal: 0,
            kind,
            syntax,
            target_path: target.into(),
            raw_target: target.into(),
            fragment: None,
            label: String::new(),
        }
    }

    #[test]
    fn links_resolve_against_the_live_files() {
        let live = LivePaths::new(
            [
                "docs/setup.md",
                "docs/guide/index.md",
                "ops/Glossary.md",
                "a/Dup.md",
                "b/dup.md",
                "img/d.png",
            ]
            .map(String::from),
        );
        use LinkKind::*;
        use LinkSyntax::*;
        let cases = [
            (
                Internal,
                Link,
                "docs/setup.md",
                LinkResolution::File("docs/setup.md".into()),
            ),
            (
                Internal,
                Link,
                "docs/setup",
                LinkResolution::File("docs/setup.md".into()),
            ),
            (
                Internal,
                Link,
                "docs/guide/",
                LinkResolution::File("docs/guide/index.md".into()),
            ),
            (
                Internal,
                Link,
                "docs/guide",
                LinkResolution::File("docs/guide/index.md".into()),
            ),
            (
                Internal,
                Image,
                "img/d.png",
                LinkResolution::File("img/d.png".into()),
            ),
            (
                Internal,
                Wiki,
                "docs/Glossary",
                LinkResolution::File("ops/Glossary.md".into()),
            ),
            (Internal, Link, "docs/Glossary", LinkResolution::Broken),
            (Internal, Wiki, "docs/dup", LinkResolution::Broken),
            (Internal, Link, "docs/missing.md", LinkResolution::Broken),
            (Invalid, Link, "", LinkResolution::Broken),
            (
                External,
                Link,
                "https://x.example",
                LinkResolution::External("https://x.example".into()),
            ),
        ];
        for (kind, syntax, target, want) in cases {
            assert_eq!(live.resolve(&link(kind, syntax, target)), want, "{target}");
        }
    }
}
