//! Untrusted text (file contents, names from stores) is cleaned before it reaches a model.

use std::borrow::Cow;

/// Longest single field returned to a model unless a caller asks for less.
pub const DEFAULT_FIELD_CAP: usize = 64 * 1024;

/// Removes characters that can hide or smuggle instructions: control characters
/// (except newline and tab), ANSI escape sequences, Unicode tag characters, every other
/// format character (bidi overrides and isolates, zero-width characters, ...), variation
/// selectors and other invisible fillers; line and paragraph separators become newlines.
/// Caps the result at
/// `max_chars` characters, appending `…` when it cut.
pub fn sanitize_text(input: &str, max_chars: usize) -> String {
    sanitized(input, max_chars).into_owned()
}

/// `input` with every character [`sanitize_text`] would strip (and ESC) written out as a
/// visible `⟦U+202E⟧`, for a person who must see exactly what a value holds before acting
/// on it (an approver reading a proposal's arguments), where stripping would hide a
/// difference between what they read and what is sent.
pub fn reveal_hidden(input: &str) -> Cow<'_, str> {
    if !input.chars().any(|c| c == '\u{1b}' || is_hidden(c)) {
        return Cow::Borrowed(input);
    }
    let mut out = String::with_capacity(input.len() + 16);
    for c in input.chars() {
        if c == '\u{1b}' || is_hidden(c) {
            out.push_str(&format!("⟦U+{:04X}⟧", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`reveal_hidden`] over every string and object key of a JSON value.
pub fn reveal_hidden_json(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(reveal_hidden(&s).into_owned()),
        Value::Array(items) => Value::Array(items.into_iter().map(reveal_hidden_json).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (reveal_hidden(&k).into_owned(), reveal_hidden_json(v)))
                .collect(),
        ),
        other => other,
    }
}

/// Every string and object key of a JSON value, [sanitised](sanitize_text): strings capped
/// at `max_chars`, keys at `key_chars`.
pub fn sanitize_json(
    value: serde_json::Value,
    max_chars: usize,
    key_chars: usize,
) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(sanitize_text(&s, max_chars)),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|v| sanitize_json(v, max_chars, key_chars))
                .collect(),
        ),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    (
                        sanitize_text(&k, key_chars),
                        sanitize_json(v, max_chars, key_chars),
                    )
                })
                .collect(),
        ),
        other => other,
    }
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
        // Line and paragraph separators break lines in some renderers and not in others.
        out.push(if matches!(c, '\u{2028}' | '\u{2029}') {
            '\n'
        } else {
            c
        });
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

/// Whether `c` is invisible or changes how text around it reads: a control character other
/// than line feed and tab, a format character (bidi controls, zero-width characters) or a
/// tag character. Names that hold one can pass for another name.
pub fn is_hidden_char(c: char) -> bool {
    is_hidden(c)
}

fn is_hidden(c: char) -> bool {
    match c {
        '\n' | '\t' => false,
        c if c.is_control() => true,
        // Unicode tag characters (invisible ASCII look-alikes).
        '\u{E0000}'..='\u{E007F}' => true,
        // Every other format character (general category Cf, Unicode 15): bidi embeddings,
        // overrides, isolates and marks, zero-width characters, the soft hyphen, invisible
        // operators, interlinear annotation, and the script-specific format controls.
        '\u{00AD}'
        | '\u{0600}'..='\u{0605}'
        | '\u{061C}'
        | '\u{06DD}'
        | '\u{070F}'
        | '\u{0890}'..='\u{0891}'
        | '\u{08E2}'
        | '\u{180E}'
        | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}'
        | '\u{FEFF}'
        | '\u{FFF9}'..='\u{FFFB}'
        | '\u{110BD}'
        | '\u{110CD}'
        | '\u{13430}'..='\u{1343F}'
        | '\u{1BCA0}'..='\u{1BCA3}'
        | '\u{1D173}'..='\u{1D17A}' => true,
        // Invisible characters of other categories: variation selectors (a known channel
        // for smuggling bytes, like tag characters), the combining grapheme joiner, the
        // Mongolian free variation selectors, and the Hangul fillers.
        '\u{FE00}'..='\u{FE0F}'
        | '\u{E0100}'..='\u{E01EF}'
        | '\u{034F}'
        | '\u{180B}'..='\u{180F}'
        | '\u{115F}'..='\u{1160}'
        | '\u{3164}'
        | '\u{FFA0}' => true,
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
    fn strips_every_format_character_and_the_invisible_selectors() {
        let dirty = "pay\u{00AD} 1\u{FE0F}0\u{E0101}0\u{FFF9}0\u{FFFB} to\u{2066} Bob\u{206A}\u{3164}\u{180B}";
        assert_eq!(sanitize_text(dirty, 100), "pay 1000 to Bob");
        assert_eq!(
            sanitize_text("one\u{2028}two\u{2029}three", 100),
            "one\ntwo\nthree"
        );
        // Visible text of every script stays.
        assert_eq!(sanitize_text("한국어 ☃ ✓ مرحبا", 100), "한국어 ☃ ✓ مرحبا");
    }

    #[test]
    fn reveal_writes_hidden_characters_out() {
        assert_eq!(reveal_hidden("plain"), "plain");
        assert_eq!(
            reveal_hidden("pay 10\u{202E}0 to\u{E0041} Bob\u{1b}"),
            "pay 10⟦U+202E⟧0 to⟦U+E0041⟧ Bob⟦U+001B⟧"
        );
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
