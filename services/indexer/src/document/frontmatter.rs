//! A leading `---` front matter block: a YAML subset (scalars, quoted strings, inline and
//! dash lists, `|`/`>` block scalars) that covers what notes put there, without a YAML parser.

use std::collections::BTreeMap;

/// Front matter fields the indexer uses, plus every other top-level key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrontMatter {
    pub title: Option<String>,
    /// The `type` key.
    pub doc_type: Option<String>,
    /// `tags` (or `tag`): an inline list, a dash list, or a comma-separated scalar.
    pub tags: Vec<String>,
    /// `date` (else `documentDate`), exactly as given: this is the file's documentDate.
    pub date: Option<String>,
    /// Other top-level keys as written (nested maps are not kept).
    pub extra: BTreeMap<String, FrontMatterValue>,
}

impl FrontMatter {
    pub fn is_empty(&self) -> bool {
        self.title.is_none()
            && self.doc_type.is_none()
            && self.tags.is_empty()
            && self.date.is_none()
            && self.extra.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontMatterValue {
    Scalar(String),
    List(Vec<String>),
}

/// Finds front matter at the very start of `text`; returns the byte offset just after its
/// closing line and the parsed fields. A leading `---` whose content does not look like
/// `key: value` lines is a thematic break, not front matter.
pub(crate) fn split_front_matter(text: &str) -> Option<(usize, FrontMatter)> {
    let first_end = text.find('\n')?;
    if text[..first_end].trim_end() != "---" {
        return None;
    }
    let mut lines = Vec::new();
    let mut pos = first_end + 1;
    loop {
        let line_end = text[pos..].find('\n').map_or(text.len(), |i| pos + i);
        let line = &text[pos..line_end];
        let next = if line_end < text.len() {
            line_end + 1
        } else {
            text.len()
        };
        if matches!(line.trim_end(), "---" | "...") {
            if !lines.iter().all(|l: &&str| looks_like_yaml(l)) {
                return None;
            }
            return Some((next, parse_lines(&lines)));
        }
        if line_end == text.len() {
            return None;
        }
        lines.push(line);
        pos = next;
    }
}

fn looks_like_yaml(line: &str) -> bool {
    let trimmed = line.trim();
    if trimmed.is_empty() || trimmed.starts_with('#') || line.starts_with([' ', '\t']) {
        return true;
    }
    if trimmed == "-" || trimmed.starts_with("- ") {
        return true;
    }
    match line.split_once(':') {
        Some((key, value)) => {
            let key = key.trim();
            !key.is_empty()
                && !key.contains(char::is_whitespace)
                && (value.is_empty() || value.starts_with([' ', '\t']))
        }
        None => false,
    }
}

enum Pending<'a> {
    None,
    /// A key with an empty value: a dash list may follow.
    Items(&'a str, Vec<String>),
    /// A `|` (literal) or `>` (folded) block scalar.
    Block(&'a str, bool, Vec<&'a str>),
}

fn parse_lines(lines: &[&str]) -> FrontMatter {
    let mut values: Vec<(&str, FrontMatterValue)> = Vec::new();
    let mut pending = Pending::None;
    for &line in lines {
        let trimmed = line.trim();
        let indented = line.starts_with([' ', '\t']);
        if let Pending::Block(_, _, block) = &mut pending
            && (indented || trimmed.is_empty())
        {
            block.push(trimmed);
            continue;
        }
        if trimmed.is_empty() || (!indented && trimmed.starts_with('#')) {
            continue;
        }
        if trimmed == "-" || trimmed.starts_with("- ") {
            if let Pending::Items(_, items) = &mut pending {
                let item = unquote(trimmed[1..].trim());
                if !item.is_empty() {
                    items.push(item);
                }
            }
            continue;
        }
        if indented {
            // Nested maps and multi-line plain scalars are beyond what the indexer needs.
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        finish(&mut values, std::mem::replace(&mut pending, Pending::None));
        let key = key.trim();
        let value = value.trim();
        pending = match value {
            "" => Pending::Items(key, Vec::new()),
            "|" | "|-" | "|+" => Pending::Block(key, true, Vec::new()),
            ">" | ">-" | ">+" => Pending::Block(key, false, Vec::new()),
            _ => {
                values.push((key, parse_value(value)));
                Pending::None
            }
        };
    }
    finish(&mut values, pending);

    let mut fm = FrontMatter::default();
    let mut document_date = None;
    for (key, value) in values {
        match (key.to_ascii_lowercase().as_str(), value) {
            ("title", value) => fm.title = non_empty(first(value)),
            ("type", value) => fm.doc_type = non_empty(first(value)),
            ("date", value) => fm.date = non_empty(first(value)),
            ("documentdate" | "document_date", value) => document_date = non_empty(first(value)),
            ("tags" | "tag", FrontMatterValue::List(items)) => fm.tags = items,
            ("tags" | "tag", FrontMatterValue::Scalar(s)) => {
                fm.tags = s
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
                    .collect();
            }
            (_, value) => {
                fm.extra.insert(key.to_owned(), value);
            }
        }
    }
    if fm.date.is_none() {
        fm.date = document_date;
    }
    fm
}

fn finish<'a>(values: &mut Vec<(&'a str, FrontMatterValue)>, pending: Pending<'a>) {
    match pending {
        Pending::None => {}
        Pending::Items(key, items) => {
            // An empty value with no items is an empty scalar; keep it out of the fields.
            if !items.is_empty() {
                values.push((key, FrontMatterValue::List(items)));
            }
        }
        Pending::Block(key, literal, mut lines) => {
            while lines.last().is_some_and(|l| l.is_empty()) {
                lines.pop();
            }
            let joined = if literal {
                lines.join("\n")
            } else {
                // Folded: lines join with spaces, blank lines become newlines.
                let mut out = String::new();
                for line in lines {
                    if line.is_empty() {
                        out.push('\n');
                    } else {
                        if !out.is_empty() && !out.ends_with('\n') {
                            out.push(' ');
                        }
                        out.push_str(line);
                    }
                }
                out
            };
            values.push((key, FrontMatterValue::Scalar(joined)));
        }
    }
}

fn first(value: FrontMatterValue) -> String {
    match value {
        FrontMatterValue::Scalar(s) => s,
        FrontMatterValue::List(items) => items.into_iter().next().unwrap_or_default(),
    }
}

fn non_empty(s: String) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

fn parse_value(value: &str) -> FrontMatterValue {
    if let Some(inner) = value.strip_prefix('[')
        && let Some(end) = closing_bracket(inner)
    {
        return FrontMatterValue::List(split_inline_list(&inner[..end]));
    }
    FrontMatterValue::Scalar(unquote(value))
}

/// Index of the `]` closing an inline list, skipping brackets inside quotes.
fn closing_bracket(inner: &str) -> Option<usize> {
    let mut quote = None;
    for (i, c) in inner.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ']') => return Some(i),
            _ => {}
        }
    }
    None
}

fn split_inline_list(inner: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut quote = None;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ',') => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .map(|item| unquote(item.trim()))
        .filter(|item| !item.is_empty())
        .collect()
}

/// A scalar as YAML reads it: double quotes with YAML's backslash escapes, single quotes with
/// `''` (anything after the closing quote, such as a comment, is dropped), or a plain value
/// with any ` #` comment removed. An unterminated quote is read as a plain value.
fn unquote(value: &str) -> String {
    let value = value.trim();
    if let Some(rest) = value.strip_prefix('"') {
        let mut out = String::with_capacity(rest.len());
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => return out,
                '\\' => unescape(&mut chars, &mut out),
                c => out.push(c),
            }
        }
    } else if let Some(rest) = value.strip_prefix('\'') {
        let mut out = String::with_capacity(rest.len());
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '\'' {
                out.push(c);
            } else if chars.peek() == Some(&'\'') {
                chars.next();
                out.push('\'');
            } else {
                return out;
            }
        }
    }
    let plain = match value.find(" #") {
        Some(i) => &value[..i],
        None => value,
    };
    plain.trim().to_owned()
}

/// One escape of a double-quoted YAML scalar, after its backslash. Escapes that give a
/// control character other than a tab or newline give nothing (a title is one line of text);
/// an unknown or malformed escape is kept as written.
fn unescape(chars: &mut std::str::Chars<'_>, out: &mut String) {
    let Some(c) = chars.next() else {
        out.push('\\');
        return;
    };
    let hex_digits = match c {
        'x' => 2,
        'u' => 4,
        'U' => 8,
        _ => {
            match c {
                'n' => out.push('\n'),
                't' | '\t' => out.push('\t'),
                ' ' => out.push(' '),
                '"' | '/' | '\\' => out.push(c),
                '_' => out.push('\u{a0}'),
                'L' => out.push('\u{2028}'),
                'P' => out.push('\u{2029}'),
                '0' | 'a' | 'b' | 'e' | 'f' | 'r' | 'v' | 'N' => {}
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
            return;
        }
    };
    let digits: String = chars.clone().take(hex_digits).collect();
    let code = (digits.len() == hex_digits && digits.chars().all(|d| d.is_ascii_hexdigit()))
        .then(|| u32::from_str_radix(&digits, 16).ok())
        .flatten();
    let Some(mut code) = code else {
        out.push('\\');
        out.push(c);
        return;
    };
    chars.nth(hex_digits - 1);
    // JSON's surrogate pairs (`\ud83d\ude00`), which YAML documents copied from JSON carry.
    if c == 'u' && (0xD800..0xDC00).contains(&code) {
        let after = chars.as_str();
        if let Some(low) = after
            .strip_prefix("\\u")
            .and_then(|rest| rest.get(..4))
            .and_then(|digits| u32::from_str_radix(digits, 16).ok())
            .filter(|low| (0xDC00..0xE000).contains(low))
        {
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            chars.nth(5);
        }
    }
    match char::from_u32(code) {
        Some(decoded) if !decoded.is_control() || matches!(decoded, '\n' | '\t') => {
            out.push(decoded);
        }
        Some(_) => {}
        None => {
            out.push('\\');
            out.push(c);
            out.push_str(&digits);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::unquote;

    #[test]
    fn double_quoted_scalars_decode_yaml_escapes() {
        for (written, read) in [
            (r#""Caf\u00e9 menu""#, "Café menu"),
            (r#""Caf\xe9""#, "Café"),
            (r#""smile \U0001F600""#, "smile 😀"),
            (r#""smile \ud83d\ude00""#, "smile 😀"),
            (r#""say \"hi\" \\ done""#, r#"say "hi" \ done"#),
            (r#""a\/b""#, "a/b"),
            (r#""tab\there\nline""#, "tab\there\nline"),
            (r#""no\u0007bell\e""#, "nobell"),
            (r#""nbsp\_here""#, "nbsp\u{a0}here"),
            // Malformed or unknown escapes are kept as written.
            (r#""bad \u12 end""#, r"bad \u12 end"),
            (r#""odd \q""#, r"odd \q"),
            (r#""lone \ud83d end""#, r"lone \ud83d end"),
            (r#""trailing \"#, r#""trailing \"#),
        ] {
            assert_eq!(unquote(written), read, "{written}");
        }
    }
}
