//! Pure document pipeline: bytes -> parsed text with blocks, headings, links and front matter,
//! then chunks with exact char/byte/line offsets, the heading outline and stable keys.
//! No I/O and no stores: everything here is a function of its inputs.

mod chunk;
mod event;
mod frontmatter;
mod html;
mod keys;
mod links;
mod markdown;
mod meta;
mod offsets;
mod outline;
mod pdf;
mod text;
mod tokens;

pub use chunk::{ChunkOptions, ChunkSpan, chunk};
pub use event::{MAX_EVENT_LINK_BYTES, indexed_event_fields};
pub use frontmatter::{FrontMatter, FrontMatterValue};
pub use keys::{chunk_key, context_header, outline_key};
pub use links::{LinkTargetKind, ResolvedLink, resolve_link, resolve_links};
pub use meta::{DocumentMeta, normalize_date};
pub use outline::{OutlineEntry, outline};
pub use tokens::{count_tokens, estimate_tokens};

/// The document formats this pipeline understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DocumentKind {
    Markdown,
    PlainText,
    Html,
    Pdf,
}

const MARKDOWN_EXTENSIONS: &[&str] = &["md", "markdown", "mdown", "mkd", "mkdn", "mdwn", "mdtxt"];
const TEXT_EXTENSIONS: &[&str] = &["txt", "text", "log"];
const HTML_EXTENSIONS: &[&str] = &["html", "htm", "xhtml"];

impl DocumentKind {
    /// Picks the kind from the MIME type and the path's extension.
    ///
    /// A Markdown MIME type, or a Markdown extension with a generic or `text/*` type (uploads
    /// often send `.md` as `text/plain` or `application/octet-stream`), gives Markdown;
    /// `text/plain`, or a `.txt`/`.text`/`.log` name with such a type, gives plain text;
    /// an HTML type or `.html`/`.htm`/`.xhtml` name gives HTML; `application/pdf`, or a `.pdf`
    /// name with a generic type, gives PDF; anything else (images, archives) gives `None`.
    pub fn detect(path: &str, mime: &str) -> Option<DocumentKind> {
        let mime = mime
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let file_name = path.rsplit(['/', '\\']).next().unwrap_or_default();
        let ext = file_name
            .rsplit_once('.')
            .map(|(stem, ext)| if stem.is_empty() { "" } else { ext })
            .unwrap_or_default()
            .to_ascii_lowercase();
        let ext = ext.as_str();
        // A specific non-text type (image/png, application/pdf) overrides the extension.
        let textual =
            mime.is_empty() || mime == "application/octet-stream" || mime.starts_with("text/");
        if matches!(mime.as_str(), "text/markdown" | "text/x-markdown")
            || (textual && MARKDOWN_EXTENSIONS.contains(&ext))
        {
            return Some(DocumentKind::Markdown);
        }
        if matches!(mime.as_str(), "text/html" | "application/xhtml+xml")
            || (textual && HTML_EXTENSIONS.contains(&ext))
        {
            return Some(DocumentKind::Html);
        }
        if matches!(mime.as_str(), "application/pdf" | "application/x-pdf")
            || ((mime.is_empty() || mime == "application/octet-stream") && ext == "pdf")
        {
            return Some(DocumentKind::Pdf);
        }
        if mime == "text/plain" || (textual && TEXT_EXTENSIONS.contains(&ext)) {
            return Some(DocumentKind::PlainText);
        }
        None
    }
}

/// Why a file could not be parsed, phrased so the file's owner can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct ParseError {
    reason: String,
    byte_offset: Option<usize>,
}

impl ParseError {
    pub(crate) fn new(reason: String) -> Self {
        Self {
            reason,
            byte_offset: None,
        }
    }

    fn at(byte_offset: usize, reason: String) -> Self {
        Self {
            reason,
            byte_offset: Some(byte_offset),
        }
    }

    /// The human-readable reason, e.g. "file is not valid UTF-8 at byte 1234".
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Offset in the original file bytes where the problem is, when there is one.
    pub fn byte_offset(&self) -> Option<usize> {
        self.byte_offset
    }
}

/// What a top-level block is; chunk boundaries fall only between blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockKind {
    Paragraph,
    Heading,
    List,
    CodeBlock,
    Table,
    BlockQuote,
    Html,
    ThematicBreak,
    FootnoteDefinition,
    DefinitionList,
    /// Text the Markdown parser emits no event for (link reference definitions and the like);
    /// kept so every non-blank byte of the body lands in some chunk.
    Other,
}

/// A top-level block as a byte range of [`ParsedDocument::text`], trimmed of trailing whitespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub kind: BlockKind,
    pub byte_start: usize,
    pub byte_end: usize,
}

/// A top-level heading (headings nested in lists or block quotes do not open sections).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heading {
    /// The Markdown level, 1..=6.
    pub level: u8,
    /// Inline text with markup stripped and whitespace collapsed; never empty.
    pub title: String,
    /// Byte range of the heading line(s) (both lines for a setext heading), without the newline.
    pub byte_start: usize,
    pub byte_end: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    Link,
    Image,
    /// An Obsidian-style `[[Page]]` or `[[Page|label]]` link.
    WikiLink,
}

/// A Markdown link or image, in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// 0-based position among the document's links.
    pub ordinal: u32,
    pub kind: LinkKind,
    /// The destination as written (angle brackets and title removed, reference links resolved).
    pub target: String,
    /// The link text (an image's alt text), markup stripped.
    pub text: String,
    /// Byte offset in [`ParsedDocument::text`] where the link starts.
    pub byte_start: usize,
}

/// One PDF page as a byte range of [`ParsedDocument::text`] (empty for a page without text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageSpan {
    /// 1-based page number.
    pub number: u32,
    pub byte_start: usize,
    pub byte_end: usize,
}

/// The result of [`parse`]: all offsets index into `text`.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedDocument {
    pub kind: DocumentKind,
    /// The file's text: UTF-8, BOM removed, CRLF and lone CR normalised to LF. For HTML the
    /// visible text laid out in blocks; for PDF the pages' text separated by blank lines.
    pub text: String,
    /// Front matter `title` (HTML `<title>`, PDF Info Title), else the first H1 (the first
    /// bookmark or heading-like line of a PDF). Same as `meta.title`.
    pub title: Option<String>,
    pub front_matter: FrontMatter,
    /// Byte offset where the body starts (just after the front matter block; 0 without one).
    pub body_start: usize,
    pub headings: Vec<Heading>,
    pub blocks: Vec<Block>,
    /// Markdown and HTML links (`<a href>`, `<img src>`) in document order.
    pub links: Vec<Link>,
    /// Title, type, tags, dates and collections from front matter, `<title>`/`<meta>` or
    /// the PDF Info dictionary.
    pub meta: DocumentMeta,
    /// PDF pages in order; empty for other formats.
    pub pages: Vec<PageSpan>,
}

impl ParsedDocument {
    /// 1-based first and last page of the byte range `start..end`, for PDFs.
    pub fn page_span(&self, start: usize, end: usize) -> Option<(u32, u32)> {
        if self.pages.is_empty() {
            return None;
        }
        let last = if end > start { end - 1 } else { start };
        Some((self.page_at(start), self.page_at(last)))
    }

    /// The page holding `byte` (the page before, for bytes between pages).
    fn page_at(&self, byte: usize) -> u32 {
        let idx = self
            .pages
            .partition_point(|p| p.byte_start <= byte)
            .saturating_sub(1);
        self.pages.get(idx).map_or(1, |p| p.number)
    }
}

/// Decodes and parses a document. Fails on bytes that are not text, and on PDFs that are
/// encrypted, damaged or have no text layer.
pub fn parse(kind: DocumentKind, bytes: &[u8]) -> Result<ParsedDocument, ParseError> {
    if kind == DocumentKind::Pdf {
        return pdf::parse_pdf(bytes);
    }
    let text = decode_text(bytes)?;
    Ok(match kind {
        DocumentKind::Markdown => markdown::parse_markdown(text),
        DocumentKind::Html => html::parse_html(&text),
        DocumentKind::PlainText | DocumentKind::Pdf => text::parse_plain_text(text),
    })
}

/// UTF-8 check (offsets reported against the original bytes), BOM removal and newline normalisation.
fn decode_text(bytes: &[u8]) -> Result<String, ParseError> {
    let raw = match std::str::from_utf8(bytes) {
        Ok(raw) => raw,
        Err(err) => {
            let at = err.valid_up_to();
            return Err(ParseError::at(
                at,
                format!(
                    "file is not valid UTF-8 at byte {at}; save it as UTF-8 text and upload it again"
                ),
            ));
        }
    };
    // A NUL byte means binary data with a text name; chunking it would index garbage.
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        return Err(ParseError::at(
            at,
            format!("file contains a NUL byte at byte {at}; it looks like binary data, not text"),
        ));
    }
    let raw = raw.strip_prefix('\u{FEFF}').unwrap_or(raw);
    if !raw.contains('\r') {
        return Ok(raw.to_owned());
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\r' {
            if chars.peek() == Some(&'\n') {
                chars.next();
            }
            out.push('\n');
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_formats;
