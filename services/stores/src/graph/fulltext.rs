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
//! `queryNodes` on a label without a full-text index answers with no rows, not an error, so
//! a search cannot tell a dropped index from "no hits": [`GraphStore::fulltext_index_missing`]
//! asks `db.indexes()` (callers ask only when a search came back empty).

use serde_json::Value;

use super::{GraphStore, Params};
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

impl GraphStore {
    /// Whether the namespace graph holds `label` nodes but no full-text index on `label`
    /// (dropped, or never created), so a full-text search over it would wrongly find nothing.
    /// `false` when the index exists, when no `label` node exists (nothing ingested: an empty
    /// result is the truth) and when the graph itself does not exist yet. `label` must be a
    /// plain identifier (`Chunk`, `Entity`).
    pub async fn fulltext_index_missing(
        &self,
        namespace: &str,
        label: &str,
    ) -> Result<bool, StoreError> {
        if label.is_empty() || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(StoreError::InvalidInput {
                what: "label",
                reason: "a label is letters, digits and `_`".into(),
            });
        }
        let mut params = Params::new();
        params.insert("label".into(), Value::from(label));
        // One row on an existing graph (the aggregate), none when the graph does not exist.
        let cypher = format!(
            "CALL db.indexes() YIELD label, types, entitytype \
             WHERE label = $label AND entitytype = 'NODE' \
             WITH sum(size([p IN keys(types) WHERE 'FULLTEXT' IN types[p]])) AS fulltext \
             OPTIONAL MATCH (n:{label}) WITH fulltext, n LIMIT 1 \
             RETURN fulltext, n IS NOT NULL"
        );
        let rows = self
            .ro_query(namespace, &cypher, &params, INDEX_LOOKUP_TIMEOUT_MS)
            .await?;
        let Some(row) = rows.rows.first() else {
            return Ok(false);
        };
        let indexed = row.first().and_then(Value::as_f64).unwrap_or(0.0) > 0.0;
        let has_nodes = row.get(1).and_then(Value::as_bool).unwrap_or(false);
        Ok(has_nodes && !indexed)
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
