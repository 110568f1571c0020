//! Candidate entities for the ontology review: multi-word proper names, acronyms and
//! identifiers that no TBox matcher found. Counted per file; never written as entities.

use std::collections::{BTreeMap, HashSet};
use std::sync::OnceLock;

use super::text::CharMap;
use super::{Candidate, EntityRecord, normalize_name};

/// What kind of name a candidate is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CandidateKind {
    /// Two to six capitalised words: `Grace Hopper`, `Network Operations Center`.
    ProperName,
    /// Two to eight capitals or digits with at least two capitals: `NATS`, `SLA`, `S3`-style.
    Acronym,
    /// Capitals, a dash and digits: `ABC-123`, `INC-2024-7`.
    Identifier,
}

impl CandidateKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            CandidateKind::ProperName => "proper_name",
            CandidateKind::Acronym => "acronym",
            CandidateKind::Identifier => "identifier",
        }
    }
}

/// Capitalised sentence starters and function words that begin no proper name.
const STARTERS: &[&str] = &[
    "a", "after", "all", "also", "an", "and", "any", "as", "at", "before", "but", "by", "during",
    "each", "every", "for", "from", "here", "how", "if", "in", "it", "its", "new", "no", "not",
    "note", "of", "on", "or", "our", "please", "see", "some", "that", "the", "then", "there",
    "these", "this", "those", "to", "use", "we", "what", "when", "where", "which", "who", "why",
    "with", "you", "your",
];
/// Capitalised words that are no acronym.
const NOT_ACRONYMS: &[&str] = &["OK", "TODO", "NOTE", "AND", "OR", "NOT", "THE", "IF"];

struct Patterns {
    identifier: regex::Regex,
    acronym: regex::Regex,
    proper: regex::Regex,
}

fn patterns() -> Option<&'static Patterns> {
    static PATTERNS: OnceLock<Option<Patterns>> = OnceLock::new();
    PATTERNS
        .get_or_init(|| {
            let word = r"\p{Lu}[\p{L}\p{N}'’]*\p{Ll}[\p{L}\p{N}]*";
            let built = (|| -> Result<Patterns, regex::Error> {
                Ok(Patterns {
                    identifier: regex::Regex::new(r"\b[A-Z][A-Z0-9]{1,9}(?:-[A-Z0-9]+)*-[0-9]+\b")?,
                    acronym: regex::Regex::new(r"\b[A-Z][A-Z0-9]{1,7}\b")?,
                    proper: regex::Regex::new(&format!(
                        r"\b{word}(?: (?:(?:of|de|van|von|der|du|la|&) )?{word}){{1,5}}\b"
                    ))?,
                })
            })();
            match built {
                Ok(p) => Some(p),
                Err(err) => {
                    tracing::error!(%err, "candidate heuristics disabled");
                    None
                }
            }
        })
        .as_ref()
}

/// Counts candidates over the chunks of one file.
#[derive(Default)]
pub(crate) struct Counter {
    /// candidate key -> (first text seen, kind, count)
    seen: BTreeMap<String, (String, CandidateKind, u32)>,
}

impl Counter {
    /// Scans one chunk. `fresh_from` (chars into the chunk) skips text the previous chunk
    /// already covered; `taken` are byte spans the TBox matchers found.
    pub fn scan(
        &mut self,
        text: &str,
        map: &CharMap,
        fresh_from: u64,
        taken: &[(usize, usize)],
        declared: &[EntityRecord],
    ) {
        let Some(p) = patterns() else { return };
        let known: HashSet<String> = declared
            .iter()
            .flat_map(|d| std::iter::once(&d.name).chain(&d.aliases))
            .map(|n| normalize_name(n))
            .collect();
        let mut spans: Vec<(usize, usize)> = taken.to_vec();
        let overlaps = |spans: &[(usize, usize)], s: usize, e: usize| {
            spans.iter().any(|&(a, b)| s < b && a < e)
        };
        let mut hits: Vec<(usize, usize, CandidateKind)> = Vec::new();
        for m in p.identifier.find_iter(text) {
            if !overlaps(&spans, m.start(), m.end()) {
                hits.push((m.start(), m.end(), CandidateKind::Identifier));
                spans.push((m.start(), m.end()));
            }
        }
        for m in p.proper.find_iter(text) {
            if in_heading(text, m.start()) {
                continue;
            }
            let Some((start, end)) = trim_starters(text, m.start(), m.end()) else {
                continue;
            };
            if !overlaps(&spans, start, end) {
                hits.push((start, end, CandidateKind::ProperName));
                spans.push((start, end));
            }
        }
        for m in p.acronym.find_iter(text) {
            let word = m.as_str();
            let capitals = word.bytes().filter(u8::is_ascii_uppercase).count();
            let roman = word.bytes().all(|b| b"IVXLCDM".contains(&b));
            if capitals < 2 || roman || NOT_ACRONYMS.contains(&word) {
                continue;
            }
            if !overlaps(&spans, m.start(), m.end()) {
                hits.push((m.start(), m.end(), CandidateKind::Acronym));
            }
        }
        for (start, end, kind) in hits {
            if map.char_at(start) < fresh_from {
                continue;
            }
            let name = &text[start..end];
            let norm = normalize_name(name);
            if known.contains(&norm) {
                continue;
            }
            let key = format!("{}:{norm}", kind.as_str());
            self.seen
                .entry(key)
                .and_modify(|e| e.2 += 1)
                .or_insert_with(|| (name.to_owned(), kind, 1));
        }
    }

    pub fn finish(self) -> Vec<Candidate> {
        self.seen
            .into_iter()
            .map(|(candidate_key, (name, kind, count))| Candidate {
                candidate_key,
                name,
                kind,
                count,
            })
            .collect()
    }
}

/// Whether the line holding `at` is a Markdown heading (title case there is no signal).
fn in_heading(text: &str, at: usize) -> bool {
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    text[line_start..].trim_start().starts_with('#')
}

/// Drops leading starter words ("The", "When", ...) and trailing connectors; `None` when fewer
/// than two words remain.
fn trim_starters(text: &str, start: usize, end: usize) -> Option<(usize, usize)> {
    let span = &text[start..end];
    let mut words: Vec<(usize, &str)> = Vec::new();
    let mut offset = 0;
    for word in span.split(' ') {
        words.push((offset, word));
        offset += word.len() + 1;
    }
    let first = words
        .iter()
        .position(|(_, w)| !STARTERS.contains(&w.to_lowercase().as_str()))?;
    let last = words
        .iter()
        .rposition(|(_, w)| w.chars().next().is_some_and(char::is_uppercase))?;
    let kept = words.get(first..=last)?;
    let capitalised = kept
        .iter()
        .filter(|(_, w)| w.chars().next().is_some_and(char::is_uppercase))
        .count();
    if capitalised < 2 {
        return None;
    }
    let (s, _) = kept.first()?;
    let (e, w) = kept.last()?;
    Some((start + s, start + e + w.len()))
}
