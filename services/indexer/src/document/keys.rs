//! Stable keys for chunks and outline entries, and the "Document › Heading" context header.

use sha2::{Digest, Sha256};

use super::{ChunkSpan, OutlineEntry};

/// Hex chars kept from the digest: 80 bits, ample for per-namespace uniqueness.
const KEY_HEX_LEN: usize = 20;

/// Hashes length-prefixed fields so ("ab","c") and ("a","bc") never collide.
fn digest_key(prefix: &str, fields: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for field in fields {
        hasher.update((field.len() as u64).to_le_bytes());
        hasher.update(field);
    }
    let mut hex = hex::encode(hasher.finalize());
    hex.truncate(KEY_HEX_LEN);
    format!("{prefix}{hex}")
}

/// `ch_` + 20 hex of sha256 over namespace, file id, chunk index, char start and text:
/// the same content in the same file yields the same key on every re-index.
pub fn chunk_key(namespace: &str, file_id: &str, span: &ChunkSpan) -> String {
    digest_key(
        "ch_",
        &[
            namespace.as_bytes(),
            file_id.as_bytes(),
            &span.index.to_le_bytes(),
            &span.char_start.to_le_bytes(),
            span.text.as_bytes(),
        ],
    )
}

/// `ol_` + 20 hex of sha256 over namespace, file id, order, depth, char start and title.
pub fn outline_key(namespace: &str, file_id: &str, entry: &OutlineEntry) -> String {
    digest_key(
        "ol_",
        &[
            namespace.as_bytes(),
            file_id.as_bytes(),
            &entry.order.to_le_bytes(),
            &[entry.depth],
            &entry.char_start.to_le_bytes(),
            entry.title.as_bytes(),
        ],
    )
}

/// "Document › Heading › Subheading". Empty parts are skipped, and a first heading equal to
/// the document title (the usual H1) is not repeated.
pub fn context_header(doc_title: &str, heading_path: &[String]) -> String {
    let doc_title = doc_title.trim();
    let mut parts: Vec<&str> = Vec::with_capacity(heading_path.len() + 1);
    if !doc_title.is_empty() {
        parts.push(doc_title);
    }
    for (i, heading) in heading_path.iter().enumerate() {
        let heading = heading.trim();
        if heading.is_empty() || (i == 0 && heading == doc_title) {
            continue;
        }
        parts.push(heading);
    }
    parts.join(" › ")
}
