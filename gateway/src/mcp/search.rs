//! The pure parts of kg_search: interleaving per-namespace hit lists by rank,
//! and fitting chunk text into a token budget.

use kg_proto::v1::ChunkPackage;
use serde::Serialize;

/// Round robin by rank over ranked lists: every list's rank 1, then every
/// list's rank 2, ... Scores from different corpora are not comparable, so
/// they never decide the order. Returns (list index, item), at most `top_k`.
pub(crate) fn interleave<T>(lists: Vec<Vec<T>>, top_k: usize) -> Vec<(usize, T)> {
    let mut iters: Vec<_> = lists.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::new();
    loop {
        let mut progressed = false;
        for (index, iter) in iters.iter_mut().enumerate() {
            if out.len() == top_k {
                return out;
            }
            if let Some(item) = iter.next() {
                out.push((index, item));
                progressed = true;
            }
        }
        if !progressed {
            return out;
        }
    }
}

/// What a token budget did, reported in `trace.tokenBudget`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct BudgetReport {
    pub(crate) budget: u32,
    /// Estimated tokens of the text returned.
    pub(crate) used: u32,
    /// Packages whose text was dropped.
    pub(crate) omitted: u32,
    /// True when any text was cut or dropped.
    pub(crate) truncated: bool,
}

/// Estimated tokens of a package's text: the indexer's count, else ~4 chars a token.
fn estimate(package: &ChunkPackage) -> u64 {
    let counted = package.position.as_ref().map_or(0, |p| p.token_count);
    if counted > 0 {
        return counted.unsigned_abs();
    }
    let chars = package.text.as_ref().map_or(0, |t| t.text.chars().count());
    chars.div_ceil(4) as u64
}

/// Fills packages in order: whole text while it fits; the first that overflows
/// keeps the share of its text that fits (cut at a char boundary); every later
/// package loses its text.
pub(crate) fn apply_token_budget(packages: &mut [ChunkPackage], budget: u32) -> BudgetReport {
    let budget_u64 = u64::from(budget);
    let mut used: u64 = 0;
    let mut omitted = 0u32;
    let mut overflowed = false;
    for package in packages.iter_mut() {
        let tokens = estimate(package);
        let Some(text) = package.text.as_mut() else {
            continue;
        };
        if overflowed {
            if !text.text.is_empty() {
                text.text.clear();
                text.text_omitted = true;
                omitted += 1;
            }
            continue;
        }
        if used + tokens <= budget_u64 {
            used += tokens;
            continue;
        }
        overflowed = true;
        let remaining = budget_u64 - used;
        let total_chars = text.text.chars().count() as u64;
        let keep = (total_chars * remaining).checked_div(tokens).unwrap_or(0);
        if keep == 0 {
            text.text.clear();
            text.text_omitted = true;
            omitted += 1;
        } else {
            let cut = text
                .text
                .char_indices()
                .nth(usize::try_from(keep).unwrap_or(usize::MAX))
                .map_or(text.text.len(), |(i, _)| i);
            text.text.truncate(cut);
            text.text_truncated = true;
            used += remaining;
        }
    }
    BudgetReport {
        budget,
        used: u32::try_from(used).unwrap_or(u32::MAX),
        omitted,
        truncated: overflowed,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_proto::v1::{ChunkText, Position};

    fn package(text: &str, tokens: i64) -> ChunkPackage {
        ChunkPackage {
            text: Some(ChunkText {
                text: text.to_owned(),
                ..Default::default()
            }),
            position: Some(Position {
                token_count: tokens,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn text(p: &ChunkPackage) -> &ChunkText {
        p.text.as_ref().unwrap()
    }

    #[test]
    fn interleaves_by_rank_not_score() {
        let lists = vec![vec!["a1", "a2", "a3"], vec!["b1"], vec!["c1", "c2"]];
        let out: Vec<_> = interleave(lists, 10).into_iter().map(|(_, x)| x).collect();
        assert_eq!(out, ["a1", "b1", "c1", "a2", "c2", "a3"]);
        let lists = vec![vec!["a1", "a2", "a3"], vec!["b1", "b2"]];
        let out = interleave(lists, 3);
        assert_eq!(out, [(0, "a1"), (1, "b1"), (0, "a2")]);
        assert!(interleave::<u8>(vec![vec![], vec![]], 5).is_empty());
        assert!(interleave(vec![vec![1]], 0).is_empty());
    }

    #[test]
    fn budget_keeps_whole_texts_that_fit() {
        let mut packages = vec![package("aaaa", 10), package("bbbb", 10)];
        let report = apply_token_budget(&mut packages, 20);
        assert_eq!(
            report,
            BudgetReport {
                budget: 20,
                used: 20,
                omitted: 0,
                truncated: false
            }
        );
        assert_eq!(text(&packages[1]).text, "bbbb");
    }

    #[test]
    fn budget_truncates_the_overflowing_one_and_omits_the_rest() {
        let mut packages = vec![
            package("0123456789", 10),
            package("héllo wörld", 10),
            package("tail", 1),
        ];
        let report = apply_token_budget(&mut packages, 15);
        // 5 of 10 tokens remain for the second: half its 11 chars, cut on a char boundary.
        assert_eq!(text(&packages[0]).text, "0123456789");
        assert_eq!(text(&packages[1]).text, "héllo");
        assert!(text(&packages[1]).text_truncated);
        assert!(!text(&packages[1]).text_omitted);
        // The third would fit but comes after the overflow: omitted, order kept.
        assert_eq!(text(&packages[2]).text, "");
        assert!(text(&packages[2]).text_omitted);
        assert_eq!(
            report,
            BudgetReport {
                budget: 15,
                used: 15,
                omitted: 1,
                truncated: true
            }
        );
    }

    #[test]
    fn budget_smaller_than_the_first_chunk_and_missing_counts() {
        let mut packages = vec![package("abcdefgh", 0), package("xyz", 3)];
        // No token count: 8 chars estimate 2 tokens; a budget of 1 keeps half.
        let report = apply_token_budget(&mut packages, 1);
        assert_eq!(text(&packages[0]).text, "abcd");
        assert!(text(&packages[1]).text_omitted);
        assert_eq!(report.omitted, 1);
        assert!(report.truncated);

        let mut packages = vec![package("abc", 100)];
        let report = apply_token_budget(&mut packages, 1);
        // 3 chars * 1/100 rounds to nothing: the text is omitted, not cut to "".
        assert!(text(&packages[0]).text_omitted);
        assert_eq!(
            report,
            BudgetReport {
                budget: 1,
                used: 0,
                omitted: 1,
                truncated: true
            }
        );
    }
}
