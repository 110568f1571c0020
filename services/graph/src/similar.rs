//! Similar files: neighbours of a file by its file-level vector (the normalised mean of its
//! chunk vectors, written by the indexer), for `similarFiles` in packages and the `similar`
//! hop. The vector index applies the caller's access filter, narrowed to enabled files,
//! inside the engine, to the source file and to every candidate; the hop's first chunks are
//! then read from the graph under the chunk predicate.

use std::collections::HashMap;

use kg_proto::v1::{AccessFilter, ChunkPackage, ListCounts, SimilarFile};
use kg_stores::vector::{Scope as VectorScope, VectorHit, VectorIndex};
use serde_json::Value;

use crate::error::{GraphError, Result};
use crate::packages::note_count;
use crate::rows::Row;
use crate::service::{GraphService, Node, Query, Scope};

/// Similar-file candidates asked for per hop package, so that files the graph no longer
/// holds (a stale point) do not leave the hop short.
const HOP_SLACK: usize = 2;

/// Similar files of one file: the list clipped at the cap, and the total before clipping.
pub(crate) type SimilarList = (u64, Vec<SimilarFile>);

/// The caller's access narrowed to enabled files: a disabled file is never similar.
fn enabled(access: &AccessFilter) -> AccessFilter {
    AccessFilter {
        enabled_only: true,
        ..access.clone()
    }
}

/// The `limit` files nearest to `file_id` that `access` admits (enabled only), plus how
/// many such files there are to rank (the total of the list). `Ok(None)` when the file has
/// no file vector `access` admits. Owned arguments: packages run one per file concurrently.
async fn nearest_files(
    index: VectorIndex,
    access: AccessFilter,
    file_id: String,
    limit: usize,
) -> Result<Option<(u64, Vec<VectorHit>)>> {
    let Some((clipped, hits)) = nearest_clipped(&index, &access, &file_id, limit).await? else {
        return Ok(None);
    };
    let total = if clipped {
        rankable_files(&index, &access).await?
    } else {
        hits.len() as u64
    };
    Ok(Some((total, hits)))
}

/// The `limit` nearest files as in [`nearest_files`], and whether there were more.
async fn nearest_clipped(
    index: &VectorIndex,
    access: &AccessFilter,
    file_id: &str,
    limit: usize,
) -> Result<Option<(bool, Vec<VectorHit>)>> {
    let access = enabled(access);
    // One more than asked tells whether the list is clipped without counting.
    let Some(mut hits) = index
        .similar_files(
            &access,
            &VectorScope::files(),
            &access.namespace,
            file_id,
            limit + 1,
        )
        .await?
    else {
        return Ok(None);
    };
    let clipped = hits.len() > limit;
    hits.truncate(limit);
    Ok(Some((clipped, hits)))
}

/// How many files a file's similar list ranks: every file point `access` admits (enabled
/// only) but the file's own, which `access` admits too, or it would have no list. The same
/// for every file of a caller, so a set of packages counts once.
async fn rankable_files(index: &VectorIndex, access: &AccessFilter) -> Result<u64> {
    let admitted = index.count(&enabled(access), &VectorScope::files()).await?;
    Ok(admitted.saturating_sub(1))
}

fn similar_list(hits: Vec<VectorHit>) -> Vec<SimilarFile> {
    hits.into_iter()
        .map(|h| SimilarFile {
            file_id: h.file_id,
            path: h.path,
            score: f64::from(h.score),
        })
        .collect()
}

impl GraphService {
    /// `similarFiles` for the files of a set of packages, capped at `cap` each, one
    /// concurrent lookup per distinct file. Empty when the process has no vector index. A
    /// failing index leaves the lists empty and is logged: similar files are an extra, and
    /// the packages themselves are still right.
    pub(crate) async fn similar_lists(
        &self,
        scope: &Scope<'_>,
        file_ids: &[&str],
        cap: usize,
    ) -> HashMap<String, SimilarList> {
        let mut out = HashMap::new();
        let Some(index) = &self.vectors else {
            return out;
        };
        let mut distinct: Vec<&str> = file_ids.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let mut lookups = tokio::task::JoinSet::new();
        for file_id in distinct {
            let (index, access, file_id) =
                (index.clone(), scope.access.clone(), file_id.to_owned());
            lookups.spawn(async move {
                let found = nearest_clipped(&index, &access, &file_id, cap).await;
                (file_id, found)
            });
        }
        let mut clipped_lists: Vec<(String, Vec<VectorHit>)> = Vec::new();
        while let Some(joined) = lookups.join_next().await {
            match joined {
                Ok((file_id, Ok(Some((clipped, hits))))) => {
                    if clipped {
                        clipped_lists.push((file_id, hits));
                    } else {
                        out.insert(file_id, (hits.len() as u64, similar_list(hits)));
                    }
                }
                Ok((_, Ok(None))) => {}
                Ok((file_id, Err(err))) => {
                    tracing::warn!(
                        namespace = scope.namespace,
                        file_id,
                        error = %err,
                        "similar files left empty: the vector index failed"
                    );
                }
                Err(err) => {
                    tracing::warn!(error = %err, "similar files lookup task failed");
                }
            }
        }
        if !clipped_lists.is_empty() {
            match rankable_files(index, scope.access).await {
                Ok(total) => {
                    for (file_id, hits) in clipped_lists {
                        out.insert(file_id, (total, similar_list(hits)));
                    }
                }
                Err(err) => {
                    tracing::warn!(
                        namespace = scope.namespace,
                        error = %err,
                        "similar files left empty: the vector index failed"
                    );
                }
            }
        }
        out
    }

    /// The first readable chunk of each of the files most similar to `file_id`, best file
    /// first, at most `limit`; the total is the number of readable files ranked.
    pub(crate) async fn similar_first_chunks(
        &self,
        scope: &Scope<'_>,
        file_id: &str,
        limit: usize,
    ) -> Result<(u64, Vec<String>)> {
        let Some(index) = &self.vectors else {
            return Err(GraphError::Unavailable(
                "kind similar is not available: this deployment runs without embeddings, so \
                 files have no vectors; use kind mentions or rel, or kg_search with the chunk \
                 text"
                    .to_owned(),
            ));
        };
        let wanted = limit.saturating_mul(HOP_SLACK).max(limit);
        let found = nearest_files(
            index.clone(),
            scope.access.clone(),
            file_id.to_owned(),
            wanted,
        )
        .await?;
        let Some((total, hits)) = found else {
            return Err(GraphError::Unavailable(
                "kind similar is not available for this chunk: its file has no file vector \
                 (indexed before embeddings were enabled, or disabled); reprocess the file, or \
                 use kind mentions or rel"
                    .to_owned(),
            ));
        };
        if hits.is_empty() || limit == 0 {
            return Ok((total, Vec::new()));
        }
        let mut q = Query::new();
        let pc = q.access(scope.access, "c", Node::Content);
        q.param(
            "files",
            hits.iter()
                .map(|h| Value::from(h.file_id.as_str()))
                .collect::<Vec<_>>(),
        );
        q.set_text(format!(
            "UNWIND $files AS fid \
             MATCH (c:Chunk {{fileId: fid}}) WHERE c.enabled = true AND {pc} \
             WITH fid, c ORDER BY c.chunkIndex \
             WITH fid, collect(c.chunkKey) AS keys \
             RETURN fid, keys[0]"
        ));
        let rows = self.read(scope, &q).await?;
        let mut first: HashMap<String, String> = HashMap::with_capacity(rows.rows.len());
        for cells in &rows.rows {
            let row = Row(cells);
            if let Some(key) = row.opt_str(1)? {
                first.insert(row.str(0)?.to_owned(), key.to_owned());
            }
        }
        // Best file first, as the vector index ranked them.
        let keys: Vec<String> = hits
            .iter()
            .filter_map(|h| first.remove(&h.file_id))
            .take(limit)
            .collect();
        Ok((total, keys))
    }
}

/// Puts the package's file's similar files into it, with `similarFiles` in `counts` when
/// the cap clipped the list.
pub(crate) fn fill(package: &mut ChunkPackage, lists: &HashMap<String, SimilarList>) {
    let Some((total, list)) = lists.get(&package.file_id) else {
        return;
    };
    package.similar_files = list.clone();
    let mut counts = package.counts.take().map(|c| c.lists).unwrap_or_default();
    note_count(&mut counts, "similarFiles", *total, list.len());
    package.counts = (!counts.is_empty()).then_some(ListCounts { lists: counts });
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn similar(id: &str) -> SimilarFile {
        SimilarFile {
            file_id: id.into(),
            path: format!("{id}.md"),
            score: 0.5,
        }
    }

    #[test]
    fn fill_sets_the_list_and_counts_only_when_clipped() {
        let mut lists = HashMap::new();
        lists.insert("f1".to_owned(), (5, vec![similar("f2")]));
        lists.insert("f3".to_owned(), (1, vec![similar("f4")]));
        let mut clipped = ChunkPackage {
            file_id: "f1".into(),
            ..Default::default()
        };
        fill(&mut clipped, &lists);
        assert_eq!(clipped.similar_files, vec![similar("f2")]);
        let counts = clipped.counts.unwrap().lists;
        assert_eq!(counts.len(), 1);
        assert_eq!(
            (
                counts[0].list.as_str(),
                counts[0].total,
                counts[0].truncated
            ),
            ("similarFiles", 5, true)
        );
        let mut whole = ChunkPackage {
            file_id: "f3".into(),
            ..Default::default()
        };
        fill(&mut whole, &lists);
        assert_eq!(whole.similar_files.len(), 1);
        assert!(whole.counts.is_none());
        let mut none = ChunkPackage {
            file_id: "f9".into(),
            ..Default::default()
        };
        fill(&mut none, &lists);
        assert!(none.similar_files.is_empty() && none.counts.is_none());
    }
}
