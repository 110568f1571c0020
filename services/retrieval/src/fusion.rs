//! Reciprocal rank fusion of lane results.
//!
//! A chunk at 1-based rank `r` in lane `l` contributes `w_l / (k + r)`; its fused score is
//! the sum over lanes. The display score divides that by the best fused score possible for
//! the lanes that ran and found something (rank 1 in every one of them: `Σ w_l / (k + 1)`), so it lies in 0..=1,
//! reaches 1 only for a chunk every lane ranked first, and does not depend on `k`'s scale.

use std::collections::HashMap;

use kg_proto::v1::LaneRank;

use crate::lanes::Lane;

/// One lane's candidate, in the lane's rank order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LaneHit {
    pub(crate) chunk_key: String,
    pub(crate) file_id: String,
    /// The lane's own score (e.g. the full-text score); only reported, never fused.
    pub(crate) raw_score: f64,
    /// Full-text lane: the share of the query's idf weight this chunk matches
    /// ([`crate::bm25::match_share`]); `None` from other lanes.
    pub(crate) match_share: Option<f64>,
}

/// The ranked candidates of one lane that ran, with its weight.
#[derive(Debug, Clone)]
pub(crate) struct LaneHits {
    pub(crate) lane: Lane,
    pub(crate) weight: f64,
    pub(crate) hits: Vec<LaneHit>,
}

/// A fused candidate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FusedHit {
    pub(crate) chunk_key: String,
    pub(crate) file_id: String,
    pub(crate) fused: f64,
    pub(crate) display: f64,
    pub(crate) lanes: Vec<LaneRank>,
}

/// Fuses the lanes with constant `k`; best first. Ties fall to the better best rank, then
/// to the chunk key, so equal inputs always give the same order.
pub(crate) fn fuse(lanes: &[LaneHits], k: f64) -> Vec<FusedHit> {
    // A lane that ran but found nothing cannot rank anything first: it does not count.
    let best: f64 = lanes
        .iter()
        .filter(|l| !l.hits.is_empty())
        .map(|l| l.weight / (k + 1.0))
        .sum();
    let mut order: Vec<String> = Vec::new();
    let mut fused: HashMap<String, (FusedHit, u32)> = HashMap::new();
    for lane in lanes {
        let mut rank = 0u32;
        let mut seen_in_lane = std::collections::HashSet::new();
        for hit in &lane.hits {
            // A lane that repeats a chunk keeps its first (best) rank only.
            if !seen_in_lane.insert(hit.chunk_key.as_str()) {
                continue;
            }
            rank += 1;
            let contribution = lane.weight / (k + f64::from(rank));
            let entry = fused.entry(hit.chunk_key.clone()).or_insert_with(|| {
                order.push(hit.chunk_key.clone());
                (
                    FusedHit {
                        chunk_key: hit.chunk_key.clone(),
                        file_id: hit.file_id.clone(),
                        fused: 0.0,
                        display: 0.0,
                        lanes: Vec::new(),
                    },
                    u32::MAX,
                )
            });
            entry.0.fused += contribution;
            entry.0.lanes.push(LaneRank {
                lane: lane.lane.as_str().to_owned(),
                rank,
                raw_score: hit.raw_score,
            });
            entry.1 = entry.1.min(rank);
        }
    }
    let mut out: Vec<(FusedHit, u32)> = order
        .into_iter()
        .filter_map(|key| fused.remove(&key))
        .collect();
    for (hit, _) in &mut out {
        hit.display = if best > 0.0 {
            (hit.fused / best).clamp(0.0, 1.0)
        } else {
            0.0
        };
    }
    out.sort_by(|(a, a_rank), (b, b_rank)| {
        b.fused
            .total_cmp(&a.fused)
            .then(a_rank.cmp(b_rank))
            .then_with(|| a.chunk_key.cmp(&b.chunk_key))
    });
    out.into_iter().map(|(hit, _)| hit).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::float_cmp)]
mod tests {
    use super::*;

    fn lane(lane: Lane, weight: f64, keys: &[&str]) -> LaneHits {
        LaneHits {
            lane,
            weight,
            hits: keys
                .iter()
                .enumerate()
                .map(|(i, k)| LaneHit {
                    chunk_key: (*k).to_owned(),
                    file_id: format!("file-{k}"),
                    raw_score: 10.0 - i as f64,
                    match_share: None,
                })
                .collect(),
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn one_lane_passes_its_order_through() {
        let fused = fuse(&[lane(Lane::Fulltext, 1.0, &["a", "b", "c"])], 60.0);
        let keys: Vec<&str> = fused.iter().map(|h| h.chunk_key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert!(close(fused[0].fused, 1.0 / 61.0));
        assert!(close(fused[0].display, 1.0));
        assert!(close(fused[1].display, 61.0 / 62.0));
        assert_eq!(fused[2].lanes[0].rank, 3);
        assert_eq!(fused[2].lanes[0].raw_score, 8.0);
        assert_eq!(fused[1].file_id, "file-b");
    }

    #[test]
    fn agreement_across_lanes_beats_one_first_place() {
        let fused = fuse(
            &[
                lane(Lane::Fulltext, 1.0, &["a", "b", "c"]),
                lane(Lane::Vector, 1.0, &["b", "c", "a"]),
                lane(Lane::GraphExpand, 1.0, &["c", "b"]),
            ],
            60.0,
        );
        let keys: Vec<&str> = fused.iter().map(|h| h.chunk_key.as_str()).collect();
        // b: 1/62 + 1/61 + 1/62; c: 1/63 + 1/62 + 1/61; a: 1/61 + 1/63.
        assert_eq!(keys, ["b", "c", "a"]);
        let b = &fused[0];
        assert!(close(b.fused, 2.0 / 62.0 + 1.0 / 61.0));
        assert!(close(b.display, b.fused / (3.0 / 61.0)));
        assert_eq!(b.lanes.len(), 3);
        assert_eq!(fused[2].lanes.len(), 2);
        assert!(fused.iter().all(|h| (0.0..=1.0).contains(&h.display)));
    }

    #[test]
    fn weights_scale_contributions_and_k_flattens_ranks() {
        let lanes = [
            lane(Lane::Fulltext, 1.0, &["a", "b"]),
            lane(Lane::Vector, 3.0, &["b", "a"]),
        ];
        let fused = fuse(&lanes, 60.0);
        assert_eq!(
            fused[0].chunk_key, "b",
            "the heavier lane's first place wins"
        );
        // A chunk ranked first by every lane displays 1.
        let all_first = fuse(
            &[
                lane(Lane::Fulltext, 2.0, &["x"]),
                lane(Lane::Vector, 0.5, &["x"]),
            ],
            10.0,
        );
        assert!(close(all_first[0].display, 1.0));
        // Small k: rank 1 vs rank 2 differ a lot; large k: barely.
        let sharp = fuse(&[lane(Lane::Fulltext, 1.0, &["a", "b"])], 1.0);
        let flat = fuse(&[lane(Lane::Fulltext, 1.0, &["a", "b"])], 1000.0);
        assert!(sharp[1].display < 0.7);
        assert!(flat[1].display > 0.99);
    }

    #[test]
    fn ties_repeats_and_zero_weights_are_deterministic() {
        let fused = fuse(
            &[
                lane(Lane::Fulltext, 1.0, &["b", "a", "b"]),
                lane(Lane::Vector, 1.0, &["a", "b"]),
            ],
            60.0,
        );
        // a and b tie on fused score; equal best rank; key order decides.
        assert_eq!(fused[0].chunk_key, "a");
        assert!(close(fused[0].fused, fused[1].fused));
        assert_eq!(fused.len(), 2, "a repeated chunk is fused once");
        assert_eq!(fused[1].lanes.len(), 2);
        let zero = fuse(&[lane(Lane::Fulltext, 0.0, &["a"])], 60.0);
        assert_eq!(zero[0].display, 0.0);
        assert!(fuse(&[], 60.0).is_empty());
    }
}
