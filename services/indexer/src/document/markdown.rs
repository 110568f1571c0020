//! Markdown via pulldown-cmark: top-level blocks, top-level headings, links and images.

use pulldown_cmark::{Event, LinkType, Options, Parser, Tag, TagEnd};

use super::frontmatter::split_front_matter;
use super::meta::DocumentMeta;
use super::offsets::{fill_gaps, trim_span};
use super::{Block, BlockKind, DocumentKind, Heading, Link, LinkKind, ParsedDocument};

fn options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_HEADING_ATTRIBUTES
        | Options::ENABLE_GFM
        | Options::ENABLE_DEFINITION_LIST
        | Options::ENABLE_WIKILINKS
}

struct OpenHeading {
    level: u8,
    block: usize,
    title: String,
}

pub(crate) fn parse_markdown(text: String) -> ParsedDocument {
    let (body_start, front_matter) = split_front_matter(&text).unwrap_or_default();
    let body = &text[body_start..];

    let mut raw_blocks: Vec<(BlockKind, usize, usize)> = Vec::new();
    let mut raw_headings: Vec<(u8, usize, String)> = Vec::new();
    let mut links: Vec<Link> = Vec::new();
    let mut open_links: Vec<usize> = Vec::new();
    let mut heading: Option<OpenHeading> = None;
    let mut depth = 0usize;

    for (event, range) in Parser::new_ext(body, options()).into_offset_iter() {
        let (start, end) = (range.start + body_start, range.end + body_start);
        match event {
            Event::Start(tag) => {
                if depth == 0 {
                    raw_blocks.push((block_kind(&tag), start, end));
                    if let Tag::Heading { level, .. } = &tag {
                        heading = Some(OpenHeading {
                            level: *level as u8,
                            block: raw_blocks.len() - 1,
                            title: String::new(),
                        });
                    }
                }
                let link = match &tag {
                    Tag::Link {
                        link_type,
                        dest_url,
                        ..
                    } => Some((link_kind(*link_type, LinkKind::Link), dest_url)),
                    Tag::Image {
                        link_type,
                        dest_url,
                        ..
                    } => Some((link_kind(*link_type, LinkKind::Image), dest_url)),
                    _ => None,
                };
                if let Some((kind, dest_url)) = link {
                    open_links.push(links.len());
                    links.push(Link {
                        ordinal: u32::try_from(links.len()).unwrap_or(u32::MAX),
                        kind,
                        target: dest_url.to_string(),
                        text: String::new(),
                        byte_start: start,
                    });
                }
                depth += 1;
            }
            Event::End(tag_end) => {
                depth = depth.saturating_sub(1);
                match tag_end {
                    TagEnd::Link | TagEnd::Image => {
                        if let Some(link) = open_links.pop().and_then(|i| links.get_mut(i)) {
                            link.text = collapse_whitespace(&link.text);
                        }
                    }
                    TagEnd::Heading(_) if depth == 0 => {
                        if let Some(open) = heading.take() {
                            raw_headings.push((
                                open.level,
                                open.block,
                                collapse_whitespace(&open.title),
                            ));
                        }
                    }
                    _ => {}
                }
            }
            Event::Text(s) | Event::Code(s) | Event::InlineMath(s) | Event::DisplayMath(s) => {
                push_inline(&mut heading, &mut links, &open_links, &s);
            }
            Event::SoftBreak | Event::HardBreak => {
                push_inline(&mut heading, &mut links, &open_links, " ");
            }
            Event::Rule if depth == 0 => raw_blocks.push((BlockKind::ThematicBreak, start, end)),
            Event::Html(_) if depth == 0 => raw_blocks.push((BlockKind::Html, start, end)),
            _ => {}
        }
    }

    let (blocks, block_of_raw) = normalise_blocks(&text, body_start, &raw_blocks);
    let headings: Vec<Heading> = raw_headings
        .into_iter()
        .filter(|(_, _, title)| !title.is_empty())
        .filter_map(|(level, raw, title)| {
            let block = blocks.get(block_of_raw.get(raw).copied().flatten()?)?;
            Some(Heading {
                level,
                title,
                byte_start: block.byte_start,
                byte_end: block.byte_end,
            })
        })
        .collect();
    let first_h1 = headings
        .iter()
        .find(|h| h.level == 1)
        .map(|h| h.title.clone());
    let meta = DocumentMeta::from_front_matter(&front_matter, first_h1);
    let title = meta.title.clone();
    ParsedDocument {
        kind: DocumentKind::Markdown,
        text,
        title,
        front_matter,
        body_start,
        headings,
        blocks,
        links,
        meta,
        pages: Vec::new(),
    }
}

fn push_inline(
    heading: &mut Option<OpenHeading>,
    links: &mut [Link],
    open_links: &[usize],
    s: &str,
) {
    if let Some(open) = heading {
        open.title.push_str(s);
    }
    for &i in open_links {
        if let Some(link) = links.get_mut(i) {
            link.text.push_str(s);
        }
    }
}

fn collapse_whitespace(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn link_kind(link_type: LinkType, default: LinkKind) -> LinkKind {
    match link_type {
        LinkType::WikiLink { .. } => LinkKind::WikiLink,
        _ => default,
    }
}

fn block_kind(tag: &Tag<'_>) -> BlockKind {
    match tag {
        Tag::Paragraph => BlockKind::Paragraph,
        Tag::Heading { .. } => BlockKind::Heading,
        Tag::BlockQuote(_) => BlockKind::BlockQuote,
        Tag::CodeBlock(_) => BlockKind::CodeBlock,
        Tag::HtmlBlock => BlockKind::Html,
        Tag::List(_) | Tag::Item => BlockKind::List,
        Tag::FootnoteDefinition(_) => BlockKind::FootnoteDefinition,
        Tag::DefinitionList | Tag::DefinitionListTitle | Tag::DefinitionListDefinition => {
            BlockKind::DefinitionList
        }
        Tag::Table(_) | Tag::TableHead | Tag::TableRow | Tag::TableCell => BlockKind::Table,
        _ => BlockKind::Other,
    }
}

/// Trims each raw block (keeping the first line's indentation), keeps them disjoint and in
/// order, and adds `Other` blocks for body text the parser emitted no event for. Returns the
/// blocks and, per raw block, its index in the result.
fn normalise_blocks(
    text: &str,
    body_start: usize,
    raw: &[(BlockKind, usize, usize)],
) -> (Vec<Block>, Vec<Option<usize>>) {
    let mut trimmed: Vec<(BlockKind, usize, usize, Option<usize>)> = Vec::new();
    let mut cursor = body_start;
    for (raw_index, &(kind, start, end)) in raw.iter().enumerate() {
        let start = start.max(cursor);
        let Some((s, e)) = trim_span(text, start, end.max(start)) else {
            continue;
        };
        cursor = e;
        trimmed.push((kind, s, e, Some(raw_index)));
    }
    let spans: Vec<(usize, usize)> = trimmed.iter().map(|&(_, s, e, _)| (s, e)).collect();
    for (s, e) in fill_gaps(text, (body_start, text.len()), &spans) {
        trimmed.push((BlockKind::Other, s, e, None));
    }
    trimmed.sort_by_key(|&(_, s, _, _)| s);

    let mut block_of_raw = vec![None; raw.len()];
    let blocks = trimmed
        .into_iter()
        .enumerate()
        .map(|(i, (kind, byte_start, byte_end, raw_index))| {
            if let Some(slot) = raw_index.and_then(|r| block_of_raw.get_mut(r)) {
                *slot = Some(i);
            }
            Block {
                kind,
                byte_start,
                byte_end,
            }
        })
        .collect();
    (blocks, block_of_raw)
}
