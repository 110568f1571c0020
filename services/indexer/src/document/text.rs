//! Plain text: paragraphs separated by blank lines, no headings, links or front matter.

use super::offsets::trim_span;
use super::{Block, BlockKind, DocumentKind, FrontMatter, ParsedDocument};

pub(crate) fn parse_plain_text(text: String) -> ParsedDocument {
    let blocks = paragraphs(&text)
        .into_iter()
        .map(|(byte_start, byte_end)| Block {
            kind: BlockKind::Paragraph,
            byte_start,
            byte_end,
        })
        .collect();
    ParsedDocument {
        kind: DocumentKind::PlainText,
        text,
        title: None,
        front_matter: FrontMatter::default(),
        body_start: 0,
        headings: Vec::new(),
        blocks,
        links: Vec::new(),
        meta: super::DocumentMeta::default(),
        pages: Vec::new(),
    }
}

/// Byte ranges of runs of non-blank lines, trimmed.
pub(crate) fn paragraphs(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut para_start: Option<usize> = None;
    let mut pos = 0;
    while pos < text.len() {
        let line_end = text[pos..].find('\n').map_or(text.len(), |i| pos + i);
        let blank = text[pos..line_end].trim().is_empty();
        match (blank, para_start) {
            (true, Some(start)) => {
                out.extend(trim_span(text, start, pos));
                para_start = None;
            }
            (false, None) => para_start = Some(pos),
            _ => {}
        }
        pos = line_end + 1;
    }
    if let Some(start) = para_start {
        out.extend(trim_span(text, start, text.len()));
    }
    out
}
