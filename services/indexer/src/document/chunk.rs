//! Structure-aware chunking with exact offsets.
//!
//! Blocks are packed whole into chunks of about `target_tokens`; a heading always opens a
//! new chunk (and takes the content after it along), so no chunk mixes two sections. Only a
//! block over `max_tokens` is cut, at the coarsest boundary that works: blank line, line,
//! sentence, whitespace, and as a last resort a char boundary.

use std::collections::HashSet;

use super::ParsedDocument;
use super::offsets::{OffsetIndex, trim_span};
use super::outline::{heading_path, outline_with, section_at};
use super::tokens::count_tokens;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkOptions {
    /// Blocks are packed into a chunk until the next one would pass this.
    pub target_tokens: usize,
    /// Hard cap on a chunk's tokens (overlap included).
    pub max_tokens: usize,
    /// When > 0, a chunk that continues the previous chunk's section starts with up to this
    /// many tokens of its tail, cut at a sentence (else whitespace) boundary. Never crosses
    /// a heading.
    pub overlap_tokens: usize,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        Self {
            target_tokens: 300,
            max_tokens: 512,
            overlap_tokens: 0,
        }
    }
}

impl ChunkOptions {
    /// max >= 1 and 1 <= target <= max, so odd settings still give bounded, non-empty chunks.
    fn normalised(&self) -> Self {
        let max_tokens = self.max_tokens.max(1);
        Self {
            target_tokens: self.target_tokens.clamp(1, max_tokens),
            max_tokens,
            overlap_tokens: self.overlap_tokens,
        }
    }
}

/// One chunk: `text` is exactly `doc.text[byte_start..byte_end]`, which is also the
/// `char_start..char_end` range counted in chars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkSpan {
    pub index: u32,
    pub char_start: u64,
    pub char_end: u64,
    pub byte_start: usize,
    pub byte_end: usize,
    /// 1-based, inclusive.
    pub line_start: u32,
    pub line_end: u32,
    /// 1-based, inclusive PDF pages the chunk spans; `None` for other formats.
    pub page_start: Option<u32>,
    pub page_end: Option<u32>,
    /// cl100k_base tokens of `text` (see [`super::count_tokens`]).
    pub token_count: u32,
    pub text: String,
    /// Index into [`super::outline`] of the deepest section holding the chunk start.
    pub section: Option<usize>,
    /// Titles of that section and its ancestors, root first.
    pub heading_path: Vec<String>,
}

/// A piece chunks are built from: a whole block, or part of an oversized one.
#[derive(Debug, Clone, Copy)]
struct Unit {
    start: usize,
    end: usize,
    tokens: usize,
    /// Opens a section: a chunk must start here.
    heading: bool,
}

/// A chunk before overlap and offsets.
#[derive(Debug, Clone, Copy)]
struct Packed {
    start: usize,
    end: usize,
    tokens: usize,
    /// End of the heading the chunk starts with, if it starts a section.
    heading_end: Option<usize>,
}

pub fn chunk(doc: &ParsedDocument, opts: &ChunkOptions) -> Vec<ChunkSpan> {
    let opts = opts.normalised();
    let text = doc.text.as_str();
    let index = OffsetIndex::new(text);
    let entries = outline_with(doc, &index);

    let units = build_units(doc, &opts);
    let mut packed = pack(text, &units, &opts);
    if opts.overlap_tokens > 0 {
        add_overlap(text, &mut packed, &opts);
    }

    packed
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let (line_start, line_end) = index.line_span(p.start, p.end);
            let section = section_at(&entries, p.start);
            let pages = doc.page_span(p.start, p.end);
            ChunkSpan {
                page_start: pages.map(|(a, _)| a),
                page_end: pages.map(|(_, b)| b),
                index: u32::try_from(i).unwrap_or(u32::MAX),
                char_start: index.char_of(p.start),
                char_end: index.char_of(p.end),
                byte_start: p.start,
                byte_end: p.end,
                line_start,
                line_end,
                token_count: u32::try_from(p.tokens).unwrap_or(u32::MAX),
                text: text[p.start..p.end].to_owned(),
                section,
                heading_path: heading_path(&entries, section),
            }
        })
        .collect()
}

fn build_units(doc: &ParsedDocument, opts: &ChunkOptions) -> Vec<Unit> {
    let text = doc.text.as_str();
    let heading_starts: HashSet<usize> = doc.headings.iter().map(|h| h.byte_start).collect();
    let mut units = Vec::with_capacity(doc.blocks.len());
    for block in &doc.blocks {
        let Some((start, end)) = trim_span(text, block.byte_start, block.byte_end) else {
            continue;
        };
        let heading = heading_starts.contains(&block.byte_start);
        let tokens = count_tokens(&text[start..end]);
        if tokens <= opts.max_tokens {
            units.push(Unit {
                start,
                end,
                tokens,
                heading,
            });
            continue;
        }
        let mut pieces = Vec::new();
        split_oversized(
            text,
            start,
            end,
            opts.max_tokens,
            Level::Paragraph,
            &mut pieces,
        );
        for (i, (start, end, tokens)) in pieces.into_iter().enumerate() {
            units.push(Unit {
                start,
                end,
                tokens,
                heading: heading && i == 0,
            });
        }
    }
    units
}

/// Greedy packing: a heading opens a chunk and takes the next unit if both fit in
/// `max_tokens`; otherwise units join while the sum stays within `target_tokens`. The real
/// count of the joined text is checked against `max_tokens`, dropping units from the end.
fn pack(text: &str, units: &[Unit], opts: &ChunkOptions) -> Vec<Packed> {
    // Joining whitespace between blocks usually costs a token; the real count decides anyway.
    const JOIN: usize = 1;
    let mut out = Vec::new();
    let mut i = 0;
    while i < units.len() {
        let first = units[i];
        let mut j = i + 1;
        let mut tokens = first.tokens;
        if first.heading
            && let Some(next) = units.get(j).filter(|u| !u.heading)
            && tokens + JOIN + next.tokens <= opts.max_tokens
        {
            tokens += JOIN + next.tokens;
            j += 1;
        }
        while let Some(next) = units.get(j).filter(|u| !u.heading) {
            if tokens + JOIN + next.tokens > opts.target_tokens {
                break;
            }
            tokens += JOIN + next.tokens;
            j += 1;
        }
        let start = first.start;
        let (end, tokens) = loop {
            let end = units[j - 1].end;
            if j - i == 1 {
                break (end, first.tokens);
            }
            let real = count_tokens(&text[start..end]);
            if real <= opts.max_tokens {
                break (end, real);
            }
            j -= 1;
        };
        out.push(Packed {
            start,
            end,
            tokens,
            heading_end: first.heading.then_some(first.end),
        });
        i = j;
    }
    out
}

/// Moves each chunk's start back into the previous chunk's tail when both are in the same
/// section, keeping the total within `max_tokens`.
fn add_overlap(text: &str, packed: &mut [Packed], opts: &ChunkOptions) {
    // Tails come from the previous chunk as packed, not as already extended by its overlap.
    let original = packed.to_vec();
    for k in 1..packed.len() {
        let (prev, cur) = (original[k - 1], original[k]);
        if cur.heading_end.is_some() {
            continue;
        }
        let budget = opts
            .overlap_tokens
            .min(opts.max_tokens.saturating_sub(cur.tokens));
        if budget == 0 {
            continue;
        }
        // A proper suffix of the previous chunk's own text, never part of its heading.
        let floor = prev.heading_end.unwrap_or(prev.start);
        let region_start = (floor + 1..=prev.end)
            .find(|&b| text.is_char_boundary(b))
            .unwrap_or(prev.end);
        let tail_tokens = |b: usize| count_tokens(&text[b..prev.end]);
        let pick = |candidates: &[usize]| {
            let first_fit = candidates.partition_point(|&b| tail_tokens(b) > budget);
            // Token counts of joined text can differ by a token or so; try a few later cuts.
            candidates[first_fit..]
                .iter()
                .take(8)
                .map(|&b| (b, count_tokens(&text[b..cur.end])))
                .find(|&(_, total)| total <= opts.max_tokens)
        };
        let found = pick(&boundaries(text, region_start, prev.end, Level::Sentence))
            .or_else(|| pick(&boundaries(text, region_start, prev.end, Level::Whitespace)));
        if let Some((start, tokens)) = found {
            packed[k].start = start;
            packed[k].tokens = tokens;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Paragraph,
    Line,
    Sentence,
    Whitespace,
    Char,
}

impl Level {
    fn finer(self) -> Level {
        match self {
            Level::Paragraph => Level::Line,
            Level::Line => Level::Sentence,
            Level::Sentence => Level::Whitespace,
            Level::Whitespace | Level::Char => Level::Char,
        }
    }
}

/// Cuts `start..end` (token count over `max`) into trimmed pieces of at most `max` tokens,
/// pushing `(start, end, tokens)` in order.
fn split_oversized(
    text: &str,
    start: usize,
    end: usize,
    max: usize,
    level: Level,
    out: &mut Vec<(usize, usize, usize)>,
) {
    let cuts = if level == Level::Char {
        char_cuts(text, start, end, max)
    } else {
        boundaries(text, start, end, level)
    };
    if cuts.is_empty() && level != Level::Char {
        split_oversized(text, start, end, max, level.finer(), out);
        return;
    }
    let mut piece_start = start;
    for cut in cuts.into_iter().chain(std::iter::once(end)) {
        if let Some((s, e)) = trim_span(text, piece_start, cut) {
            let tokens = count_tokens(&text[s..e]);
            if tokens <= max || level == Level::Char {
                out.push((s, e, tokens));
            } else {
                split_oversized(text, s, e, max, level.finer(), out);
            }
        }
        piece_start = cut;
    }
}

/// Positions strictly inside `start..end` where a piece may begin at `level`, ascending,
/// all char boundaries: for paragraphs and lines the start of the line (so indentation stays
/// with its line), otherwise the first non-whitespace char.
fn boundaries(text: &str, start: usize, end: usize, level: Level) -> Vec<usize> {
    let Some(slice) = text.get(start..end) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut prev: Option<char> = None;
    // About the whitespace run before the current char: its newlines, whether it holds a
    // blank line, whether the text before it ends a sentence.
    let mut newlines_in_run = 0usize;
    let mut blank_line = false;
    let mut sentence_end = false;
    let mut line_has_content = false;
    let mut line_start = 0usize;
    for (offset, c) in slice.char_indices() {
        if c.is_whitespace() {
            if !prev.is_some_and(char::is_whitespace) {
                newlines_in_run = 0;
                blank_line = false;
                sentence_end = level == Level::Sentence && ends_sentence(&slice[..offset]);
            }
            if c == '\n' {
                if !line_has_content && newlines_in_run > 0 {
                    blank_line = true;
                }
                newlines_in_run += 1;
                line_has_content = false;
                line_start = offset + 1;
            }
            prev = Some(c);
            continue;
        }
        line_has_content = true;
        if offset > 0 {
            let after_ws = prev.is_some_and(char::is_whitespace);
            let hit = match level {
                Level::Paragraph => after_ws && blank_line,
                Level::Line => after_ws && newlines_in_run > 0,
                Level::Sentence => {
                    (after_ws && (newlines_in_run > 0 || sentence_end))
                        || prev.is_some_and(is_cjk_terminator)
                }
                Level::Whitespace => after_ws,
                Level::Char => false,
            };
            if hit {
                let at = match level {
                    Level::Paragraph | Level::Line => line_start,
                    _ => offset,
                };
                out.push(start + at);
            }
        }
        prev = Some(c);
    }
    out
}

/// Whether `before` ends with a sentence terminator, possibly inside closing quotes,
/// brackets or emphasis.
fn ends_sentence(before: &str) -> bool {
    before
        .chars()
        .rev()
        .find(|c| !matches!(c, '"' | '\'' | ')' | ']' | '”' | '’' | '»' | '*' | '_'))
        .is_some_and(|c| matches!(c, '.' | '!' | '?' | '…') || is_cjk_terminator(c))
}

fn is_cjk_terminator(c: char) -> bool {
    matches!(c, '。' | '！' | '？' | '；')
}

/// Char-boundary cuts every `max` bytes: a piece of n bytes is at most n tokens, since every
/// cl100k token covers at least one byte (and the fallback estimate never exceeds n either).
fn char_cuts(text: &str, start: usize, end: usize, max: usize) -> Vec<usize> {
    let step = max.max(4);
    let mut cuts = Vec::new();
    let mut at = start;
    while end - at > step {
        let mut cut = at + step;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        cuts.push(cut);
        at = cut;
    }
    cuts
}
