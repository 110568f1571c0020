//! Reciprocal rank fusion of lane results.
//!
//! A chunk at 1-based rank `r` in lane `l` contributes `w_l / (k + r)`; its fused score is
//! the sum over lanes. The display score divides that by the best fused score possible for
//! the lanes that ran and found something (rank 1 in every one of them: `Σ w_l / (k + 1)`), so it lies in 0..=1,
//! reaches 1 only for a chunk every lane ranked first, and does not depend on `k`'s scale.
//!
//! A lane may also weigh each hit by how much of the query it matches ([`LaneHits::full_match`]):
//! the full-text lane does beside vector hits, so a chunk sharing one word with a paraphrased
//! question keeps its rank but earns little for it.

use std::collections::{HashMap, HashSet};

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
    /// The file path, reported for a copy folded into another hit ("" when unknown).
    pub(crate) path: String,
    /// The chunk's [`text_hash`](kg_stores::chunk_text::text_hash); `None` for a chunk
    /// indexed before it existed, which never collapses.
    pub(crate) text_hash: Option<String>,
}

impl LaneHit {
    /// What makes two hits the same text: the text hash, else (older data) the chunk itself.
    pub(crate) fn text_identity(&self) -> &str {
        self.text_hash.as_deref().unwrap_or(&self.chunk_key)
    }

    /// Best score first; equal scores (copies of a text score the same) by path, then chunk
    /// key, so the order does not change when the same files are ingested again: chunk keys
    /// derive from file ids, which are new on every upload.
    pub(crate) fn by_score(a: &LaneHit, b: &LaneHit) -> std::cmp::Ordering {
        b.raw_score
            .total_cmp(&a.raw_score)
            .then_with(|| a.path.cmp(&b.path))
            .then_with(|| a.chunk_key.cmp(&b.chunk_key))
    }
}

/// The ranked candidates of one lane that ran, with its weight.
#[derive(Debug, Clone)]
pub(crate) struct LaneHits {
    pub(crate) lane: Lane,
    pub(crate) weight: f64,
    pub(crate) hits: Vec<LaneHit>,
    /// When set, a hit carrying a [`LaneHit::match_share`] below this share earns
    /// [`match_weight`] of its rank's contribution instead of all of it.
    pub(crate) full_match: Option<f64>,
}

/// The part of its rank's contribution a hit matching `share` of the query's idf weight earns
/// when `full_match` earns all of it: `min(1, share / full_match)²`. Squared, a hit holding
/// half of the needed weight earns a quarter: weak lexical overlap fades fast, while a hit
/// just under the line is not cut off as a hard threshold would (measured in
/// `bench/RESULTS.md`).
pub(crate) fn match_weight(share: f64, full_match: f64) -> f64 {
    if full_match.is_nan() || full_match <= 0.0 || share >= full_match {
        return 1.0;
    }
    let part = (share / full_match).clamp(0.0, 1.0);
    if part.is_nan() { 0.0 } else { part * part }
}

/// A fused candidate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FusedHit {
    pub(crate) chunk_key: String,
    pub(crate) file_id: String,
    pub(crate) fused: f64,
    pub(crate) display: f64,
    pub(crate) lanes: Vec<LaneRank>,
    /// Chunks with the same text folded into this one, best first.
    pub(crate) duplicates: Vec<FoldedCopy>,
}

/// A chunk folded into a [`FusedHit`] because its text is the same.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FoldedCopy {
    pub(crate) chunk_key: String,
    pub(crate) file_id: String,
    pub(crate) path: String,
}

/// What [`fuse`] returns: the candidates, best first, and how many chunks it folded.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Fused {
    pub(crate) hits: Vec<FusedHit>,
    pub(crate) duplicates_collapsed: u64,
}

/// One candidate while fusing: every chunk it stands for, with the best contribution each
/// earned from a single lane.
#[derive(Debug)]
struct Group<'a> {
    members: Vec<(&'a LaneHit, f64)>,
    fused: f64,
    lanes: Vec<LaneRank>,
    best_rank: u32,
}

/// Fuses the lanes with constant `k`; best first. Ties (common: rank 3 in one lane scores
/// as rank 3 in another) fall to the better best rank, then to the path, then to the chunk
/// key, so the same files give the same order however often they are ingested.
///
/// With `collapse`, chunks with the same [`LaneHit::text_hash`] are one candidate: within a
/// lane only its best-ranked copy counts (the copies after it do not take ranks), across
/// lanes their contributions add up as one chunk's would, and the hit shown is the copy
/// with the largest single contribution, the others listed as its duplicates. A repeated
/// paragraph (a licence, an option description pasted into every page) then takes one
/// place in each lane instead of crowding out the chunks that differ. Without `collapse`
/// every chunk is its own candidate.
pub(crate) fn fuse(lanes: &[LaneHits], k: f64, collapse: bool) -> Fused {
    // A lane that ran but found nothing cannot rank anything first: it does not count.
    let best: f64 = lanes
        .iter()
        .filter(|l| !l.hits.is_empty())
        .map(|l| l.weight / (k + 1.0))
        .sum();
    let mut groups: Vec<Group<'_>> = Vec::new();
    // A chunk's group by its key, and by its text when collapsing. A chunk found by key
    // stays in its group even when another lane (older data) reports no text hash for it.
    let mut by_key: HashMap<&str, usize> = HashMap::new();
    let mut by_text: HashMap<&str, usize> = HashMap::new();
    for lane in lanes {
        let mut rank = 0u32;
        let mut seen_in_lane = HashSet::new();
        for hit in &lane.hits {
            let text = hit.text_hash.as_deref().filter(|_| collapse);
            let group = match by_key
                .get(hit.chunk_key.as_str())
                .or_else(|| text.and_then(|t| by_text.get(t)))
            {
                Some(&group) => group,
                None => {
                    groups.push(Group {
                        members: Vec::new(),
                        fused: 0.0,
                        lanes: Vec::new(),
                        best_rank: u32::MAX,
                    });
                    groups.len() - 1
                }
            };
            by_key.entry(hit.chunk_key.as_str()).or_insert(group);
            if let Some(text) = text {
                by_text.entry(text).or_insert(group);
            }
            // A lane that repeats a chunk or a text keeps its first (best) rank only; the
            // later copies join the group unranked, so the hit still lists them.
            let ranked = seen_in_lane.insert(group);
            let contribution = if ranked {
                rank += 1;
                let earned = match (lane.full_match, hit.match_share) {
                    (Some(full), Some(share)) => match_weight(share, full),
                    _ => 1.0,
                };
                lane.weight * earned / (k + f64::from(rank))
            } else {
                0.0
            };
            let Some(entry) = groups.get_mut(group) else {
                continue;
            };
            if ranked {
                entry.fused += contribution;
                entry.lanes.push(LaneRank {
                    lane: lane.lane.as_str().to_owned(),
                    rank,
                    raw_score: hit.raw_score,
                });
                entry.best_rank = entry.best_rank.min(rank);
            }
            match entry
                .members
                .iter_mut()
                .find(|(m, _)| m.chunk_key == hit.chunk_key)
            {
                Some((_, best)) => *best = best.max(contribution),
                None => entry.members.push((hit, contribution)),
            }
        }
    }
    let mut duplicates_collapsed = 0u64;
    let mut out: Vec<(FusedHit, u32, &str)> = groups
        .into_iter()
        .filter_map(|mut group| {
            // Stable: among equal contributions the copy seen first leads.
            group.members.sort_by(|(_, a), (_, b)| b.total_cmp(a));
            let mut members = group.members.into_iter().map(|(hit, _)| hit);
            let shown = members.next()?;
            let duplicates: Vec<FoldedCopy> = members
                .map(|hit| FoldedCopy {
                    chunk_key: hit.chunk_key.clone(),
                    file_id: hit.file_id.clone(),
                    path: hit.path.clone(),
                })
                .collect();
            duplicates_collapsed += duplicates.len() as u64;
            let display = if best > 0.0 {
                (group.fused / best).clamp(0.0, 1.0)
            } else {
                0.0
            };
            Some((
                FusedHit {
                    chunk_key: shown.chunk_key.clone(),
                    file_id: shown.file_id.clone(),
                    fused: group.fused,
                    display,
                    lanes: group.lanes,
                    duplicates,
                },
                group.best_rank,
                shown.path.as_str(),
            ))
        })
        .collect();
    out.sort_by(|(a, a_rank, a_path), (b, b_rank, b_path)| {
        b.fused
            .total_cmp(&a.fused)
            .then(a_rank.cmp(b_rank))
            .then_with(|| a_path.cmp(b_path))
            .then_with(|| a.chunk_key.cmp(&b.chunk_key))
    });
    Fused {
        hits: out.into_iter().map(|(hit, _, _)| hit).collect(),
        duplicates_collapsed,
    }
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
                    path: format!("{k}.md"),
                    // `a~2` is a copy of `a`'s text.
                    text_hash: Some(format!("text of {}", k.split('~').next().unwrap())),
                })
                .collect(),
            full_match: None,
        }
    }

    #[test]
    fn match_weight_grades_below_the_full_share() {
        assert_eq!(match_weight(0.9, 0.5), 1.0);
        assert_eq!(match_weight(0.5, 0.5), 1.0);
        assert!((match_weight(0.25, 0.5) - 0.25).abs() < 1e-12);
        assert!((match_weight(0.4, 0.5) - 0.64).abs() < 1e-12);
        assert_eq!(match_weight(0.0, 0.5), 0.0);
        assert_eq!(match_weight(f64::NAN, 0.5), 0.0);
        // A full share of 0 (or nonsense) weighs every hit fully.
        assert_eq!(match_weight(0.1, 0.0), 1.0);
        assert_eq!(match_weight(0.1, f64::NAN), 1.0);
    }

    #[test]
    fn equal_fused_scores_fall_to_the_path_not_the_chunk_key() {
        // Rank 1 in one lane each: equal scores, equal best ranks. Chunk keys come from file
        // ids that are new on every upload, paths do not.
        let mut fulltext = lane(Lane::Fulltext, 1.0, &["k1"]);
        let mut vector = lane(Lane::Vector, 1.0, &["k2"]);
        fulltext.hits[0].path = "z/guide.md".into();
        vector.hits[0].path = "a/guide.md".into();
        let fused = fuse_all(&[fulltext.clone(), vector.clone()], 60.0);
        assert_eq!(keys(&fused), ["k2", "k1"]);
        std::mem::swap(&mut fulltext.hits[0].path, &mut vector.hits[0].path);
        assert_eq!(keys(&fuse_all(&[fulltext, vector], 60.0)), ["k1", "k2"]);
    }

    #[test]
    fn lane_hits_order_by_score_then_path() {
        let mut hits = lane(Lane::Fulltext, 1.0, &["k1", "k2", "k3"]).hits;
        hits[0].raw_score = 5.0;
        hits[1].raw_score = 5.0;
        hits[0].path = "b.md".into();
        hits[1].path = "a.md".into();
        hits.sort_by(LaneHit::by_score);
        let order: Vec<&str> = hits.iter().map(|h| h.chunk_key.as_str()).collect();
        assert_eq!(order, ["k3", "k2", "k1"]);
    }

    /// Every candidate, texts collapsed.
    fn fuse_all(lanes: &[LaneHits], k: f64) -> Vec<FusedHit> {
        fuse(lanes, k, true).hits
    }

    fn keys(hits: &[FusedHit]) -> Vec<&str> {
        hits.iter().map(|h| h.chunk_key.as_str()).collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn one_lane_passes_its_order_through() {
        let fused = fuse_all(&[lane(Lane::Fulltext, 1.0, &["a", "b", "c"])], 60.0);
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
        let fused = fuse_all(
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
        let fused = fuse_all(&lanes, 60.0);
        assert_eq!(
            fused[0].chunk_key, "b",
            "the heavier lane's first place wins"
        );
        // A chunk ranked first by every lane displays 1.
        let all_first = fuse_all(
            &[
                lane(Lane::Fulltext, 2.0, &["x"]),
                lane(Lane::Vector, 0.5, &["x"]),
            ],
            10.0,
        );
        assert!(close(all_first[0].display, 1.0));
        // Small k: rank 1 vs rank 2 differ a lot; large k: barely.
        let sharp = fuse_all(&[lane(Lane::Fulltext, 1.0, &["a", "b"])], 1.0);
        let flat = fuse_all(&[lane(Lane::Fulltext, 1.0, &["a", "b"])], 1000.0);
        assert!(sharp[1].display < 0.7);
        assert!(flat[1].display > 0.99);
    }

    #[test]
    fn ties_repeats_and_zero_weights_are_deterministic() {
        let fused = fuse_all(
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
        let zero = fuse_all(&[lane(Lane::Fulltext, 0.0, &["a"])], 60.0);
        assert_eq!(zero[0].display, 0.0);
        assert!(fuse_all(&[], 60.0).is_empty());
    }

    #[test]
    fn copies_of_a_text_take_one_rank_per_lane_and_fuse_as_one_hit() {
        let lanes = [
            lane(Lane::Fulltext, 1.0, &["a", "a~1", "b", "a~2", "c"]),
            lane(Lane::Vector, 1.0, &["a~2", "b", "c"]),
        ];
        let fused = fuse(&lanes, 60.0, true);
        assert_eq!(keys(&fused.hits), ["a", "b", "c"]);
        // The copies after the first take no rank: b is second in both lanes.
        let a = &fused.hits[0];
        assert!(close(a.fused, 2.0 / 61.0));
        assert!(close(a.display, 1.0));
        assert!(close(fused.hits[1].fused, 2.0 / 62.0));
        assert_eq!(fused.hits[1].lanes[0].rank, 2);
        // a and a~2 each earned 1/61: the one seen first is shown, the ranked copy listed
        // before the unranked one.
        let listed: Vec<(&str, &str)> = a
            .duplicates
            .iter()
            .map(|c| (c.chunk_key.as_str(), c.path.as_str()))
            .collect();
        assert_eq!(listed, [("a~2", "a~2.md"), ("a~1", "a~1.md")]);
        assert_eq!(fused.duplicates_collapsed, 2);
        assert!(fused.hits[1].duplicates.is_empty());

        // Without collapsing every chunk is its own candidate.
        let apart = fuse(&lanes, 60.0, false);
        assert_eq!(keys(&apart.hits), ["a~2", "b", "c", "a", "a~1"]);
        assert_eq!(apart.duplicates_collapsed, 0);
        assert!(apart.hits.iter().all(|h| h.duplicates.is_empty()));
    }

    #[test]
    fn the_copy_with_the_largest_single_contribution_is_shown() {
        let fused = fuse_all(
            &[
                lane(Lane::Fulltext, 1.0, &["y", "z"]),
                lane(Lane::Vector, 2.0, &["y~1"]),
            ],
            60.0,
        );
        assert_eq!(keys(&fused), ["y~1", "z"]);
        assert_eq!(fused[0].file_id, "file-y~1");
        assert_eq!(fused[0].duplicates[0].chunk_key, "y");
        assert_eq!(fused[0].lanes.len(), 2);
    }

    #[test]
    fn a_chunk_without_a_text_hash_in_one_lane_stays_with_its_text() {
        let mut expand = lane(Lane::GraphExpand, 1.0, &["a", "a~1"]);
        // Indexed before the hash existed: graph_expand reads none; the full-text lane
        // hashes the text it reads.
        expand.hits.iter_mut().for_each(|h| h.text_hash = None);
        let fused = fuse(
            &[lane(Lane::Fulltext, 1.0, &["b", "a"]), expand],
            60.0,
            true,
        );
        // a is one candidate with both lanes' ranks; a~1 is not known to be a copy.
        assert_eq!(keys(&fused.hits), ["a", "b", "a~1"]);
        assert_eq!(fused.hits[0].lanes.len(), 2);
        assert_eq!(fused.duplicates_collapsed, 0);
    }
}
