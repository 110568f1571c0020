//! What the indexer stores about a chunk's text for search: its identity, the hash search
//! collapses identical texts by (the graph's `Chunk.textHash`, the vector payload's
//! `textHash`), the hash of what its vector was embedded from (the vector payload's
//! `embedHash`), and its length in words as BM25 counts them (`Chunk.wordCount`).

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

/// Hex of the first 128 bits of SHA-256 over what decides a chunk's vector: the embedder's
/// identity (model, dimensions and any setting that changes its output) and the exact text
/// it embedded. Two equal hashes mean embedding again would give the stored vector, so an
/// edit of a file embeds only its changed chunks. Fields are length-prefixed, so no split
/// of the same bytes between them collides.
pub fn embed_hash(embedder_identity: &str, embedded_text: &str) -> String {
    let mut hasher = Sha256::new();
    for field in ["kgmesh-embed-v1", embedder_identity, embedded_text] {
        hasher.update((field.len() as u64).to_le_bytes());
        hasher.update(field.as_bytes());
    }
    hex::encode(&hasher.finalize()[..16])
}

/// The words of a text as the full-text lane and the sparse index count them: runs of
/// letters, digits and `_` (not lower-cased).
pub fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|word| !word.is_empty())
}

/// A chunk's length for BM25 (`Chunk.wordCount`): the [`words`] of its contextHeader and its
/// text, which the full-text index covers together.
pub fn word_count(context_header: &str, text: &str) -> u32 {
    let count = words(context_header).count() + words(text).count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embed_hash_changes_with_the_embedder_and_every_byte_of_the_text() {
        let base = embed_hash("model|384", "Guide › Install\n\nRun it.");
        assert_eq!(base.len(), 32);
        assert_eq!(base, embed_hash("model|384", "Guide › Install\n\nRun it."));
        // A vector depends on whitespace and on the embedder's settings, unlike a copy check.
        assert_ne!(base, embed_hash("model|384", "Guide › Install\n\nRun  it."));
        assert_ne!(
            base,
            embed_hash("model|384|max_tokens=128", "Guide › Install\n\nRun it.")
        );
        assert_ne!(base, embed_hash("model|38", "4Guide › Install\n\nRun it."));
    }

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

    #[test]
    fn words_are_runs_of_letters_digits_and_underscores() {
        let got: Vec<&str> = words("Set `GIT_SSH_COMMAND`, café-au-lait v2.1!").collect();
        assert_eq!(
            got,
            ["Set", "GIT_SSH_COMMAND", "café", "au", "lait", "v2", "1"]
        );
        assert_eq!(word_count("Guide › Install", "npm ci --omit=dev"), 6);
        assert_eq!(word_count("", " \n "), 0);
    }
}
