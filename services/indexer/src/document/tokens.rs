//! Token counting with tiktoken's cl100k_base, built once per process.

use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

static ENCODER: OnceLock<Option<CoreBPE>> = OnceLock::new();

/// Longest piece handed to the encoder in one call: fancy-regex (under tiktoken) panics on
/// pathological runs near a million chars and BPE is quadratic in a single pre-token.
const MAX_SEGMENT_BYTES: usize = 8 * 1024;
/// Hard cut for a run with no whitespace boundary (one giant "word" or whitespace run).
const MAX_RUN_BYTES: usize = 1024;

fn encoder() -> Option<&'static CoreBPE> {
    ENCODER
        .get_or_init(|| match tiktoken_rs::cl100k_base() {
            Ok(bpe) => Some(bpe),
            Err(err) => {
                tracing::warn!(error = %err, "cl100k_base unavailable, token counts are estimates");
                None
            }
        })
        .as_ref()
}

/// Tokens in `text` under cl100k_base; [`estimate_tokens`] if the encoder could not be built.
///
/// Texts longer than 8 KiB are counted in pieces split before a word that follows whitespace,
/// so a huge input can differ from a one-shot count by about one token per piece.
pub fn count_tokens(text: &str) -> usize {
    let Some(bpe) = encoder() else {
        return estimate_tokens(text);
    };
    if text.len() <= MAX_SEGMENT_BYTES {
        return bpe.encode_ordinary(text).len();
    }
    segments(text)
        .map(|segment| bpe.encode_ordinary(segment).len())
        .sum()
}

/// Fallback estimate: one token per 4 ASCII chars (rounded up) plus one per non-ASCII char,
/// which over- rather than under-counts CJK and accented text.
pub fn estimate_tokens(text: &str) -> usize {
    let (ascii, other) = text.chars().fold((0usize, 0usize), |(a, o), c| {
        if c.is_ascii() { (a + 1, o) } else { (a, o + 1) }
    });
    ascii.div_ceil(4) + other
}

/// Splits `text` into pieces of at most `MAX_SEGMENT_BYTES` (plus one char), preferring cuts
/// just before whitespace that precedes a word, falling back to char boundaries.
fn segments(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        if rest.len() <= MAX_SEGMENT_BYTES {
            let piece = rest;
            rest = "";
            return Some(piece);
        }
        let cut = word_cut(rest).unwrap_or_else(|| floor_char_boundary(rest, MAX_RUN_BYTES));
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

/// Last position <= MAX_SEGMENT_BYTES where a whitespace run that ends in a word begins.
fn word_cut(text: &str) -> Option<usize> {
    let window = &text[..floor_char_boundary(text, MAX_SEGMENT_BYTES)];
    let mut best = None;
    let mut prev_ws = false;
    let mut run_start = 0;
    for (i, c) in window.char_indices() {
        let ws = c.is_whitespace();
        if ws && !prev_ws {
            run_start = i;
        }
        if !ws && prev_ws && run_start > 0 {
            best = Some(run_start);
        }
        prev_ws = ws;
    }
    best
}

fn floor_char_boundary(text: &str, max: usize) -> usize {
    if max >= text.len() {
        return text.len();
    }
    let mut at = max;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    if at == 0 {
        // A char wider than `max` bytes cannot happen for max >= 4; keep progress anyway.
        text.chars().next().map_or(text.len(), char::len_utf8)
    } else {
        at
    }
}
