//! HTML via html5ever (through `scraper`'s DOM): the visible text laid out as blocks.
//!
//! The parsed text is plain text built from the DOM, not the markup: paragraphs and other
//! block elements are separated by a blank line, `h1`-`h6` are heading blocks, list items are
//! `- ` / `N. ` lines of one list block, table rows are ` | `-joined cells of one table block,
//! `pre` keeps its whitespace. `script`, `style`, `template`, `noscript` and friends, and
//! elements with the `hidden` attribute, contribute nothing. Offsets index that text.

use scraper::{Html, Node};

use super::meta::{DocumentMeta, Field, field_of};
use super::{Block, BlockKind, DocumentKind, FrontMatter, Heading, Link, LinkKind, ParsedDocument};

/// Elements whose content is never visible text.
const SKIPPED: &[&str] = &[
    "script", "style", "template", "noscript", "iframe", "object", "embed", "svg", "math",
    "canvas", "audio", "video", "select", "datalist",
];

/// Elements that start and end a block of text.
const BLOCKS: &[&str] = &[
    "html",
    "body",
    "p",
    "div",
    "section",
    "article",
    "header",
    "footer",
    "main",
    "nav",
    "aside",
    "blockquote",
    "figure",
    "figcaption",
    "dl",
    "dt",
    "dd",
    "address",
    "details",
    "summary",
    "form",
    "fieldset",
    "legend",
    "center",
    "hgroup",
    "caption",
    "hr",
    "menu",
    "dialog",
    "search",
    "option",
    "textarea",
];

#[derive(Default)]
struct Builder {
    text: String,
    blocks: Vec<Block>,
    headings: Vec<Heading>,
    links: Vec<Link>,
    /// Inline text of the block being built.
    inline: String,
    /// Bytes of `inline` that are a list-item marker, not content.
    prefix_len: usize,
    /// Links opened in this block: (index in `links`, offset in `inline` once text arrives).
    inline_links: Vec<(usize, Option<usize>)>,
    open_links: Vec<usize>,
    space_pending: bool,
    pre_depth: usize,
    /// The open list or table block that further lines join: (kind, index in `blocks`).
    group: Option<(BlockKind, usize)>,
    /// Open lists, innermost last: `None` for `ul`, the next number for `ol`.
    lists: Vec<Option<u32>>,
    table_depth: usize,
    cell_index: usize,
    heading: Option<u8>,
    title: Option<String>,
    in_title: bool,
    metas: Vec<(String, String)>,
}

pub(crate) fn parse_html(source: &str) -> ParsedDocument {
    let html = Html::parse_document(source);
    let mut b = Builder::default();
    // Iterative walk: deeply nested markup must not overflow the stack.
    let mut stack = vec![(html.tree.root(), false)];
    while let Some((node, closing)) = stack.pop() {
        match node.value() {
            Node::Element(el) => {
                let name = el.name();
                if closing {
                    b.close(name);
                    continue;
                }
                if SKIPPED.contains(&name) || el.attr("hidden").is_some() {
                    continue;
                }
                b.open(name, |a| el.attr(a));
                stack.push((node, true));
                let children: Vec<_> = node.children().collect();
                stack.extend(children.into_iter().rev().map(|c| (c, false)));
            }
            Node::Text(t) if !closing => b.push_text(&t.text),
            Node::Document | Node::Fragment if !closing => {
                let children: Vec<_> = node.children().collect();
                stack.extend(children.into_iter().rev().map(|c| (c, false)));
            }
            _ => {}
        }
    }
    b.flush();
    b.finish()
}

impl Builder {
    fn open<'a>(&mut self, name: &str, attr: impl Fn(&str) -> Option<&'a str>) {
        match name {
            "title" => self.in_title = self.title.is_none(),
            "meta" => {
                let key = attr("name").or_else(|| attr("property"));
                if let (Some(key), Some(content)) = (key, attr("content")) {
                    self.metas.push((key.to_owned(), content.to_owned()));
                }
            }
            "br" => {
                if self.pre_depth == 0 && !self.content().is_empty() {
                    self.inline
                        .truncate(self.inline.trim_end_matches(' ').len());
                    self.inline.push('\n');
                }
                self.space_pending = false;
            }
            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => {
                self.flush();
                self.heading = name[1..].parse().ok();
            }
            "pre" => {
                self.flush();
                self.pre_depth += 1;
            }
            "ul" | "ol" => {
                self.flush();
                let start = attr("start")
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(1);
                self.lists.push((name == "ol").then_some(start));
            }
            "li" => {
                self.flush();
                let depth = self.lists.len().saturating_sub(1);
                let marker = match self.lists.last_mut() {
                    Some(Some(n)) => {
                        let m = format!("{n}. ");
                        *n += 1;
                        m
                    }
                    _ => "- ".to_owned(),
                };
                self.inline = format!("{}{marker}", "  ".repeat(depth));
                self.prefix_len = self.inline.len();
            }
            "table" => {
                self.flush();
                self.close_group();
                self.table_depth += 1;
            }
            "tr" => {
                self.flush();
                self.cell_index = 0;
            }
            "td" | "th" => {
                if self.cell_index > 0 {
                    self.inline.push_str(" | ");
                }
                self.space_pending = false;
                self.cell_index += 1;
            }
            "a" => {
                if let Some(href) = attr("href") {
                    self.start_link(LinkKind::Link, href);
                }
            }
            "img" => {
                if let Some(src) = attr("src") {
                    self.start_link(LinkKind::Image, src);
                    let alt = attr("alt").unwrap_or_default().trim().to_owned();
                    if let Some(i) = self.open_links.pop()
                        && let Some(link) = self.links.get_mut(i)
                    {
                        link.text = alt;
                    }
                }
            }
            _ if BLOCKS.contains(&name) => self.flush(),
            _ => {}
        }
    }

    fn close(&mut self, name: &str) {
        match name {
            "title" => self.in_title = false,
            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" | "li" | "tr" => self.flush(),
            "pre" => {
                self.flush();
                self.pre_depth = self.pre_depth.saturating_sub(1);
            }
            "ul" | "ol" => {
                self.flush();
                self.lists.pop();
                if self.lists.is_empty() {
                    self.close_group();
                }
            }
            "table" => {
                self.flush();
                self.close_group();
                self.table_depth = self.table_depth.saturating_sub(1);
            }
            "a" => {
                self.open_links.pop();
            }
            _ if BLOCKS.contains(&name) => self.flush(),
            _ => {}
        }
    }

    fn start_link(&mut self, kind: LinkKind, target: &str) {
        let index = self.links.len();
        self.links.push(Link {
            ordinal: u32::try_from(index).unwrap_or(u32::MAX),
            kind,
            target: target.trim().to_owned(),
            text: String::new(),
            byte_start: self.text.len(),
        });
        self.open_links.push(index);
        self.inline_links.push((index, None));
    }

    /// The inline text after any list marker.
    fn content(&self) -> &str {
        self.inline.get(self.prefix_len..).unwrap_or_default()
    }

    fn push_text(&mut self, text: &str) {
        if self.in_title {
            let title = self.title.get_or_insert_with(String::new);
            title.push_str(text);
            return;
        }
        if self.pre_depth > 0 {
            self.mark_link_starts();
            self.inline.push_str(text);
            self.push_link_text(text);
            return;
        }
        for c in text.chars() {
            if c.is_whitespace() {
                self.space_pending = true;
                continue;
            }
            if self.space_pending
                && !self.content().is_empty()
                && !self.inline.ends_with([' ', '\n'])
            {
                self.inline.push(' ');
                self.push_link_text(" ");
            }
            self.space_pending = false;
            self.mark_link_starts();
            self.inline.push(c);
            let mut buf = [0u8; 4];
            self.push_link_text(c.encode_utf8(&mut buf));
        }
    }

    fn mark_link_starts(&mut self) {
        let at = self.inline.len();
        for (_, offset) in &mut self.inline_links {
            offset.get_or_insert(at);
        }
    }

    fn push_link_text(&mut self, s: &str) {
        for &i in &self.open_links {
            if let Some(link) = self.links.get_mut(i) {
                link.text.push_str(s);
            }
        }
    }

    fn close_group(&mut self) {
        self.group = None;
    }

    /// Ends the current block (or list/table line) and writes it to the text.
    fn flush(&mut self) {
        let inline = std::mem::take(&mut self.inline);
        let prefix_len = std::mem::replace(&mut self.prefix_len, 0);
        let inline_links = std::mem::take(&mut self.inline_links);
        let heading = self.heading.take();
        self.space_pending = false;
        let content = inline.get(prefix_len..).unwrap_or_default();
        let (body, lead) = if self.pre_depth > 0 {
            // Keep indentation; drop leading blank lines and trailing whitespace.
            let lead = content.len() - content.trim_start_matches('\n').len();
            (content[lead..].trim_end(), lead)
        } else {
            let lead = content.len() - content.trim_start().len();
            (content.trim(), lead)
        };
        if body.is_empty() {
            for (i, _) in inline_links {
                if let Some(link) = self.links.get_mut(i) {
                    link.byte_start = self.text.len();
                }
            }
            return;
        }
        let kind = if heading.is_some() {
            BlockKind::Heading
        } else if self.pre_depth > 0 {
            BlockKind::CodeBlock
        } else if self.table_depth > 0 {
            BlockKind::Table
        } else if !self.lists.is_empty() {
            BlockKind::List
        } else {
            BlockKind::Paragraph
        };
        let grouped = matches!(kind, BlockKind::Table | BlockKind::List);
        let joins_group = grouped && self.group.is_some_and(|(k, _)| k == kind);
        if joins_group {
            self.text.push('\n');
        } else {
            self.group = None;
            if !self.text.is_empty() {
                self.text.push_str("\n\n");
            }
        }
        let line_start = self.text.len();
        // List markers stay in the text: they are what makes the line readable as a list.
        let marker = &inline[..prefix_len];
        self.text.push_str(marker);
        let content_start = self.text.len();
        self.text.push_str(body);
        let end = self.text.len();
        for (i, offset) in inline_links {
            if let Some(link) = self.links.get_mut(i) {
                let within = offset.map_or(0, |o| o.saturating_sub(prefix_len + lead));
                link.byte_start = (content_start + within).min(end);
            }
        }
        match (joins_group, self.group) {
            (true, Some((_, block))) => {
                if let Some(b) = self.blocks.get_mut(block) {
                    b.byte_end = end;
                }
            }
            _ => {
                self.blocks.push(Block {
                    kind,
                    byte_start: line_start,
                    byte_end: end,
                });
                if grouped {
                    self.group = Some((kind, self.blocks.len() - 1));
                }
            }
        }
        if let Some(level) = heading {
            self.headings.push(Heading {
                level,
                title: collapse(body),
                byte_start: line_start,
                byte_end: end,
            });
        }
    }

    fn finish(self) -> ParsedDocument {
        let mut meta = DocumentMeta::default();
        if let Some(title) = self
            .title
            .as_deref()
            .map(collapse)
            .filter(|t| !t.is_empty())
        {
            meta.offer(Field::Title, "title", &[title]);
        }
        for (key, content) in &self.metas {
            let field = match key.to_ascii_lowercase().as_str() {
                // `description` is prose, not a field; og:type is a page kind, not a doc type.
                "og:type" | "description" => None,
                other => field_of(other),
            };
            if let Some(field) = field {
                meta.offer(field, key, std::slice::from_ref(content));
            }
        }
        if meta.title.is_none() {
            meta.title = self
                .headings
                .iter()
                .find(|h| h.level == 1)
                .map(|h| h.title.clone());
        }
        let mut links = self.links;
        for link in &mut links {
            link.text = collapse(&link.text);
        }
        ParsedDocument {
            kind: DocumentKind::Html,
            title: meta.title.clone(),
            text: self.text,
            front_matter: FrontMatter::default(),
            body_start: 0,
            headings: self.headings,
            blocks: self.blocks,
            links,
            meta,
            pages: Vec::new(),
        }
    }
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
