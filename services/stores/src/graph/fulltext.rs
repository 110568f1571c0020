//! Free text to a safe FalkorDB full-text query.
//!
//! `db.idx.fulltext.queryNodes(label, q)` parses `q` with RediSearch query syntax: raw user
//! text fails (`keys)`, `(`, `a:b`, `"x` are syntax errors) or changes meaning (`-x` negates,
//! `*` matches everything, `k*` is a prefix, `@f:x` picks a field). Backslash escapes parse,
//! but the index splits text at that punctuation (`foo-bar` is stored as `foo`, `bar`), so an
//! escaped `foo\-bar` matches nothing. Verified against FalkorDB in `tests/servers.rs`.
//! So we never escape: [`fulltext_query`] splits at every non-word character, as the index
//! does, keeps the words (Unicode letters, digits, `_`) lowercased, drops stop words, and joins
//! the distinct terms with `|` (OR). The result holds nothing but word characters and `|`.

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

/// Turns free text into an OR-of-terms full-text query, or `None` when no searchable term
/// remains (empty input, only punctuation or stop words).
pub fn fulltext_query(user_text: &str) -> Option<String> {
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
    if terms.is_empty() {
        None
    } else {
        Some(terms.join("|"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
