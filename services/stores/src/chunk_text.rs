//! A chunk's text identity: the hash the indexer stores on each chunk (the graph's
//! `Chunk.textHash`, the vector payload's `textHash`) and search collapses identical texts by.

use sha2::{Digest, Sha256};

/// Hex of the first 128 bits of SHA-256 over the text with every run of whitespace made one
/// space and the ends trimmed, so a copy re-wrapped or re-indented is still the same text.
/// Case and punctuation count. 128 bits: a collision would hide a distinct chunk from a
/// search, and at 2^-64 for four billion chunks that is not a concern.
pub fn text_hash(text: &str) -> String {
    let mut hasher = Sha256::new();
    for (i, word) in text.split_whitespace().enumerate() {
        if i > 0 {
            hasher.update(b" ");
        }
        hasher.update(word.as_bytes());
    }
    hex::encode(&hasher.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_runs_and_ends_do_not_change_the_hash_but_words_and_case_do() {
        let base = text_hash("Set the workspace.\nDefault: none");
        assert_eq!(base.len(), 32);
        assert_eq!(
            base,
            text_hash("  Set the   workspace.\r\n\tDefault: none\n")
        );
        assert_ne!(base, text_hash("set the workspace.\nDefault: none"));
        assert_ne!(base, text_hash("Set the workspace. Default none"));
        assert_ne!(text_hash("ab c"), text_hash("a bc"));
        assert_eq!(text_hash(""), text_hash(" \n "));
    }
}
