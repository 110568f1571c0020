//! From a file's bytes to the records the graph writer stores: parse, chunk,
//! outline, keys. Pure: no I/O, so it is tested without any store.

use crate::document::{self, ChunkOptions, DocumentKind, DocumentMeta, ParseError, ResolvedLink};
use crate::graph_writer::{ChunkRecord, FileRecord, OutlineRecord};

/// Everything the graph needs for one file version.
#[derive(Debug)]
pub struct IndexedDocument {
    /// The file node.
    pub file: FileRecord,
    /// Chunks in order.
    pub chunks: Vec<ChunkRecord>,
    /// Outline sections in document order.
    pub outline: Vec<OutlineRecord>,
    /// Title, type, tags, dates and collections (also on the FileRef).
    pub meta: DocumentMeta,
    /// Markdown/HTML links resolved against the file's path, in document order.
    pub links: Vec<ResolvedLink>,
}

/// Why a file cannot be indexed; the message is for the file's owner.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Not a format the indexer reads.
    #[error(
        "unsupported file type `{mime}` for {path}: kgmesh indexes Markdown, plain text, HTML, PDF, CSV, TSV, JSON, YAML, TOML and SQL"
    )]
    Unsupported {
        /// The file's path.
        path: String,
        /// Its MIME type.
        mime: String,
    },
    /// The content does not parse.
    #[error("{0}")]
    Parse(#[from] ParseError),
}

/// Identity and flags of the file being indexed.
#[derive(Debug, Clone)]
pub struct FileMeta {
    /// Namespace.
    pub namespace: String,
    /// File id.
    pub file_id: String,
    /// Version id.
    pub version_id: String,
    /// Normalised path inside the namespace.
    pub path: String,
    /// MIME type.
    pub mime: String,
    /// Enabled flag.
    pub enabled: bool,
    /// Hidden flag.
    pub hidden: bool,
}

/// Structured text searched as plain text: data files (the file tools query their
/// structure) and the configuration and schema files teams keep next to their docs.
const STRUCTURED_TEXT_MIMES: &[&str] = &[
    "text/csv",
    "text/tab-separated-values",
    "application/json",
    "application/yaml",
    "application/x-yaml",
    "text/yaml",
    "text/x-yaml",
    "application/toml",
    "application/sql",
    "text/x-sql",
];
const STRUCTURED_TEXT_EXTENSIONS: &[&str] =
    &[".csv", ".tsv", ".json", ".yaml", ".yml", ".toml", ".sql"];

/// Markdown, plain text, HTML and PDF by their own rules; structured text (CSV, TSV, JSON,
/// YAML, TOML, SQL) as plain text.
fn detect_kind(path: &str, mime: &str) -> Option<DocumentKind> {
    DocumentKind::detect(path, mime).or_else(|| {
        let essence = mime.split(';').next().unwrap_or_default().trim();
        let lower = path.to_ascii_lowercase();
        let structured_text = STRUCTURED_TEXT_MIMES.contains(&essence)
            || STRUCTURED_TEXT_EXTENSIONS
                .iter()
                .any(|ext| lower.ends_with(ext));
        structured_text.then_some(DocumentKind::PlainText)
    })
}

/// The kind of document a file of this path and MIME type is read as, or why it is not
/// indexed (an image, an archive): decided before its content is fetched.
pub fn document_kind(path: &str, mime: &str) -> Result<DocumentKind, PipelineError> {
    detect_kind(path, mime).ok_or_else(|| PipelineError::Unsupported {
        path: path.to_owned(),
        mime: mime.to_owned(),
    })
}

/// Parses and chunks one file version into graph records.
pub fn index_document(
    meta: &FileMeta,
    bytes: &[u8],
    options: &ChunkOptions,
) -> Result<IndexedDocument, PipelineError> {
    let kind = document_kind(&meta.path, &meta.mime)?;
    let doc = document::parse(kind, bytes)?;
    for warning in &doc.meta.warnings {
        tracing::warn!(namespace = %meta.namespace, path = %meta.path, "{warning}");
    }
    let spans = document::chunk(&doc, options);
    let sections = document::outline(&doc);

    let name = meta
        .path
        .rsplit('/')
        .next()
        .unwrap_or(&meta.path)
        .to_owned();
    let folder_path = kg_common::access::folder_of(&meta.path).to_owned();
    let doc_title = doc.title.clone().unwrap_or_else(|| name.clone());

    let outline_keys: Vec<String> = sections
        .iter()
        .map(|entry| document::outline_key(&meta.namespace, &meta.file_id, entry))
        .collect();

    let chunks: Vec<ChunkRecord> = spans
        .iter()
        .map(|span| ChunkRecord {
            chunk_key: document::chunk_key(&meta.namespace, &meta.file_id, span),
            index: span.index,
            text: span.text.clone(),
            context_header: document::context_header(&doc_title, &span.heading_path),
            char_start: span.char_start,
            char_end: span.char_end,
            line_start: span.line_start,
            line_end: span.line_end,
            page_start: span.page_start,
            page_end: span.page_end,
            token_count: span.token_count,
            section_key: span.section.and_then(|i| outline_keys.get(i).cloned()),
        })
        .collect();

    let outline = sections
        .iter()
        .zip(&outline_keys)
        .map(|(entry, key)| OutlineRecord {
            outline_key: key.clone(),
            title: entry.title.clone(),
            depth: u32::from(entry.depth),
            order: entry.order,
            parent_key: entry.parent.and_then(|p| outline_keys.get(p).cloned()),
            line_start: entry.line_start,
            line_end: entry.line_end,
            char_start: entry.char_start,
            char_end: entry.char_end,
            page_start: entry.page_start,
            page_end: entry.page_end,
            // A section covers every chunk that starts inside it, subsections included.
            covers: spans
                .iter()
                .zip(&chunks)
                .filter(|(span, _)| {
                    span.byte_start >= entry.byte_start && span.byte_start < entry.byte_end
                })
                .map(|(_, chunk)| chunk.chunk_key.clone())
                .collect(),
        })
        .collect();

    Ok(IndexedDocument {
        file: FileRecord {
            namespace: meta.namespace.clone(),
            file_id: meta.file_id.clone(),
            version_id: meta.version_id.clone(),
            path: meta.path.clone(),
            name,
            folder_path,
            enabled: meta.enabled,
            hidden: meta.hidden,
            title: doc.meta.title.clone(),
            document_date: doc.meta.document_date.clone(),
            mime: meta.mime.clone(),
        },
        chunks,
        outline,
        links: document::resolve_links(&meta.path, &doc.links),
        meta: doc.meta,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn meta(path: &str, mime: &str) -> FileMeta {
        FileMeta {
            namespace: "demo".into(),
            file_id: "f1".into(),
            version_id: "v1".into(),
            path: path.into(),
            mime: mime.into(),
            enabled: true,
            hidden: false,
        }
    }

    #[test]
    fn markdown_becomes_chunks_and_sections_that_point_at_each_other() {
        let text = "---\ntitle: Runbook\ndate: 2024-05-01\n---\n# Deploy\n\nIntro.\n\n## Cutover\n\nThe blue-green cutover window.\n\n## Rollback\n\nRoll back fast.\n";
        let doc = index_document(
            &meta("ops/runbook.md", "text/markdown"),
            text.as_bytes(),
            &ChunkOptions::default(),
        )
        .unwrap();
        assert_eq!(doc.file.title.as_deref(), Some("Runbook"));
        assert_eq!(doc.file.folder_path, "ops/");
        assert_eq!(doc.file.name, "runbook.md");
        assert_eq!(doc.file.document_date.as_deref(), Some("2024-05-01"));
        assert_eq!(doc.outline.len(), 3);
        assert_eq!(
            doc.outline[1].parent_key.as_ref(),
            Some(&doc.outline[0].outline_key)
        );
        let cutover = doc
            .chunks
            .iter()
            .find(|c| c.text.contains("blue-green"))
            .unwrap();
        assert_eq!(
            cutover.section_key.as_ref(),
            Some(&doc.outline[1].outline_key)
        );
        assert!(cutover.context_header.contains("Cutover"));
        // The top section covers its subsections' chunks too.
        assert!(doc.outline[0].covers.contains(&cutover.chunk_key));
        assert!(!doc.outline[2].covers.contains(&cutover.chunk_key));
        let chars: Vec<char> = text.chars().collect();
        for c in &doc.chunks {
            let slice: String = chars[c.char_start as usize..c.char_end as usize]
                .iter()
                .collect();
            assert_eq!(slice, c.text);
        }
    }

    #[test]
    fn csv_and_json_are_searched_as_text() {
        let doc = index_document(
            &meta("data/r.csv", "text/csv"),
            b"region,value\nnorth,1\n",
            &ChunkOptions::default(),
        )
        .unwrap();
        assert_eq!(doc.chunks.len(), 1);
        assert!(doc.outline.is_empty());
        let doc = index_document(
            &meta("s.json", "application/json"),
            br#"{"a": 1}"#,
            &ChunkOptions::default(),
        )
        .unwrap();
        assert_eq!(doc.chunks[0].text, r#"{"a": 1}"#);
        for (path, mime) in [
            ("shop/ontology.yaml", "application/octet-stream"),
            ("shop/seed.sql", "application/sql"),
            ("Cargo.toml", "text/x-toml"),
        ] {
            let doc = index_document(&meta(path, mime), b"key: value\n", &ChunkOptions::default())
                .unwrap();
            assert_eq!(doc.chunks.len(), 1, "{path}");
        }
    }

    #[test]
    fn unsupported_and_invalid_files_say_why() {
        let err = index_document(
            &meta("a.png", "image/png"),
            b"\x89PNG",
            &ChunkOptions::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("unsupported file type"));
        let err = index_document(
            &meta("a.md", "text/markdown"),
            b"ok \xff\xfe",
            &ChunkOptions::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("UTF-8"));
    }
}
