//! The heading outline: one entry per top-level heading, nested by level.

use super::ParsedDocument;
use super::offsets::OffsetIndex;

/// A section of the document, in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutlineEntry {
    /// 0-based position in the outline (= index in the returned Vec).
    pub order: u32,
    pub title: String,
    /// 1-based nesting depth: an H3 directly under an H1 has depth 2.
    pub depth: u8,
    /// Index of the enclosing section: the nearest earlier heading of a lower level.
    pub parent: Option<usize>,
    /// The section: from its heading to the next heading of the same or a higher level
    /// (a lower or equal level number), or the end of the text.
    pub byte_start: usize,
    pub byte_end: usize,
    pub char_start: u64,
    pub char_end: u64,
    /// 1-based, inclusive.
    pub line_start: u32,
    pub line_end: u32,
    /// The raw Markdown heading level, 1..=6.
    pub level: u8,
    /// 1-based, inclusive PDF pages of the section; `None` for other formats.
    pub page_start: Option<u32>,
    pub page_end: Option<u32>,
}

pub fn outline(doc: &ParsedDocument) -> Vec<OutlineEntry> {
    let index = OffsetIndex::new(&doc.text);
    outline_with(doc, &index)
}

pub(crate) fn outline_with(doc: &ParsedDocument, index: &OffsetIndex<'_>) -> Vec<OutlineEntry> {
    let headings = &doc.headings;
    let mut entries: Vec<OutlineEntry> = Vec::with_capacity(headings.len());
    // Open sections, innermost last.
    let mut stack: Vec<usize> = Vec::new();
    for (i, heading) in headings.iter().enumerate() {
        while stack
            .last()
            .is_some_and(|&open| headings[open].level >= heading.level)
        {
            stack.pop();
        }
        let parent = stack.last().copied();
        let depth = parent.map_or(1, |p| entries[p].depth.saturating_add(1));
        let byte_start = heading.byte_start;
        let byte_end = headings[i + 1..]
            .iter()
            .find(|next| next.level <= heading.level)
            .map_or(doc.text.len(), |next| next.byte_start);
        let (line_start, line_end) = index.line_span(byte_start, byte_end);
        // The section ends where the next one starts: count its pages without that byte.
        let pages = doc.page_span(byte_start, trimmed_end(&doc.text, byte_start, byte_end));
        entries.push(OutlineEntry {
            page_start: pages.map(|(a, _)| a),
            page_end: pages.map(|(_, b)| b),
            order: u32::try_from(i).unwrap_or(u32::MAX),
            title: heading.title.clone(),
            depth,
            parent,
            byte_start,
            byte_end,
            char_start: index.char_of(byte_start),
            char_end: index.char_of(byte_end),
            line_start,
            line_end,
            level: heading.level,
        });
        stack.push(i);
    }
    entries
}

/// Index of the deepest section containing `byte`: the last heading at or before it.
pub(crate) fn section_at(entries: &[OutlineEntry], byte: usize) -> Option<usize> {
    entries
        .partition_point(|e| e.byte_start <= byte)
        .checked_sub(1)
}

/// Titles of `section` and its ancestors, root first.
pub(crate) fn heading_path(entries: &[OutlineEntry], section: Option<usize>) -> Vec<String> {
    let mut path = Vec::new();
    let mut at = section;
    while let Some(i) = at {
        let Some(entry) = entries.get(i) else { break };
        path.push(entry.title.clone());
        at = entry.parent;
    }
    path.reverse();
    path
}

/// `end` moved back over trailing whitespace (not before `start + 1`).
fn trimmed_end(text: &str, start: usize, end: usize) -> usize {
    let content = text.get(start..end).map_or(0, |s| s.trim_end().len());
    start + content.max(1).min(end - start)
}
