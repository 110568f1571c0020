//! Byte -> (char offset, line) conversion for one text, built once per chunk/outline pass.

pub(crate) struct OffsetIndex<'a> {
    text: &'a str,
    /// Byte offset of each line start; line `i` (0-based) starts at `line_starts[i]`.
    line_starts: Vec<usize>,
    /// `(byte, chars before it)` at char boundaries about every `CHECKPOINT_BYTES`, so a
    /// char offset costs a short count even on a text that is one huge line.
    checkpoints: Vec<(usize, u64)>,
}

const CHECKPOINT_BYTES: usize = 1024;

impl<'a> OffsetIndex<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let mut line_starts = vec![0];
        let mut checkpoints = vec![(0, 0)];
        let mut next_checkpoint = CHECKPOINT_BYTES;
        for (chars, (byte, c)) in (0u64..).zip(text.char_indices()) {
            if byte >= next_checkpoint {
                checkpoints.push((byte, chars));
                next_checkpoint = byte + CHECKPOINT_BYTES;
            }
            if c == '\n' {
                line_starts.push(byte + 1);
            }
        }
        Self {
            text,
            line_starts,
            checkpoints,
        }
    }

    /// 1-based line of `byte` (the `\n` ending a line belongs to that line).
    pub(crate) fn line_of(&self, byte: usize) -> u32 {
        let line = self.line_starts.partition_point(|&start| start <= byte);
        u32::try_from(line.max(1)).unwrap_or(u32::MAX)
    }

    /// 1-based inclusive line span of the non-empty byte range `start..end`.
    pub(crate) fn line_span(&self, start: usize, end: usize) -> (u32, u32) {
        let last = if end > start { end - 1 } else { start };
        (self.line_of(start), self.line_of(last))
    }

    /// Char offset of `byte`, a char boundary of the text (or its length).
    pub(crate) fn char_of(&self, byte: usize) -> u64 {
        let byte = byte.min(self.text.len());
        let at = self
            .checkpoints
            .partition_point(|&(b, _)| b <= byte)
            .saturating_sub(1);
        let (base_byte, base_chars) = self.checkpoints.get(at).copied().unwrap_or((0, 0));
        let within = self
            .text
            .get(base_byte..byte)
            .map_or(0, |s| s.chars().count());
        base_chars + within as u64
    }
}

/// Trims `start..end` of `text` to its content: leading blank lines go (the first content
/// line keeps its indentation when the range started at or before that line), trailing
/// whitespace goes. `None` when the range holds only whitespace.
pub(crate) fn trim_span(text: &str, start: usize, end: usize) -> Option<(usize, usize)> {
    let slice = text.get(start..end)?;
    let lead = slice.len() - slice.trim_start().len();
    let first = start + lead;
    if first >= end {
        return None;
    }
    let line_start = text[..first].rfind('\n').map_or(0, |i| i + 1);
    let new_start = if line_start >= start {
        line_start
    } else {
        first
    };
    let new_end = start + slice.trim_end().len();
    Some((new_start, new_end))
}

/// Fills the whitespace-separated gaps between sorted, disjoint `spans` of `region` that
/// still hold content, so no non-blank text falls outside every span.
pub(crate) fn fill_gaps(
    text: &str,
    region: (usize, usize),
    spans: &[(usize, usize)],
) -> Vec<(usize, usize)> {
    let mut gaps = Vec::new();
    let mut cursor = region.0;
    for &(start, end) in spans.iter().chain(std::iter::once(&(region.1, region.1))) {
        if start > cursor
            && let Some(gap) = trim_span(text, cursor, start)
        {
            gaps.push(gap);
        }
        cursor = cursor.max(end);
    }
    gaps
}
