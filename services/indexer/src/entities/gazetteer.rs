//! Known names -> mentions, with one Aho-Corasick automaton over every surface form.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, MatchKind};

use super::text::{Found, on_word_boundaries};
use super::{EntityRecord, Method};

/// Surface forms shorter than this (in chars) are ignored: one letter matches everywhere.
const MIN_FORM_CHARS: usize = 2;

#[derive(Debug)]
pub(crate) struct Gazetteer {
    automaton: AhoCorasick,
    /// Pattern id -> the entities (key, type) that surface form names.
    targets: Vec<Vec<(String, String)>>,
}

impl Gazetteer {
    /// `None` when no entity declares a usable name.
    pub fn build(entities: &[EntityRecord]) -> Result<Option<Gazetteer>, String> {
        // Exact surface form -> pattern id, so one form naming two entities is one pattern.
        let mut ids: HashMap<String, usize> = HashMap::new();
        let mut patterns: Vec<String> = Vec::new();
        let mut targets: Vec<Vec<(String, String)>> = Vec::new();
        for entity in entities {
            for form in std::iter::once(&entity.name).chain(&entity.aliases) {
                if form.chars().count() < MIN_FORM_CHARS {
                    continue;
                }
                // The automaton folds ASCII case only: non-ASCII forms also match lowercased.
                let mut variants = vec![form.clone()];
                if !form.is_ascii() && form.to_lowercase() != *form {
                    variants.push(form.to_lowercase());
                }
                for variant in variants {
                    let id = *ids.entry(variant.clone()).or_insert_with(|| {
                        patterns.push(variant);
                        targets.push(Vec::new());
                        patterns.len() - 1
                    });
                    push_target(&mut targets[id], entity);
                }
            }
        }
        if patterns.is_empty() {
            return Ok(None);
        }
        let automaton = AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .build(&patterns)
            .map_err(|e| e.to_string())?;
        Ok(Some(Gazetteer { automaton, targets }))
    }

    /// Appends the mentions in `text`: every match on word boundaries, then leftmost-longest
    /// among overlapping ones.
    pub fn find(&self, text: &str, out: &mut Vec<Found>) {
        let mut matches: Vec<(usize, usize, usize)> = self
            .automaton
            .find_overlapping_iter(text)
            .filter(|m| on_word_boundaries(text, m.start(), m.end()))
            .map(|m| (m.start(), m.end(), m.pattern().as_usize()))
            .collect();
        // Leftmost first, longest first at the same start.
        matches.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut chosen: Option<(usize, usize)> = None;
        for (start, end, pattern) in matches {
            // Skip what overlaps the chosen span, except other forms of exactly that span.
            if let Some((s, e)) = chosen
                && start < e
                && (start, end) != (s, e)
            {
                continue;
            }
            chosen = Some((start, end));
            for (entity_key, type_id) in self.targets.get(pattern).into_iter().flatten() {
                out.push(Found {
                    start,
                    end,
                    type_id: type_id.clone(),
                    entity_key: entity_key.clone(),
                    method: Method::Gazetteer,
                });
            }
        }
    }
}

fn push_target(targets: &mut Vec<(String, String)>, entity: &EntityRecord) {
    let target = (entity.entity_key.clone(), entity.type_id.clone());
    if !targets.contains(&target) {
        targets.push(target);
    }
}
