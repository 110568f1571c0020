//! Free text to a safe FalkorDB full-text query.
//!
//! `db.idx.fulltext.queryNodes(label, q)` parses `q` with RediSearch query syntax: raw user
//! text fails (`keys)`, `(`, `a:b`, `"x` are syntax errors) or changes meaning (`-x` negates,
//! `*` matches everything, `k*` is a prefix, `@f:x` picks a field). Backslash escapes parse,
//! but the index splits text at that punctuation (`foo-bar` is stored as `foo`, `bar`), so an
//! escaped `foo\-bar` matches nothing. Verified against FalkorDB in `tests/integration/servers.rs`.
//! So we never escape: [`fulltext_query`] splits at every non-word character, as the index
//! does, keeps the words (Unicode letters, digits, `_`) lowercased, drops stop words, and joins
//! the distinct terms with `|` (OR). The result holds nothing but word characters and `|`.
//! The index stems English words: [`stemmed_term`] (a bare word) matches every word with its
//! stem, [`exact_term`] (quoted) only itself (both verified against FalkorDB in
//! kg-retrieval's `tests/integration/bm25.rs`).
//!
//! `queryNodes` on a label without a full-text index, or on one still being built, answers
//! with no rows, not an error, so a search cannot tell either from "no hits":
//! [`GraphStore::fulltext_ro_query`] waits for an index being built, and
//! [`GraphStore::fulltext_index_state`] tells a missing one (callers ask only when a search
//! came back empty).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{GraphStore, Params, Rows};
use crate::error::StoreError;

/// Server-side limit on the index lookup.
const INDEX_LOOKUP_TIMEOUT_MS: u64 = 2_000;

/// Common English words. FalkorDB's full-text index keeps them (a query for `the` matches),
/// but they match nearly every chunk, so in an OR query they only add noise.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with",
];

/// Most terms in one query; more would only slow the search down.
pub const MAX_TERMS: usize = 32;
/// Longest term kept, in characters; longer runs are cut (no real word is this long).
pub const MAX_TERM_CHARS: usize = 64;

/// The distinct searchable terms of free text, in order: lower-cased runs of letters, digits
/// and `_` (cut at [`MAX_TERM_CHARS`]), stop words dropped, at most [`MAX_TERMS`]. Each holds
/// only word characters.
pub fn fulltext_terms(user_text: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for word in user_text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        let word: String = word
            .chars()
            .flat_map(char::to_lowercase)
            .filter(|c| c.is_alphanumeric() || *c == '_')
            .take(MAX_TERM_CHARS)
            .collect();
        // A bare run of underscores is no word.
        if word.is_empty() || word.chars().all(|c| c == '_') {
            continue;
        }
        if STOP_WORDS.contains(&word.as_str()) || terms.contains(&word) {
            continue;
        }
        terms.push(word);
        if terms.len() == MAX_TERMS {
            break;
        }
    }
    terms
}

/// The words of `text` that FalkorDB's full-text index would not find, space-separated:
/// its tokenizer splits at spaces, tabs and most ASCII punctuation, but not at a line break,
/// a backslash, a no-break space or non-ASCII punctuation such as an em dash, so it stores
/// `word\nnext` as one token `wordnext` and a query for `word` or `next` misses it (every
/// word that ends or starts a line of a wrapped paragraph). Each such glued token is split as
/// [`fulltext_terms`] splits a query, and its words are indexed beside the text (property
/// `splitWords`), so index and query agree on every word. Chunks without the glue get "".
pub fn split_words(text: &str) -> String {
    let splits_there =
        |c: char| c == ' ' || c == '\t' || (c.is_ascii_punctuation() && c != '\\' && c != '_');
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut words: Vec<&str> = Vec::new();
    for token in text.split(splits_there) {
        if token.chars().all(is_word) {
            continue;
        }
        for word in token.split(|c: char| !is_word(c)) {
            if !word.is_empty() && !words.contains(&word) {
                words.push(word);
            }
        }
    }
    words.join(" ")
}

/// Turns free text into an OR-of-terms full-text query, or `None` when no searchable term
/// remains (empty input, only punctuation or stop words).
pub fn fulltext_query(user_text: &str) -> Option<String> {
    let terms = fulltext_terms(user_text);
    if terms.is_empty() {
        None
    } else {
        Some(terms.join("|"))
    }
}

/// The full-text query matching exactly `term` (a [`fulltext_terms`] term): quoted, because
/// the index stems English (a bare `rule` also finds `rules`, `run` finds `running`) while
/// an exact phrase of one word matches that token only. Scoring that counts the term's own
/// occurrences (BM25 term frequency) needs the same matches for its document frequency.
/// Any other character is dropped, so the result is always `"` + word characters + `"`.
pub fn exact_term(term: &str) -> String {
    format!("\"{}\"", stemmed_term(term))
}

/// The full-text query matching `term` (a [`fulltext_terms`] term) and every word with its
/// English stem: the bare word, which the index expands to its stem (`rules` also finds
/// `rule` and `ruling`, `rotation` finds `rotate`). Any other character is dropped, so the
/// result holds word characters only.
pub fn stemmed_term(term: &str) -> String {
    term.chars()
        .filter(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// What a namespace graph's full-text index on a label can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FulltextIndexState {
    /// Built, or nothing to search (no graph, no `label` node): a search's answer is complete.
    Ready,
    /// Being built: just created, or rebuilt by FalkorDB after a restart (it loads its data,
    /// then indexes it in the background). Until then a search misses nodes, with no error.
    Building,
    /// The graph holds `label` nodes but no full-text index on them (dropped, or never made).
    Missing,
}

/// How long a full-text read waits for an index FalkorDB is building before it fails
/// `Unavailable` (after a restart, a few thousand chunks took 10-40 ms).
const BUILDING_WAIT: Duration = Duration::from_secs(1);
/// Pause between two looks at an index being built.
const BUILDING_POLL: Duration = Duration::from_millis(20);
/// Namespace graphs and labels whose index was last seen built, at most; past it the record is
/// started again (each then costs one more look).
const READY_RECORD_MAX: usize = 4_096;

impl GraphStore {
    /// The state of the full-text index on `label` in a namespace graph. `label` must be a
    /// plain identifier (`Chunk`, `Entity`).
    pub async fn fulltext_index_state(
        &self,
        namespace: &str,
        label: &str,
    ) -> Result<FulltextIndexState, StoreError> {
        if label.is_empty() || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(StoreError::InvalidInput {
                what: "label",
                reason: "a label is letters, digits and `_`".into(),
            });
        }
        let mut params = Params::new();
        params.insert("label".into(), Value::from(label));
        // One row on an existing graph (the aggregate), none when the graph does not exist.
        // A label's indexes share one row and one status, which reads `OPERATIONAL` once built
        // and `[Indexing] n/m: UNDER CONSTRUCTION` before.
        let cypher = format!(
            "CALL db.indexes() YIELD label, types, entitytype, status \
             WHERE label = $label AND entitytype = 'NODE' \
             WITH sum(size([p IN keys(types) WHERE 'FULLTEXT' IN types[p]])) AS fulltext, \
                  collect(status) AS statuses \
             OPTIONAL MATCH (n:{label}) WITH fulltext, statuses, n LIMIT 1 \
             RETURN fulltext, n IS NOT NULL, all(s IN statuses WHERE s = 'OPERATIONAL')"
        );
        let rows = self
            .ro_query(namespace, &cypher, &params, INDEX_LOOKUP_TIMEOUT_MS)
            .await?;
        let Some(row) = rows.rows.first() else {
            return Ok(FulltextIndexState::Ready);
        };
        let indexed = row.first().and_then(Value::as_f64).unwrap_or(0.0) > 0.0;
        let has_nodes = row.get(1).and_then(Value::as_bool).unwrap_or(false);
        let built = row.get(2).and_then(Value::as_bool).unwrap_or(false);
        Ok(if indexed && !built {
            FulltextIndexState::Building
        } else if has_nodes && !indexed {
            FulltextIndexState::Missing
        } else {
            FulltextIndexState::Ready
        })
    }

    /// Runs a read-only query that searches the full-text index on `label` (see
    /// [`GraphStore::ro_query`]), only once that index is built, so that its answer is
    /// complete. FalkorDB rebuilds its indexes in the background after a restart and answers
    /// searches meanwhile with no row and no error: a search would read "nothing matches", and
    /// counts taken then would skew every later score. Whether the index is built is looked up
    /// once per namespace and label, and again after this handle met a dead connection (a
    /// restart); a read that met one runs again once the index is built. An index still being
    /// built after a second fails `Unavailable`, which a caller may retry.
    pub async fn fulltext_ro_query(
        &self,
        namespace: &str,
        label: &str,
        cypher: &str,
        params: &Params,
        timeout_ms: u64,
    ) -> Result<Rows, StoreError> {
        self.await_fulltext_built(namespace, label).await?;
        let restarts = self.restarts_seen();
        let rows = self.ro_query(namespace, cypher, params, timeout_ms).await?;
        if self.restarts_seen() == restarts {
            return Ok(rows);
        }
        self.await_fulltext_built(namespace, label).await?;
        self.ro_query(namespace, cypher, params, timeout_ms).await
    }

    /// Returns once the full-text index on `label` was seen built since this handle last met
    /// a dead connection, waiting up to [`BUILDING_WAIT`] for one being built.
    async fn await_fulltext_built(&self, namespace: &str, label: &str) -> Result<(), StoreError> {
        let restarts = self.restarts_seen();
        let key = (namespace.to_owned(), label.to_owned());
        let seen_built =
            |ready: &HashMap<(String, String), u64>| ready.get(&key) == Some(&restarts);
        if self
            .fulltext_ready
            .lock()
            .map(|ready| seen_built(&ready))
            .unwrap_or(false)
        {
            return Ok(());
        }
        let deadline = Instant::now() + BUILDING_WAIT;
        loop {
            // A missing index is the lanes' to report, when a search comes back empty.
            if self.fulltext_index_state(namespace, label).await? != FulltextIndexState::Building {
                if let Ok(mut ready) = self.fulltext_ready.lock() {
                    if ready.len() >= READY_RECORD_MAX {
                        ready.clear();
                    }
                    ready.insert(key, restarts);
                }
                return Ok(());
            }
            if Instant::now() + BUILDING_POLL > deadline {
                return Err(StoreError::IndexBuilding {
                    label: label.to_owned(),
                });
            }
            tokio::time::sleep(BUILDING_POLL).await;
        }
    }

    /// The properties of `label` nodes the full-text index covers (empty without an index),
    /// or `None` while an index on `label` is under construction. `label` is a constant
    /// identifier of this crate.
    pub(crate) async fn fulltext_properties(
        &self,
        namespace: &str,
        label: &str,
    ) -> Result<Option<Vec<String>>, StoreError> {
        let mut params = Params::new();
        params.insert("label".into(), Value::from(label));
        let rows = self
            .query(
                namespace,
                "CALL db.indexes() YIELD label, types, entitytype, status \
                 WHERE label = $label AND entitytype = 'NODE' \
                 RETURN [p IN keys(types) WHERE 'FULLTEXT' IN types[p]], status",
                &params,
            )
            .await?;
        let mut properties: Vec<String> = Vec::new();
        for row in &rows.rows {
            if row.get(1).and_then(Value::as_str) != Some("OPERATIONAL") {
                return Ok(None);
            }
            let names = row.first().and_then(Value::as_array).into_iter().flatten();
            for name in names.filter_map(Value::as_str) {
                if !properties.iter().any(|p| p == name) {
                    properties.push(name.to_owned());
                }
            }
        }
        Ok(Some(properties))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_the_index_would_read_glued_are_split_out() {
        let text = "lemonade marzipan\nnutmeg oregano\r\npaprika\tquince path/to/file \
                    back\\slash nbsp\u{a0}word em\u{2014}dash under_score plain-words.";
        assert_eq!(
            split_words(text),
            "marzipan nutmeg oregano paprika back slash nbsp word em dash"
        );
        assert_eq!(split_words("nothing glued here, at all."), "");
        assert_eq!(split_words("a\nb\na\nb"), "a b", "each word once");
    }

    #[test]
    fn words_become_an_or_query() {
        assert_eq!(
            fulltext_query("How do I rotate the API keys?").as_deref(),
            Some("how|do|i|rotate|api|keys")
        );
        assert_eq!(
            fulltext_query("snake_case Ünïcode 42").as_deref(),
            Some("snake_case|ünïcode|42")
        );
        assert_eq!(fulltext_query("Keys keys KEYS").as_deref(), Some("keys"));
    }

    #[test]
    fn operators_are_stripped() {
        let hostile = r#"@text:{x} | -foo* "bar" (baz) ~qux %fuzzy% [1 2] \' ; DROP"#;
        let query = fulltext_query(hostile).unwrap_or_default();
        assert_eq!(query, "text|x|foo|bar|baz|qux|fuzzy|1|2|drop");
        assert!(
            query
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '|')
        );
    }

    #[test]
    fn exact_terms_are_quoted_words() {
        assert_eq!(
            fulltext_terms("Rotate the API keys, rotate!"),
            ["rotate", "api", "keys"]
        );
        assert_eq!(exact_term("snake_case"), "\"snake_case\"");
        assert_eq!(exact_term("a\"|b*"), "\"ab\"");
    }

    #[test]
    fn nothing_searchable_is_none() {
        for text in ["", "   ", "@|-*{}()", "the and of", "___", "\u{200b}"] {
            assert_eq!(fulltext_query(text), None, "{text:?}");
        }
    }

    #[test]
    fn terms_and_lengths_are_capped() {
        let many: String = (0..100).map(|i| format!("w{i} ")).collect();
        assert_eq!(
            fulltext_query(&many).unwrap_or_default().split('|').count(),
            MAX_TERMS
        );
        let long = "x".repeat(500);
        assert_eq!(
            fulltext_query(&long).unwrap_or_default().len(),
            MAX_TERM_CHARS
        );
    }
}
