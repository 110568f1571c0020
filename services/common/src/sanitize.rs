//! Untrusted text (file contents, names from stores) is cleaned before it reaches a model.

use std::borrow::Cow;

/// Longest single field returned to a model unless a caller asks for less.
pub const DEFAULT_FIELD_CAP: usize = 64 * 1024;

/// Removes characters that can hide or smuggle instructions: control characters
/// (except newline and tab), ANSI escape sequences, Unicode tag characters, bidi
/// overrides and isolates, and zero-width characters. Caps the result at
/// `max_chars` characters, appending `…` when it cut.
pub fn sanitize_text(input: &str, max_chars: usize) -> String {
    sanitized(input, max_chars).into_owned()
}

/// [`sanitize_text`] without the copy when there is nothing to change: the answer
/// borrows `input` when it is printable ASCII (with newlines and tabs) within the cap.
pub fn sanitized(input: &str, max_chars: usize) -> Cow<'_, str> {
    // Most chunk text is printable ASCII with newlines and tabs: nothing to strip and one char
    // per byte, so a byte scan replaces the char-by-char copy.
    if input.len() <= max_chars && input.bytes().all(is_plain_ascii) {
        return Cow::Borrowed(input);
    }
    Cow::Owned(strip_hidden(input, max_chars))
}

/// Printable ASCII, newline or tab: kept as it is by [`strip_hidden`].
fn is_plain_ascii(b: u8) -> bool {
    matches!(b, b' '..=b'~' | b'\n' | b'\t')
}

/// [`sanitize_text`]'s general path, char by char.
fn strip_hidden(input: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(input.len().min(max_chars.saturating_mul(4)));
    let mut chars = input.chars().peekable();
    let mut count = 0usize;
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            skip_ansi_sequence(&mut chars);
            continue;
        }
        if is_hidden(c) {
            continue;
        }
        if count == max_chars {
            out.push('…');
            break;
        }
        out.push(c);
        count += 1;
    }
    out
}

fn skip_ansi_sequence(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    match chars.peek() {
        // CSI: ESC [ params... final byte in @..~
        Some('[') => {
            chars.next();
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
        // OSC: ESC ] ... terminated by BEL or ESC \
        Some(']') => {
            chars.next();
            while let Some(c) = chars.next() {
                if c == '\u{7}' {
                    break;
                }
                if c == '\u{1b}' {
                    if chars.peek() == Some(&'\\') {
                        chars.next();
                    }
                    break;
                }
            }
        }
        // Two-character escapes (ESC c, ESC 7, ...).
        Some(_) => {
            chars.next();
        }
        None => {}
    }
}

fn is_hidden(c: char) -> bool {
    match c {
        '\n' | '\t' => false,
        c if c.is_control() => true,
        // Unicode tag characters (invisible ASCII look-alikes).
        '\u{E0000}'..='\u{E007F}' => true,
        // Bidi embeddings, overrides and isolates.
        '\u{202A}'..='\u{202E}'
        | '\u{2066}'..='\u{2069}'
        | '\u{200E}'
        | '\u{200F}'
        | '\u{061C}' => true,
        // Zero-width and invisible formatting characters.
        '\u{200B}'..='\u{200D}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}' | '\u{180E}' => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hidden_characters_and_escapes() {
        let dirty = "Ada\u{1b}[31m Love\u{1b}[0mlace\u{E0041}\u{E0042}\u{202E}evil\u{200B}\u{7}\u{1b}]0;title\u{7}!\r";
        assert_eq!(sanitize_text(dirty, 100), "Ada Lovelaceevil!");
    }

    #[test]
    fn keeps_ordinary_text_and_caps_length() {
        assert_eq!(
            sanitize_text("Zürich\n\tnaïve 東京", 100),
            "Zürich\n\tnaïve 東京"
        );
        assert_eq!(sanitize_text("abcdef", 3), "abc…");
        assert_eq!(sanitize_text("abc", 3), "abc");
    }

    #[test]
    fn the_ascii_fast_path_gives_what_the_general_path_gives() {
        let inputs = [
            "",
            "plain text\nwith\ttabs and ~ punctuation!",
            "carriage\r\nreturn",
            "escape \u{1b}[31mred\u{1b}[0m",
            "del\u{7f}bell\u{7}nul\0",
            "non-ASCII: naïve",
            "exactly ten",
        ];
        for input in inputs {
            for cap in [0, 3, 11, 100] {
                assert_eq!(
                    sanitize_text(input, cap),
                    strip_hidden(input, cap),
                    "{input:?} capped at {cap}"
                );
            }
        }
        // Every ASCII byte on its own, at a cap the fast path takes.
        for b in 0u8..=0x7f {
            let input = format!("a{}b", char::from(b));
            assert_eq!(
                sanitize_text(&input, 10),
                strip_hidden(&input, 10),
                "byte {b:#04x}"
            );
        }
        // Text with nothing to change is borrowed, not copied.
        assert!(matches!(sanitized("plain\ttext\n", 100), Cow::Borrowed(_)));
        assert!(matches!(sanitized("over the cap", 4), Cow::Owned(_)));
        assert!(matches!(sanitized("bidi\u{202e}", 100), Cow::Owned(_)));
    }
}
