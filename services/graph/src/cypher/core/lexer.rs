//! Tokens of the read subset. Comments and whitespace are dropped here, so the printer never
//! has to reproduce them; anything outside the token set is a syntax refusal.

use super::{Refusal, Rule};

/// Longest statement accepted, in bytes.
pub const MAX_STATEMENT_BYTES: usize = 16 * 1024;

/// A token with the byte offset where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Spanned {
    /// The token.
    pub tok: Tok,
    /// Byte offset in the statement.
    pub at: usize,
}

/// Tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// A bare identifier or keyword (keywords are matched case-insensitively by the parser).
    Ident(String),
    /// A `backtick` identifier: never a keyword.
    Quoted(String),
    /// A string literal, unescaped.
    Str(String),
    /// An integer literal.
    Int(i64),
    /// A float literal.
    Float(f64),
    /// `$name`
    Param(String),
    /// Punctuation and operators.
    Sym(&'static str),
}

const SYMBOLS: &[&str] = &[
    "<>", "<=", ">=", "=~", "..", "+=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", ";", "+",
    "-", "*", "/", "%", "^", "=", "<", ">",
];

/// Splits `src` into tokens.
pub fn lex(src: &str) -> Result<Vec<Spanned>, Refusal> {
    if src.len() > MAX_STATEMENT_BYTES {
        return Err(Refusal::new(
            Rule::Size,
            format!(
                "the statement is {} bytes; the limit is {MAX_STATEMENT_BYTES}. Shorten it",
                src.len()
            ),
        ));
    }
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if src[i..].starts_with("//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if src[i..].starts_with("/*") {
            match src[i + 2..].find("*/") {
                Some(end) => i += 2 + end + 2,
                None => return Err(syntax(i, "a `/*` comment is never closed")),
            }
            continue;
        }
        let at = i;
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push(Spanned {
                tok: Tok::Ident(src[at..i].to_owned()),
                at,
            });
            continue;
        }
        if c == b'`' {
            let Some(end) = src[i + 1..].find('`') else {
                return Err(syntax(i, "a `backtick` name is never closed"));
            };
            let name = &src[i + 1..i + 1 + end];
            if !is_plain_name(name) {
                return Err(syntax(
                    i,
                    "a backtick name may only hold letters, digits and `_` (starting with a letter or `_`)",
                ));
            }
            out.push(Spanned {
                tok: Tok::Quoted(name.to_owned()),
                at,
            });
            i += end + 2;
            continue;
        }
        if c == b'$' {
            i += 1;
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let name = &src[start..i];
            if !is_plain_name(name) {
                return Err(syntax(
                    at,
                    "a parameter is `$` then a name such as `$afterId`",
                ));
            }
            out.push(Spanned {
                tok: Tok::Param(name.to_owned()),
                at,
            });
            continue;
        }
        if c == b'\'' || c == b'"' {
            let (text, next) = string(src, i)?;
            out.push(Spanned {
                tok: Tok::Str(text),
                at,
            });
            i = next;
            continue;
        }
        if c.is_ascii_digit() {
            let (tok, next) = number(src, i)?;
            out.push(Spanned { tok, at });
            i = next;
            continue;
        }
        match SYMBOLS.iter().find(|s| src[i..].starts_with(**s)) {
            Some(sym) => {
                out.push(Spanned {
                    tok: Tok::Sym(sym),
                    at,
                });
                i += sym.len();
            }
            None => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(syntax(i, &format!("unexpected character {ch:?}")));
            }
        }
    }
    Ok(out)
}

/// `[A-Za-z_][A-Za-z0-9_]*`
pub fn is_plain_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn syntax(at: usize, what: &str) -> Refusal {
    Refusal::new(Rule::Syntax, format!("at byte {at}: {what}"))
}

fn string(src: &str, start: usize) -> Result<(String, usize), Refusal> {
    let quote = src.as_bytes()[start] as char;
    let mut out = String::new();
    let mut chars = src[start + 1..].char_indices();
    while let Some((off, c)) = chars.next() {
        match c {
            '\\' => {
                let Some((_, e)) = chars.next() else { break };
                out.push(match e {
                    '\\' => '\\',
                    '\'' => '\'',
                    '"' => '"',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    _ => {
                        return Err(syntax(
                            start + 1 + off,
                            "unknown escape in a string; use \\\\ \\' \\\" \\n \\r \\t \\b or \\f",
                        ));
                    }
                });
            }
            '\0' => return Err(syntax(start + 1 + off, "a string cannot hold a NUL byte")),
            c if c == quote => return Ok((out, start + 1 + off + 1)),
            c => out.push(c),
        }
    }
    Err(syntax(start, "a string is never closed"))
}

fn number(src: &str, start: usize) -> Result<(Tok, usize), Refusal> {
    let bytes = src.as_bytes();
    let mut i = start;
    while i < bytes.len() && bytes[i].is_ascii_digit() {
        i += 1;
    }
    let mut float = false;
    // `1..2` is a range, not a float.
    if i + 1 < bytes.len() && bytes[i] == b'.' && bytes[i + 1].is_ascii_digit() {
        float = true;
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
    }
    if i < bytes.len() && (bytes[i] == b'e' || bytes[i] == b'E') {
        let mut j = i + 1;
        if j < bytes.len() && (bytes[j] == b'+' || bytes[j] == b'-') {
            j += 1;
        }
        if j < bytes.len() && bytes[j].is_ascii_digit() {
            float = true;
            i = j;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
        }
    }
    if i < bytes.len() && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_') {
        return Err(syntax(
            start,
            "a number runs into a name; only decimal numbers are accepted",
        ));
    }
    let text = &src[start..i];
    if float {
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok((Tok::Float(f), i)),
            _ => Err(syntax(start, "a float literal is out of range")),
        }
    } else {
        match text.parse::<i64>() {
            Ok(n) => Ok((Tok::Int(n), i)),
            Err(_) => Err(syntax(start, "an integer literal does not fit in 64 bits")),
        }
    }
}
