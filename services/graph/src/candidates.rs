//! Candidates: the names the indexer's heuristics saw (proper names, acronyms, identifiers)
//! that no TBox matcher found, counted over the files the caller may read, so an admin can
//! draft a TBox from what the namespace actually says.

use kg_common::caller::require_admin_api;
use kg_common::sanitize::sanitize_text;
use kg_proto::v1::{CallerContext, CandidatesRequest, CandidatesResponse, EntityCandidate};
use serde_json::Value;

use crate::error::{GraphError, Result};
use crate::rows::{Row, to_u64};
use crate::service::{GraphService, Node, Query};

/// Default and hard maximum of candidates per call.
pub(crate) const CANDIDATES_LIMIT: (u32, u32) = (100, 1000);
/// The kinds the heuristics report (`kg_indexer::entities::CandidateKind`).
const KINDS: [&str; 3] = ["proper_name", "acronym", "identifier"];
/// Files named per candidate.
const SAMPLE_PATHS: i64 = 3;
/// Longest name returned; candidates are a few words.
const NAME_CAP: usize = 256;

impl GraphService {
    /// The namespace's candidates in the caller's readable files, most files first, then
    /// most sightings, then by name. Only through the admin API: they are for drafting a TBox.
    pub async fn candidates_for(
        &self,
        caller: &CallerContext,
        request: CandidatesRequest,
    ) -> Result<CandidatesResponse> {
        require_admin_api(caller)?;
        let scope = self.scope(caller, &request.namespace)?;
        let limit = match request.limit {
            0 => CANDIDATES_LIMIT.0,
            n if n <= CANDIDATES_LIMIT.1 => n,
            n => {
                return Err(GraphError::InvalidArgument(format!(
                    "limit {n} is over {}; ask for at most that many",
                    CANDIDATES_LIMIT.1
                )));
            }
        };
        if !request.kind.is_empty() && !KINDS.contains(&request.kind.as_str()) {
            return Err(GraphError::InvalidArgument(format!(
                "kind `{}` is unknown; use {}, or leave it out for every kind",
                sanitize_text(&request.kind, 40),
                KINDS.join(", ")
            )));
        }
        let mut q = Query::new();
        let pf = q.access(scope.access, "f", Node::File);
        q.param("limit", i64::from(limit))
            .param("kind", request.kind.clone())
            .param("samples", SAMPLE_PATHS);
        // The access predicate sits in the MATCH's WHERE, before the first WITH (see
        // `Query::access`); counts come from the readable files' PROPOSES edges, never from
        // the candidate's totals over every file.
        q.set_text(format!(
            "MATCH (f:FileRef)-[p:PROPOSES]->(ce:CandidateEntity) \
             WHERE {pf} AND ($kind = '' OR ce.kind = $kind) \
             WITH ce, count(f) AS files, toInteger(sum(p.count)) AS sightings, \
                  collect(f.vfsPath)[0..$samples] AS paths \
             ORDER BY files DESC, sightings DESC, ce.name, ce.candidateKey \
             WITH collect([ce.name, ce.kind, files, sightings, paths]) AS found \
             RETURN size(found), found[0..$limit]"
        ));
        let rows = self.read(&scope, &q).await?;
        let Some(row) = rows.rows.first() else {
            return Ok(CandidatesResponse {
                namespace: scope.namespace.to_owned(),
                ..Default::default()
            });
        };
        let row = Row(row);
        let total = to_u64(row.int(0)?)?;
        let candidates = row
            .list(1)?
            .iter()
            .map(|found| {
                let fields = found.as_array().map(Vec::as_slice).unwrap_or_default();
                let found = Row(fields);
                Ok(EntityCandidate {
                    name: sanitize_text(found.str(0)?, NAME_CAP),
                    kind: found.str(1)?.to_owned(),
                    files: to_u64(found.int(2)?)?,
                    count: to_u64(found.int(3)?)?,
                    sample_paths: found
                        .list(4)?
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CandidatesResponse {
            namespace: scope.namespace.to_owned(),
            truncated: total > candidates.len() as u64,
            total,
            candidates,
        })
    }
}
