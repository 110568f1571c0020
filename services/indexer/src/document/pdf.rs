//! PDF: text per page (pdf-extract over lopdf), page spans, the outline from bookmarks or
//! else from heading-like lines, and metadata from the Info dictionary.
//!
//! The parsed text is the pages' text in order, separated by a blank line, so every block
//! lies on one page. Encrypted, image-only and unreadable PDFs fail with a reason a user can
//! act on.

use std::panic::{AssertUnwindSafe, catch_unwind};

use lopdf::{Document, Object};

use super::meta::{DocumentMeta, Field, field_of};
use super::offsets::trim_span;
use super::text::paragraphs;
use super::{
    Block, BlockKind, DocumentKind, FrontMatter, Heading, PageSpan, ParseError, ParsedDocument,
};

/// Longest line taken for a heading when a PDF has no bookmarks.
const MAX_HEADING_CHARS: usize = 80;
const MAX_HEADING_WORDS: usize = 12;

pub(crate) fn parse_pdf(bytes: &[u8]) -> Result<ParsedDocument, ParseError> {
    let looks_encrypted = contains(bytes, b"/Encrypt");
    let mut doc = match Document::load_mem(bytes) {
        Ok(doc) => doc,
        Err(_) if looks_encrypted => return Err(encrypted()),
        Err(err) => {
            let head = bytes.get(..1024).unwrap_or(bytes);
            return Err(if contains(head, b"%PDF-") {
                ParseError::new(format!(
                    "the PDF is damaged and cannot be read ({err}); export or save it again and re-upload"
                ))
            } else {
                ParseError::new(
                    "the file is not a PDF (no %PDF header); check the file or its name".to_owned(),
                )
            });
        }
    };
    // An owner-password-only PDF opens with the empty user password, as in any viewer.
    if doc.is_encrypted() && doc.decrypt("").is_err() {
        return Err(encrypted());
    }
    let page_ids = doc.get_pages();
    if page_ids.is_empty() {
        return Err(ParseError::new(
            "the PDF has no pages; export it again and re-upload".to_owned(),
        ));
    }

    let mut page_texts = Vec::with_capacity(page_ids.len());
    let mut unreadable = 0usize;
    for &number in page_ids.keys() {
        match extract_page(&doc, number) {
            Some(text) => page_texts.push((number, clean(&text))),
            None => {
                unreadable += 1;
                page_texts.push((number, String::new()));
            }
        }
    }
    if unreadable == page_texts.len() {
        return Err(ParseError::new(
            "the PDF's page content cannot be decoded; print it to a new PDF and re-upload"
                .to_owned(),
        ));
    }
    if page_texts.iter().all(|(_, t)| t.trim().is_empty()) {
        return Err(ParseError::new(
            "the PDF has no text layer (scanned images only); run OCR on it and upload the result"
                .to_owned(),
        ));
    }
    if unreadable > 0 {
        tracing::warn!(
            unreadable,
            pages = page_texts.len(),
            "some PDF pages could not be decoded; indexed without them"
        );
    }

    let mut text = String::new();
    let mut pages = Vec::with_capacity(page_texts.len());
    for (number, page_text) in &page_texts {
        if !text.is_empty() && !page_text.is_empty() {
            text.push_str("\n\n");
        }
        let byte_start = text.len();
        text.push_str(page_text);
        pages.push(PageSpan {
            number: *number,
            byte_start,
            byte_end: text.len(),
        });
    }

    let bookmarks = bookmarks(&doc);
    let heading_lines = if bookmarks.is_empty() {
        heading_like_lines(&text, &pages)
    } else {
        anchor_bookmarks(&text, &pages, &bookmarks)
    };
    let blocks = build_blocks(&text, &pages, &heading_lines);
    let headings: Vec<Heading> = heading_lines
        .into_iter()
        .map(|h| Heading {
            level: h.level,
            title: h.title,
            byte_start: h.byte_start,
            byte_end: h.byte_end,
        })
        .collect();

    let mut meta = info_meta(&doc);
    if meta.title.is_none() {
        // A cover page usually opens with the title; a bookmark like "1 Introduction" is a
        // worse name for the document, so it is only the last resort.
        meta.title = text
            .lines()
            .next()
            .map(collapse)
            .filter(|l| (1..=MAX_HEADING_CHARS).contains(&l.chars().count()))
            .or_else(|| headings.first().map(|h| h.title.clone()));
    }
    Ok(ParsedDocument {
        kind: DocumentKind::Pdf,
        title: meta.title.clone(),
        text,
        front_matter: FrontMatter::default(),
        body_start: 0,
        headings,
        blocks,
        links: Vec::new(),
        meta,
        pages,
    })
}

fn encrypted() -> ParseError {
    ParseError::new(
        "the PDF is encrypted with a password; remove the password (print or export to an unprotected PDF) and re-upload"
            .to_owned(),
    )
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// One page's text; `None` when the page cannot be decoded. pdf-extract panics on some
/// malformed content instead of returning an error, so a panic counts as unreadable.
fn extract_page(doc: &Document, number: u32) -> Option<String> {
    catch_unwind(AssertUnwindSafe(|| {
        let mut out = String::new();
        {
            let mut sink = pdf_extract::PlainTextOutput::new(&mut out);
            pdf_extract::output_doc_page(doc, &mut sink, number).ok()?;
        }
        Some(out)
    }))
    .ok()
    .flatten()
}

/// Newlines normalised, control chars dropped, trailing spaces trimmed, runs of blank lines
/// collapsed to one, and the whole page trimmed.
fn clean(raw: &str) -> String {
    let normalised = raw.replace("\r\n", "\n").replace('\r', "\n");
    let mut out = String::with_capacity(normalised.len());
    let mut blank_run = 0;
    for line in normalised.split('\n') {
        let line: String = line
            .chars()
            .filter(|c| !c.is_control() || *c == '\t')
            .collect();
        let line = line.trim_end();
        if line.trim().is_empty() {
            blank_run += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank_run > 0 { "\n\n" } else { "\n" });
        }
        blank_run = 0;
        out.push_str(line);
    }
    out
}

struct Bookmark {
    level: u8,
    title: String,
    page: u32,
}

/// The document outline (bookmarks) in document order; empty when there is none.
fn bookmarks(doc: &Document) -> Vec<Bookmark> {
    let Ok(toc) = catch_unwind(AssertUnwindSafe(|| doc.get_toc())) else {
        return Vec::new();
    };
    let Ok(toc) = toc else { return Vec::new() };
    toc.toc
        .into_iter()
        .filter_map(|t| {
            let title = collapse(&t.title);
            (!title.is_empty()).then(|| Bookmark {
                level: u8::try_from(t.level.clamp(1, 6)).unwrap_or(6),
                title,
                page: u32::try_from(t.page).unwrap_or(u32::MAX),
            })
        })
        .collect()
}

struct HeadingLine {
    level: u8,
    title: String,
    byte_start: usize,
    byte_end: usize,
}

/// Lines of `text[start..end]` as trimmed, non-empty byte ranges.
fn lines_in(text: &str, start: usize, end: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = start;
    while pos < end {
        let line_end = text[pos..end].find('\n').map_or(end, |i| pos + i);
        if let Some(span) = trim_span(text, pos, line_end) {
            out.push(span);
        }
        pos = line_end + 1;
    }
    out
}

fn norm(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Places each bookmark on the line of its page that carries its title (else the first line
/// of the page not taken yet), keeping document order; a bookmark with no line left is
/// dropped. The outline title is the bookmark's, whatever the line says.
fn anchor_bookmarks(text: &str, pages: &[PageSpan], bookmarks: &[Bookmark]) -> Vec<HeadingLine> {
    let mut out: Vec<HeadingLine> = Vec::new();
    for bm in bookmarks {
        let Some(page) = pages.iter().find(|p| p.number == bm.page) else {
            continue;
        };
        let floor = out.last().map_or(0, |h| h.byte_end);
        let candidates: Vec<(usize, usize)> = lines_in(text, page.byte_start, page.byte_end)
            .into_iter()
            .filter(|&(s, _)| s >= floor)
            .collect();
        let wanted = norm(&bm.title);
        let lines: Vec<String> = candidates.iter().map(|&(s, e)| norm(&text[s..e])).collect();
        // Best match first: the exact line, the line behind its numbering ("1.1 Cash Flow"),
        // a short line that starts with the title; else the first free line of the page.
        let hit = lines
            .iter()
            .position(|l| *l == wanted)
            .or_else(|| lines.iter().position(|l| strip_numbering(l) == wanted))
            .or_else(|| {
                lines.iter().position(|l| {
                    wanted.len() >= 4 && l.starts_with(&wanted) && l.len() <= wanted.len() + 16
                })
            })
            .or((!candidates.is_empty()).then_some(0))
            .and_then(|i| candidates.get(i));
        if let Some(&(byte_start, byte_end)) = hit {
            out.push(HeadingLine {
                level: bm.level,
                title: bm.title.clone(),
                byte_start,
                byte_end,
            });
        }
    }
    out
}

/// Without bookmarks: a line that is a paragraph of its own, short, without sentence
/// punctuation at its end, and numbered (`2.1 Scope` -> level 2) or written in capitals
/// (level 1) or Title Case followed by more text (level 1, or one below the last numbered
/// heading).
/// `l` without a leading section number (`1.`, `2.3`, `iv.`, `a)`).
fn strip_numbering(l: &str) -> &str {
    match l.split_once(' ') {
        Some((first, rest))
            if first.trim_end_matches(['.', ')']).split('.').all(|p| {
                !p.is_empty() && p.len() <= 4 && p.chars().all(|c| c.is_ascii_alphanumeric())
            }) && first
                .chars()
                .any(|c| c.is_ascii_digit() || matches!(c, '.' | ')')) =>
        {
            rest.trim_start()
        }
        _ => l,
    }
}

fn heading_like_lines(text: &str, pages: &[PageSpan]) -> Vec<HeadingLine> {
    let mut out = Vec::new();
    for page in pages {
        let paras = paragraphs(&text[page.byte_start..page.byte_end]);
        for (i, &(s, e)) in paras.iter().enumerate() {
            let (s, e) = (page.byte_start + s, page.byte_start + e);
            let line = &text[s..e];
            if line.contains('\n') || (i + 1 == paras.len() && page.byte_end == text.len()) {
                continue;
            }
            if let Some(level) = heading_level(line) {
                out.push(HeadingLine {
                    level,
                    title: collapse(line),
                    byte_start: s,
                    byte_end: e,
                });
            }
        }
    }
    out
}

fn heading_level(line: &str) -> Option<u8> {
    let line = line.trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    if line.chars().count() > MAX_HEADING_CHARS
        || words.is_empty()
        || words.len() > MAX_HEADING_WORDS
        || line.ends_with(['.', ',', ';', ':', '!', '?'])
        || !line.chars().any(char::is_alphabetic)
    {
        return None;
    }
    // "1", "2.1", "3.2.1." followed by words.
    let first = words[0].trim_end_matches('.');
    if words.len() > 1
        && !first.is_empty()
        && first
            .split('.')
            .all(|n| !n.is_empty() && n.len() <= 3 && n.chars().all(|c| c.is_ascii_digit()))
    {
        let depth = first.split('.').count();
        return Some(u8::try_from(depth.clamp(1, 6)).unwrap_or(6));
    }
    let letters: Vec<char> = line.chars().filter(|c| c.is_alphabetic()).collect();
    if letters.len() >= 3 && letters.iter().all(|c| c.is_uppercase()) {
        return Some(1);
    }
    let title_case = words.iter().all(|w| {
        let significant = w.chars().count() > 3;
        !significant
            || w.chars()
                .next()
                .is_some_and(|c| c.is_uppercase() || !c.is_alphabetic())
    }) && words[0].chars().next().is_some_and(char::is_uppercase);
    (title_case && words.len() >= 2).then_some(1)
}

/// Paragraph blocks per page, with every heading line a block of its own.
fn build_blocks(text: &str, pages: &[PageSpan], headings: &[HeadingLine]) -> Vec<Block> {
    let mut blocks = Vec::new();
    for page in pages {
        for (s, e) in paragraphs(&text[page.byte_start..page.byte_end]) {
            let (para_start, e) = (page.byte_start + s, page.byte_start + e);
            let mut s = para_start;
            for h in headings
                .iter()
                .filter(|h| h.byte_start >= para_start && h.byte_end <= e)
            {
                if let Some((bs, be)) = trim_span(text, s, h.byte_start) {
                    blocks.push(Block {
                        kind: BlockKind::Paragraph,
                        byte_start: bs,
                        byte_end: be,
                    });
                }
                blocks.push(Block {
                    kind: BlockKind::Heading,
                    byte_start: h.byte_start,
                    byte_end: h.byte_end,
                });
                s = h.byte_end;
            }
            if let Some((bs, be)) = trim_span(text, s, e) {
                blocks.push(Block {
                    kind: BlockKind::Paragraph,
                    byte_start: bs,
                    byte_end: be,
                });
            }
        }
    }
    blocks
}

/// Title, tags (Keywords), document date (CreationDate) and any custom keys that name a
/// metadata field (`/DocType`, `/Collections`, `/EffectiveFrom`, ...).
fn info_meta(doc: &Document) -> DocumentMeta {
    let mut meta = DocumentMeta::default();
    let info = match doc.trailer.get(b"Info") {
        Ok(Object::Reference(id)) => doc.get_dictionary(*id).ok(),
        Ok(Object::Dictionary(d)) => Some(d),
        _ => None,
    };
    let Some(info) = info else { return meta };
    let mut entries: Vec<(String, String)> = info
        .iter()
        .filter_map(|(key, value)| {
            let value = match value {
                Object::Reference(id) => doc.get_object(*id).ok()?,
                v => v,
            };
            let text = lopdf::decode_text_string(value).ok()?;
            Some((String::from_utf8_lossy(key).into_owned(), collapse(&text)))
        })
        .filter(|(_, v)| !v.is_empty())
        .collect();
    // Title first, CreationDate before ModDate: the first value a field gets wins.
    entries.sort_by_key(|(k, _)| match k.as_str() {
        "Title" => 0,
        "CreationDate" => 1,
        _ => 2,
    });
    for (key, value) in entries {
        let field = match key.as_str() {
            "Title" => Some(Field::Title),
            "Keywords" => Some(Field::Tags),
            "CreationDate" => Some(Field::DocumentDate),
            // Prose or producer details, not metadata fields.
            "Subject" | "ModDate" | "Author" | "Creator" | "Producer" | "Trapped" => None,
            other => field_of(other),
        };
        if let Some(field) = field {
            meta.offer(field, &key, &[value]);
        }
    }
    meta
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
