//! Text helpers shared by the matchers: byte-to-char offsets, word and sentence boundaries.

use super::Method;

/// A span found in one chunk's text (byte offsets), before it becomes a mention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub start: usize,
    pub end: usize,
    pub type_id: String,
    pub entity_key: String,
    pub method: Method,
}

/// Byte offset -> char offset within one text; free for ASCII text.
pub(crate) struct CharMap {
    /// For non-ASCII text: the byte offset of every char, plus the text length.
    starts: Option<Vec<usize>>,
}

impl CharMap {
    pub fn new(text: &str) -> CharMap {
        if text.is_ascii() {
            return CharMap { starts: None };
        }
        let mut starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        starts.push(text.len());
        CharMap {
            starts: Some(starts),
        }
    }

    /// The char index of a byte offset that lies on a char boundary.
    pub fn char_at(&self, byte: usize) -> u64 {
        let index = match &self.starts {
            None => byte,
            Some(starts) => starts.partition_point(|&b| b < byte),
        };
        u64::try_from(index).unwrap_or(u64::MAX)
    }
}

pub(crate) fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `text[start..end]` does not cut a word in two: the char before `start` and the one
/// at `end` are not word chars, where the span's own edge char is a word char.
pub(crate) fn on_word_boundaries(text: &str, start: usize, end: usize) -> bool {
    let span = &text[start..end];
    let (Some(first), Some(last)) = (span.chars().next(), span.chars().next_back()) else {
        return false;
    };
    let before_ok = !is_word_char(first)
        || text[..start]
            .chars()
            .next_back()
            .is_none_or(|c| !is_word_char(c));
    let after_ok =
        !is_word_char(last) || text[end..].chars().next().is_none_or(|c| !is_word_char(c));
    before_ok && after_ok
}

/// Whether `between` (text separating two mentions) crosses a sentence end: `.`, `!` or `?`
/// followed by whitespace, a blank line, or a line that starts a list item, heading, table
/// row or quote.
pub(crate) fn crosses_sentence(between: &str) -> bool {
    let bytes = between.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'.' | b'!' | b'?' if bytes.get(i + 1).is_some_and(u8::is_ascii_whitespace) => {
                return true;
            }
            b'\n' => {
                let rest = between[i + 1..].trim_start_matches([' ', '\t']);
                if rest.starts_with('\n')
                    || rest.starts_with(['#', '-', '*', '+', '|', '>'])
                    || starts_numbered_item(rest)
                {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

fn starts_numbered_item(line: &str) -> bool {
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && matches!(line.as_bytes().get(digits), Some(b'.' | b')'))
}
