//! [`RetrievalService`]: Search and EntitySearch as plain methods over a verified caller.

use std::time::{Duration, Instant};

use kg_common::access::validate_namespace;
use kg_common::caller::access_for;
use kg_embed::SharedEmbedder;
use kg_proto::v1::{
    CallerContext, DuplicateCopy, EntitySearchRequest, EntitySearchResponse, Grounding, LaneTrace,
    Ranking, SearchFilters, SearchHit, SearchRequest, SearchResponse, VectorWidening,
};
use kg_stores::graph::GraphStore;
use kg_stores::vector::VectorIndex;

use crate::config::RetrievalConfig;
use crate::deadline::LaneDeadline;
use crate::error::{Result, RetrievalError};
use crate::fusion::{LaneHit, LaneHits, fuse};
use crate::lanes::{self, Lane, LaneFilters, LaneSettings};
use crate::sparse_lane::SparseLane;
use crate::vector_lane::VectorLane;
use crate::{co_annotation, entity_search, graph_expand};

/// Default and hard maximum of hits per search.
pub(crate) const TOP_K: (u32, u32) = (8, 32);
/// Default RRF constant.
const DEFAULT_RRF_K: f64 = 60.0;
/// Longest query text accepted, in characters.
const MAX_QUERY_CHARS: usize = 4_096;
/// Most folded copies a hit lists (`duplicate_count` counts them all).
const LISTED_DUPLICATES: usize = 5;
/// Stable trace code of a lane this release does not run.
pub(crate) const LANE_UNAVAILABLE: &str = "lane_unavailable";

/// Runs the retrieval lanes over one namespace graph and fuses them.
#[derive(Clone, Debug)]
pub struct RetrievalService {
    store: GraphStore,
    /// The vector lane, when the deployment has an embedder and a vector index.
    vectors: Option<VectorLane>,
    /// The sparse BM25 index serving the full-text lane (`qdrant_sparse`); FalkorDB's
    /// full-text index when unset.
    sparse: Option<SparseLane>,
    /// Whether FalkorDB's full-text lane matches and counts a query word by its English stem
    /// or as the exact token (`[retrieval] fulltext_stemming`, default off).
    fulltext_stemming: bool,
    /// When the vector lane found something, the share of the query's idf weight a full-text
    /// hit must match to earn its rank's whole contribution to fusion (see
    /// [`RetrievalService::with_fusion_fulltext_full_match`]).
    fusion_fulltext_full_match: f64,
    /// Whether chunks with the same text fuse as one hit unless the request says otherwise
    /// (`[retrieval] collapse_duplicates`, default on).
    collapse_duplicates: bool,
    /// How long per-scope counts (BM25 statistics, role degrees) are trusted
    /// (`[retrieval] statistics_ttl_seconds`).
    statistics_ttl: Duration,
}

/// Default of `[retrieval] fusion_fulltext_full_match`: a full-text hit fused beside vector
/// hits earns its rank's whole contribution when it holds half of the query's idf weight.
pub const DEFAULT_FUSION_FULLTEXT_FULL_MATCH: f64 = 0.5;
/// Default of `[retrieval] statistics_ttl_seconds`.
pub const DEFAULT_STATISTICS_TTL: Duration = crate::scope_cache::DEFAULT_TTL;

/// A validated search request.
#[derive(Debug)]
struct Plan {
    lanes: Vec<Lane>,
    top_k: usize,
    rrf_k: f64,
    weights: Vec<(Lane, f64)>,
    min_score: Option<f64>,
    /// `ranking.collapse_duplicates` when the request set it.
    collapse_duplicates: Option<bool>,
    filters: LaneFilters,
}

impl RetrievalService {
    /// A service over an existing FalkorDB handle.
    pub fn new(store: GraphStore) -> Self {
        Self {
            store,
            vectors: None,
            sparse: None,
            fulltext_stemming: false,
            fusion_fulltext_full_match: DEFAULT_FUSION_FULLTEXT_FULL_MATCH,
            collapse_duplicates: true,
            statistics_ttl: DEFAULT_STATISTICS_TTL,
        }
    }

    /// Adds the vector lane over `index`, embedding queries with `embedder` (the one that
    /// wrote the index). Without it the lane reports `lane_unavailable`.
    pub fn with_vectors(mut self, index: VectorIndex, embedder: SharedEmbedder) -> Result<Self> {
        self.vectors = Some(VectorLane::new(index, embedder)?);
        Ok(self)
    }

    /// Serves the `fulltext` lane from the sparse BM25 index instead of FalkorDB's
    /// full-text index (`[retrieval] fulltext_backend = "qdrant_sparse"`).
    pub fn with_sparse(mut self, index: kg_stores::vector::sparse::SparseIndex) -> Self {
        self.sparse = Some(SparseLane::new(index));
        self
    }

    /// Matches and counts full-text query words by their English stem (`true`: `rotation`
    /// finds `rotate`; +0.033 nDCG@10 for the lane on docs-qa) or as exact tokens (`false`,
    /// the default: a stem gathers the postings of all its words, so p99 rose ~25-50 ms at
    /// 100k chunks of code, and fused recall@8 fell on docs-qa; see `bench/RESULTS.md`).
    pub fn with_fulltext_stemming(mut self, stemming: bool) -> Self {
        self.fulltext_stemming = stemming;
        self
    }

    /// In a search where the vector lane found something, a FalkorDB full-text hit earns its
    /// rank's whole contribution to fusion only when the query terms it holds carry at least
    /// `share` (0..=1) of the query's idf weight; below that it earns
    /// `(held / share)²` of it ([`crate::fusion::match_weight`]). `0` gives every full-text hit
    /// its whole contribution. The full-text lane's own list, and graph_expand's seeds, are
    /// unchanged; only fusion's arithmetic is.
    ///
    /// Rank fusion cannot tell a full-text hit that matches the question from one that shares
    /// a word or two with it: on a paraphrased question the lexical list is mostly the latter,
    /// and each of them would still outrank good vector hits. Weighing each hit by the share
    /// of the query it holds (Elasticsearch's `minimum_should_match`, by idf instead of by
    /// term count, and graded instead of a cut) keeps the lexical evidence where it is
    /// evidence. An earlier release cut at the share instead; grading lifted fused nDCG@10 over
    /// the three judged sets pooled (+0.030, and +0.032 on the one written after the rule was
    /// fixed) while docs-qa alone lost 0.012 (`bench/RESULTS.md` has the figures).
    pub fn with_fusion_fulltext_full_match(mut self, share: f64) -> Self {
        self.fusion_fulltext_full_match = if share.is_finite() {
            share.clamp(0.0, 1.0)
        } else {
            DEFAULT_FUSION_FULLTEXT_FULL_MATCH
        };
        self
    }

    /// Whether a search folds chunks whose text is the same (whitespace aside) into one hit
    /// when its request does not say (`ranking.collapse_duplicates`); default `true`. The
    /// hit is the copy that ranked best and lists the others (see [`crate::fusion::fuse`]).
    /// Needs the text hash the indexer writes on chunks; chunks indexed before it existed
    /// collapse in the full-text lane only, until they are re-indexed.
    pub fn with_collapse_duplicates(mut self, collapse: bool) -> Self {
        self.collapse_duplicates = collapse;
        self
    }

    /// How long the counts cached per access scope (BM25's N, avgdl and document
    /// frequencies; graph_expand's role degrees) are trusted; default a minute. Past it a
    /// count is still used, for up to ten times as long, while the first search to find it
    /// old recounts it in the background ([`crate::scope_cache`]), so no search waits for a
    /// whole-scope count once the scope has been counted. A shorter time follows ingest
    /// more closely and counts more often; zero is read as one second.
    pub fn with_statistics_ttl(mut self, ttl: Duration) -> Self {
        self.statistics_ttl = ttl.max(Duration::from_secs(1));
        self
    }

    fn lane_settings(&self) -> LaneSettings {
        LaneSettings {
            stemming: self.fulltext_stemming,
            statistics_ttl: self.statistics_ttl,
        }
    }

    /// Connects to the FalkorDB named in `config`.
    pub async fn connect(config: &RetrievalConfig) -> Result<Self> {
        Ok(Self::new(GraphStore::connect(&config.falkordb_url).await?)
            .with_fulltext_stemming(config.fulltext_stemming)
            .with_fusion_fulltext_full_match(
                config
                    .fusion_fulltext_full_match
                    .unwrap_or(DEFAULT_FUSION_FULLTEXT_FULL_MATCH),
            )
            .with_collapse_duplicates(config.collapse_duplicates.unwrap_or(true))
            .with_statistics_ttl(
                config
                    .statistics_ttl_seconds
                    .map_or(DEFAULT_STATISTICS_TTL, Duration::from_secs),
            ))
    }

    /// Runs the requested lanes (default fulltext, vector, graph_expand) and fuses them with
    /// RRF. A lane this release does not run, or one that fails while another succeeds,
    /// soft-fails in the trace; only when no lane succeeds and one failed for real does the
    /// search fail, so a store outage is never mistaken for "nothing found".
    pub async fn search_for(
        &self,
        caller: &CallerContext,
        request: SearchRequest,
    ) -> Result<SearchResponse> {
        self.search_within(caller, request, kg_common::grpc::REQUEST_TIMEOUT)
            .await
    }

    /// [`Self::search_for`] for a call allowed `allowed` from now (its gRPC deadline): a lane
    /// still running near the end soft-fails with `timeout` so the others answer in time
    /// ([`crate::deadline`]).
    pub async fn search_within(
        &self,
        caller: &CallerContext,
        request: SearchRequest,
        allowed: Duration,
    ) -> Result<SearchResponse> {
        let deadline = LaneDeadline::within(allowed);
        validate_namespace(&request.namespace)?;
        let access = access_for(caller, &request.namespace)?;
        let plan = plan(&request)?;
        let query = request.query.trim();
        let collapse = plan.collapse_duplicates.unwrap_or(self.collapse_duplicates);

        let mut grounding = None;
        let mut vector_widening = None;
        let runnable =
            |lane: Lane| lane.is_available() && (lane != Lane::Vector || self.vectors.is_some());
        // The vector lane spends its time embedding the query in this process while the
        // graph lanes wait on FalkorDB, so it runs beside them; the graph lanes run in plan
        // order, graph_expand after the full-text hits it starts from.
        let vector_run = async {
            let vectors = self.vectors.as_ref()?;
            if !plan.lanes.contains(&Lane::Vector) {
                return None;
            }
            let started = Instant::now();
            let result = deadline
                .run(vectors.search(
                    &self.store,
                    &request.namespace,
                    access,
                    query,
                    &plan.filters,
                    lanes::LANE_POOL,
                    collapse,
                ))
                .await
                .map(|(hits, widening)| {
                    vector_widening = Some(VectorWidening {
                        pool: u32::try_from(widening.pool).unwrap_or(u32::MAX),
                        rounds: widening.rounds,
                        cap_reached: widening.cap_reached,
                    });
                    hits
                });
            Some((result, started.elapsed()))
        };
        let graph_run = async {
            let mut done: Vec<(Lane, Result<Vec<LaneHit>>, Duration)> = Vec::new();
            for &lane in &plan.lanes {
                if lane == Lane::Vector || !runnable(lane) {
                    continue;
                }
                let started = Instant::now();
                let run = async {
                    match lane {
                        Lane::Fulltext => match &self.sparse {
                            Some(sparse) => {
                                sparse
                                    .search(
                                        &self.store,
                                        &request.namespace,
                                        access,
                                        query,
                                        &plan.filters,
                                        lanes::LANE_POOL,
                                        collapse,
                                    )
                                    .await
                            }
                            None => {
                                lanes::fulltext(
                                    &self.store,
                                    &request.namespace,
                                    access,
                                    query,
                                    &plan.filters,
                                    self.lane_settings(),
                                )
                                .await
                            }
                        },
                        Lane::GraphExpand => {
                            let fulltext = done.iter().find_map(|(lane, result, _)| match result {
                                Ok(hits) if *lane == Lane::Fulltext => Some(hits.as_slice()),
                                _ => None,
                            });
                            graph_expand::graph_expand(
                                &self.store,
                                &request.namespace,
                                access,
                                query,
                                &plan.filters,
                                fulltext,
                                self.lane_settings(),
                            )
                            .await
                        }
                        Lane::CoAnnotation => co_annotation::co_annotation(
                            &self.store,
                            &request.namespace,
                            access,
                            query,
                            &plan.filters,
                        )
                        .await
                        .map(|(hits, report)| {
                            grounding = Some(report);
                            hits
                        }),
                        // Skipped above: it runs beside these lanes, in `vector_run`.
                        Lane::Vector => Ok(Vec::new()),
                    }
                };
                let result = deadline.run(run).await;
                if lane == Lane::CoAnnotation
                    && let Err(err) = &result
                {
                    // Still one grounding entry per namespace: its reason is the trace code.
                    grounding = Some(Grounding {
                        namespace: request.namespace.clone(),
                        reason: err.trace_code().to_owned(),
                        ..Default::default()
                    });
                }
                done.push((lane, result, started.elapsed()));
            }
            done
        };
        let (vector_done, graph_done) = tokio::join!(vector_run, graph_run);
        let mut finished: Vec<(Lane, Result<Vec<LaneHit>>, Duration)> = graph_done;
        if let Some((result, took)) = vector_done {
            finished.push((Lane::Vector, result, took));
        }

        // Traces and fusion input in plan order, whatever order the lanes finished in.
        let mut traces = Vec::with_capacity(plan.lanes.len());
        let mut ran: Vec<LaneHits> = Vec::new();
        let mut first_failure: Option<RetrievalError> = None;
        for &lane in &plan.lanes {
            if !runnable(lane) {
                let configured = lane != Lane::Vector || self.vectors.is_some();
                traces.push(LaneTrace {
                    lane: lane.as_str().to_owned(),
                    ok: false,
                    error_code: LANE_UNAVAILABLE.to_owned(),
                    hits: 0,
                    millis: 0.0,
                    message: if configured {
                        format!("the {} lane is not available in this build", lane.as_str())
                    } else {
                        "the vector lane needs embeddings, which this deployment does not configure"
                            .to_owned()
                    },
                });
                continue;
            }
            let Some(at) = finished.iter().position(|(l, _, _)| *l == lane) else {
                continue;
            };
            let (_, result, took) = finished.swap_remove(at);
            let millis = took.as_secs_f64() * 1000.0;
            match result {
                Ok(hits) => {
                    traces.push(LaneTrace {
                        lane: lane.as_str().to_owned(),
                        ok: true,
                        error_code: String::new(),
                        hits: u32::try_from(hits.len()).unwrap_or(u32::MAX),
                        millis,
                        message: String::new(),
                    });
                    ran.push(LaneHits {
                        lane,
                        weight: plan.weight(lane),
                        hits,
                        full_match: None,
                    });
                }
                Err(err) => {
                    tracing::warn!(namespace = %request.namespace, lane = lane.as_str(), error = %err.detail(), "lane failed");
                    traces.push(LaneTrace {
                        lane: lane.as_str().to_owned(),
                        ok: false,
                        error_code: err.trace_code().to_owned(),
                        hits: 0,
                        millis,
                        message: err.trace_message(&format!("the {} lane", lane.as_str())),
                    });
                    first_failure.get_or_insert(err);
                }
            }
        }
        if ran.is_empty()
            && let Some(err) = first_failure
        {
            return Err(err);
        }

        weigh_fulltext_hits_by_match(&mut ran, self.fusion_fulltext_full_match);
        let fused = fuse(&ran, plan.rrf_k, collapse);
        let mut hits = fused.hits;
        if let Some(min) = plan.min_score {
            hits.retain(|h| h.display >= min);
        }
        let total_candidates = hits.len() as u64;
        hits.truncate(plan.top_k);
        Ok(SearchResponse {
            namespace: request.namespace,
            hits: hits
                .into_iter()
                .map(|h| SearchHit {
                    chunk_key: h.chunk_key,
                    file_id: h.file_id,
                    fused_score: h.fused,
                    display_score: h.display,
                    lanes: h.lanes,
                    duplicate_count: u32::try_from(h.duplicates.len()).unwrap_or(u32::MAX),
                    duplicates: h
                        .duplicates
                        .into_iter()
                        .take(LISTED_DUPLICATES)
                        .map(|c| DuplicateCopy {
                            chunk_key: c.chunk_key,
                            file_id: c.file_id,
                            path: c.path,
                        })
                        .collect(),
                })
                .collect(),
            lanes: traces,
            total_candidates,
            duplicates_collapsed: fused.duplicates_collapsed,
            vector_widening,
            grounding,
        })
    }

    /// Entities by text over names and aliases, and by vector similarity when the service
    /// has embeddings; only those a readable chunk mentions (see the `entity_search` module
    /// for scoring, roles and evidence).
    pub async fn entity_search_for(
        &self,
        caller: &CallerContext,
        request: EntitySearchRequest,
    ) -> Result<EntitySearchResponse> {
        self.entity_search_within(caller, request, kg_common::grpc::REQUEST_TIMEOUT)
            .await
    }

    /// [`Self::entity_search_for`] for a call allowed `allowed` from now: a side (text,
    /// vector) still running near the end soft-fails with `timeout` in a hybrid search.
    pub async fn entity_search_within(
        &self,
        caller: &CallerContext,
        request: EntitySearchRequest,
        allowed: Duration,
    ) -> Result<EntitySearchResponse> {
        entity_search::entity_search(
            &self.store,
            self.vectors.as_ref(),
            caller,
            request,
            LaneDeadline::within(allowed),
        )
        .await
    }
}

/// Grades the full-text hits by the share of the query they match when the vector lane found
/// something (see [`RetrievalService::with_fusion_fulltext_full_match`]). Without vector hits
/// (no embeddings, or the lane failed or found nothing) the lexical lane is the only text
/// evidence and every hit keeps its whole contribution.
fn weigh_fulltext_hits_by_match(ran: &mut [LaneHits], full_match: f64) {
    let vector_found = ran
        .iter()
        .any(|lane| lane.lane == Lane::Vector && !lane.hits.is_empty());
    if full_match <= 0.0 || !vector_found {
        return;
    }
    for lane in ran.iter_mut().filter(|lane| lane.lane == Lane::Fulltext) {
        lane.full_match = Some(full_match);
    }
}

impl Plan {
    fn weight(&self, lane: Lane) -> f64 {
        self.weights
            .iter()
            .find(|(l, _)| *l == lane)
            .map_or(1.0, |(_, w)| *w)
    }
}

fn plan(request: &SearchRequest) -> Result<Plan> {
    let query = request.query.trim();
    if query.is_empty() {
        return Err(RetrievalError::invalid("query is empty"));
    }
    if query.chars().count() > MAX_QUERY_CHARS {
        return Err(RetrievalError::invalid(format!(
            "query is longer than {MAX_QUERY_CHARS} characters"
        )));
    }
    let mut lanes = Vec::new();
    for name in &request.lanes {
        let lane = Lane::parse(name.trim())?;
        if !lanes.contains(&lane) {
            lanes.push(lane);
        }
    }
    if lanes.is_empty() {
        lanes.extend(Lane::DEFAULT);
    }
    let top_k = match request.top_k {
        0 => TOP_K.0,
        k if k > TOP_K.1 => {
            return Err(RetrievalError::invalid(format!(
                "top_k = {k} is over its hard maximum of {}",
                TOP_K.1
            )));
        }
        k => k,
    } as usize;
    let (rrf_k, weights, min_score) = ranking(request.ranking.as_ref())?;
    Ok(Plan {
        lanes,
        top_k,
        rrf_k,
        weights,
        min_score,
        collapse_duplicates: request.ranking.as_ref().and_then(|r| r.collapse_duplicates),
        filters: filters(request.filters.as_ref())?,
    })
}

type RankingParts = (f64, Vec<(Lane, f64)>, Option<f64>);

fn ranking(ranking: Option<&Ranking>) -> Result<RankingParts> {
    let Some(ranking) = ranking else {
        return Ok((DEFAULT_RRF_K, Vec::new(), None));
    };
    let rrf_k = if ranking.rrf_k == 0.0 {
        DEFAULT_RRF_K
    } else {
        ranking.rrf_k
    };
    if !rrf_k.is_finite() || rrf_k < 0.0 {
        return Err(RetrievalError::invalid(
            "ranking.rrf_k must be a positive number",
        ));
    }
    let mut weights = Vec::new();
    for (name, weight) in &ranking.lane_weights {
        let lane = Lane::parse(name)?;
        if !weight.is_finite() || *weight < 0.0 {
            return Err(RetrievalError::invalid(format!(
                "ranking.lane_weights.{name} must be a number of at least 0"
            )));
        }
        weights.push((lane, *weight));
    }
    if let Some(min) = ranking.min_score
        && !(0.0..=1.0).contains(&min)
    {
        return Err(RetrievalError::invalid(
            "ranking.min_score must be between 0 and 1",
        ));
    }
    Ok((rrf_k, weights, ranking.min_score))
}

fn filters(filters: Option<&SearchFilters>) -> Result<LaneFilters> {
    LaneFilters::parse(filters)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::float_cmp)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn hits(lane: Lane, shares: &[Option<f64>]) -> LaneHits {
        LaneHits {
            lane,
            weight: 1.0,
            hits: shares
                .iter()
                .enumerate()
                .map(|(i, share)| crate::fusion::LaneHit {
                    chunk_key: format!("{}-{i}", lane.as_str()),
                    file_id: format!("file-{i}"),
                    raw_score: 1.0,
                    match_share: *share,
                    path: String::new(),
                    text_hash: None,
                })
                .collect(),
            full_match: None,
        }
    }

    fn keys(ran: &[LaneHits], lane: Lane) -> Vec<String> {
        ran.iter()
            .filter(|l| l.lane == lane)
            .flat_map(|l| l.hits.iter().map(|h| h.chunk_key.clone()))
            .collect()
    }

    #[test]
    fn fulltext_hits_are_graded_by_match_only_beside_vector_hits() {
        let fulltext = hits(Lane::Fulltext, &[Some(0.9), Some(0.25), None]);
        let graded = |ran: &[LaneHits]| {
            ran.iter()
                .find(|l| l.lane == Lane::Fulltext)
                .and_then(|l| l.full_match)
        };
        // Beside vector hits the full-text lane is graded; its list is not cut.
        let mut ran = vec![fulltext.clone(), hits(Lane::Vector, &[None, None])];
        weigh_fulltext_hits_by_match(&mut ran, 0.5);
        assert_eq!(graded(&ran), Some(0.5));
        assert_eq!(keys(&ran, Lane::Fulltext).len(), 3);
        assert_eq!(keys(&ran, Lane::Vector).len(), 2);
        // What the grading does to fusion: the strong hit and the hit without a share (the
        // sparse backend reports none) keep their whole contribution, the weak one a quarter.
        let fused = crate::fusion::fuse(&ran, 60.0, false).hits;
        let score = |key: &str| fused.iter().find(|h| h.chunk_key == key).unwrap().fused;
        assert!((score("fulltext-0") - 1.0 / 61.0).abs() < 1e-12);
        assert!((score("vector-0") - 1.0 / 61.0).abs() < 1e-12);
        assert!((score("fulltext-1") - 0.25 / 62.0).abs() < 1e-12);
        assert!((score("fulltext-2") - 1.0 / 63.0).abs() < 1e-12);
        // No vector hits (lane off, empty, or failed): the lexical lane is the only text
        // evidence and keeps every contribution whole; a share of 0 turns grading off.
        for (mut ran, share) in [
            (vec![fulltext.clone(), hits(Lane::Vector, &[])], 0.5),
            (
                vec![fulltext.clone(), hits(Lane::GraphExpand, &[None])],
                0.5,
            ),
            (vec![fulltext.clone(), hits(Lane::Vector, &[None])], 0.0),
        ] {
            weigh_fulltext_hits_by_match(&mut ran, share);
            assert_eq!(graded(&ran), None);
        }
    }

    fn request() -> SearchRequest {
        SearchRequest {
            namespace: "demo".into(),
            query: "rotate keys".into(),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_apply() {
        let plan = plan(&request()).unwrap();
        assert_eq!(plan.lanes, Lane::DEFAULT);
        assert_eq!(plan.top_k, 8);
        assert_eq!(plan.rrf_k, 60.0);
        assert_eq!(plan.weight(Lane::Fulltext), 1.0);
        assert_eq!(plan.min_score, None);
        assert_eq!(plan.filters.folder_prefix, "");
    }

    #[test]
    fn caps_lanes_and_ranking_are_checked() {
        let err = |r: SearchRequest| plan(&r).unwrap_err().to_string();
        assert!(
            err(SearchRequest {
                top_k: 33,
                ..request()
            })
            .contains("top_k = 33")
        );
        assert!(
            err(SearchRequest {
                query: "  ".into(),
                ..request()
            })
            .contains("empty")
        );
        assert!(
            err(SearchRequest {
                lanes: vec!["magic".into()],
                ..request()
            })
            .contains("valid lanes: fulltext")
        );
        let ranking = |r: Ranking| SearchRequest {
            ranking: Some(r),
            ..request()
        };
        assert!(
            err(ranking(Ranking {
                rrf_k: -1.0,
                ..Default::default()
            }))
            .contains("rrf_k")
        );
        assert!(
            err(ranking(Ranking {
                min_score: Some(1.5),
                ..Default::default()
            }))
            .contains("min_score")
        );
        assert!(
            err(ranking(Ranking {
                lane_weights: HashMap::from([("fulltext".to_owned(), f64::NAN)]),
                ..Default::default()
            }))
            .contains("lane_weights.fulltext")
        );
        assert!(
            err(ranking(Ranking {
                lane_weights: HashMap::from([("nope".to_owned(), 1.0)]),
                ..Default::default()
            }))
            .contains("unknown lane `nope`")
        );
        let filters = |f: SearchFilters| SearchRequest {
            filters: Some(f),
            ..request()
        };
        assert!(
            err(filters(SearchFilters {
                date_from: Some("2024".into()),
                ..Default::default()
            }))
            .contains("filters.dateFrom `2024` is not a date")
        );
        assert!(
            err(filters(SearchFilters {
                folder_prefix: "a/../b".into(),
                ..Default::default()
            }))
            .contains("filters.folderPrefix: invalid path")
        );

        let ok = plan(&SearchRequest {
            lanes: vec!["fulltext".into(), "co_annotation".into(), "fulltext".into()],
            top_k: 32,
            ranking: Some(Ranking {
                rrf_k: 10.0,
                lane_weights: HashMap::from([("fulltext".to_owned(), 2.0)]),
                min_score: Some(0.5),
                collapse_duplicates: Some(false),
            }),
            filters: Some(SearchFilters {
                folder_prefix: "/guides".into(),
                ..Default::default()
            }),
            ..request()
        })
        .unwrap();
        assert_eq!(ok.lanes, [Lane::Fulltext, Lane::CoAnnotation]);
        assert_eq!(
            (ok.top_k, ok.rrf_k, ok.weight(Lane::Fulltext), ok.min_score),
            (32, 10.0, 2.0, Some(0.5))
        );
        assert_eq!(ok.collapse_duplicates, Some(false));
        assert_eq!(ok.filters.folder_prefix, "guides/");
        assert_eq!(plan(&request()).unwrap().collapse_duplicates, None);
    }
}
