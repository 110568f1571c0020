//! Document metadata in one shape for every format: title, type, tags, the document date,
//! the effective window and collections. Dates are normalised to `YYYY-MM-DD`; a value that
//! is not a date is dropped with a warning, never a parse failure.

use super::frontmatter::{FrontMatter, FrontMatterValue};

/// What a document says about itself (front matter, HTML `<title>`/`<meta>`, PDF Info).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DocumentMeta {
    pub title: Option<String>,
    pub doc_type: Option<String>,
    pub tags: Vec<String>,
    /// `YYYY-MM-DD`.
    pub document_date: Option<String>,
    /// `YYYY-MM-DD`: first day the document applies.
    pub effective_from: Option<String>,
    /// `YYYY-MM-DD`: last day the document applies.
    pub effective_to: Option<String>,
    pub collections: Vec<String>,
    /// Values that were dropped, e.g. "effectiveTo `soon` is not a date".
    pub warnings: Vec<String>,
}

/// Which metadata field a source key feeds; keys compare case- and separator-insensitively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    Title,
    Type,
    Tags,
    DocumentDate,
    EffectiveFrom,
    EffectiveTo,
    Collections,
}

/// Maps a front matter key or HTML meta name to a field. `dc.`/`dcterms.`/`kg:`/`article:`
/// prefixes are ignored, as are `-`, `_` and case.
pub(crate) fn field_of(key: &str) -> Option<Field> {
    let lower = key.trim().to_ascii_lowercase();
    let bare = ["dcterms.", "dc.", "kg:", "kg.", "article:", "og:"]
        .iter()
        .find_map(|p| lower.strip_prefix(p))
        .unwrap_or(&lower);
    let squashed: String = bare.chars().filter(|c| !matches!(c, '-' | '_')).collect();
    Some(match squashed.as_str() {
        "title" => Field::Title,
        "type" | "doctype" | "documenttype" => Field::Type,
        "tags" | "tag" | "keywords" => Field::Tags,
        "date" | "documentdate" | "created" | "publishedtime" | "issued" => Field::DocumentDate,
        "effectivefrom" | "validfrom" | "effective" | "effectivedate" => Field::EffectiveFrom,
        "effectiveto" | "effectiveuntil" | "validto" | "validuntil" | "expires" => {
            Field::EffectiveTo
        }
        "collections" | "collection" => Field::Collections,
        _ => return None,
    })
}

impl DocumentMeta {
    /// Sets `field` from a raw value unless it is already set (the first source wins).
    /// Lists accept a comma-separated string.
    pub(crate) fn offer(&mut self, field: Field, key: &str, values: &[String]) {
        let first = values
            .iter()
            .map(|v| v.trim())
            .find(|v| !v.is_empty())
            .map(str::to_owned);
        let list = || -> Vec<String> {
            let mut out: Vec<String> = Vec::new();
            for v in values {
                for item in v.split([',', ';']).map(str::trim).filter(|t| !t.is_empty()) {
                    if !out.iter().any(|seen| seen == item) {
                        out.push(item.to_owned());
                    }
                }
            }
            out
        };
        match field {
            Field::Title => set_once(&mut self.title, first),
            Field::Type => set_once(&mut self.doc_type, first),
            Field::Tags if self.tags.is_empty() => self.tags = list(),
            Field::Collections if self.collections.is_empty() => self.collections = list(),
            Field::Tags | Field::Collections => {}
            Field::DocumentDate | Field::EffectiveFrom | Field::EffectiveTo => {
                let slot = match field {
                    Field::DocumentDate => &mut self.document_date,
                    Field::EffectiveFrom => &mut self.effective_from,
                    _ => &mut self.effective_to,
                };
                if slot.is_some() {
                    return;
                }
                let Some(raw) = first else { return };
                match normalize_date(&raw) {
                    Some(date) => *slot = Some(date),
                    None => self.warnings.push(format!(
                        "{key} `{raw}` is not a date (use YYYY-MM-DD); ignored"
                    )),
                }
            }
        }
    }

    /// Metadata from Markdown front matter; `heading_title` (the first H1) is the fallback title.
    pub(crate) fn from_front_matter(fm: &FrontMatter, heading_title: Option<String>) -> Self {
        let mut meta = DocumentMeta::default();
        if let Some(title) = &fm.title {
            meta.offer(Field::Title, "title", std::slice::from_ref(title));
        }
        if let Some(doc_type) = &fm.doc_type {
            meta.offer(Field::Type, "type", std::slice::from_ref(doc_type));
        }
        if !fm.tags.is_empty() {
            meta.tags = fm.tags.clone();
        }
        if let Some(date) = &fm.date {
            meta.offer(Field::DocumentDate, "date", std::slice::from_ref(date));
        }
        for (key, value) in &fm.extra {
            let Some(field) = field_of(key) else { continue };
            let values = match value {
                FrontMatterValue::Scalar(s) => vec![s.clone()],
                FrontMatterValue::List(items) => items.clone(),
            };
            meta.offer(field, key, &values);
        }
        if meta.title.is_none() {
            meta.title = heading_title;
        }
        meta
    }
}

fn set_once(slot: &mut Option<String>, value: Option<String>) {
    if slot.is_none() {
        *slot = value;
    }
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];

/// `YYYY-MM-DD` from the common ways dates are written: ISO dates and timestamps
/// (`2024-05-01`, `2024-05-01T10:00:00Z`), `2024/05/01`, `2024.05.01`, `20240501`, PDF dates
/// (`D:20240501120000+02'00'`), and `1 May 2024` / `May 1, 2024`. `None` for anything else,
/// including impossible days such as `2023-02-29`.
pub fn normalize_date(raw: &str) -> Option<String> {
    let s = raw.trim().trim_matches(['"', '\'']);
    let s = s.strip_prefix("D:").unwrap_or(s);
    let numeric = |s: &str| -> Option<(i32, u32, u32)> {
        // YYYY<sep>MM<sep>DD with one separator kind, then an optional time part.
        let date_part = s.split(['T', ' ']).next()?;
        for sep in ['-', '/', '.'] {
            let parts: Vec<&str> = date_part.split(sep).collect();
            if parts.len() == 3 && parts[0].len() == 4 {
                return Some((
                    parts[0].parse().ok()?,
                    parts[1].parse().ok()?,
                    parts[2].parse().ok()?,
                ));
            }
        }
        // Compact YYYYMMDD, possibly followed by a time (PDF dates).
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        let rest = &s[digits.len()..];
        if matches!(digits.len(), 8 | 10 | 12 | 14)
            && (rest.is_empty() || rest.starts_with(['Z', '+', '-', '\'']))
        {
            return Some((
                digits[0..4].parse().ok()?,
                digits[4..6].parse().ok()?,
                digits[6..8].parse().ok()?,
            ));
        }
        None
    };
    let (y, m, d) = numeric(s).or_else(|| textual(s))?;
    valid(y, m, d).then(|| format!("{y:04}-{m:02}-{d:02}"))
}

/// `1 May 2024`, `May 1, 2024`, `1st of May 2024`.
fn textual(s: &str) -> Option<(i32, u32, u32)> {
    let words: Vec<String> = s
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty() && !w.eq_ignore_ascii_case("of"))
        .map(|w| w.to_ascii_lowercase())
        .collect();
    if words.len() != 3 {
        return None;
    }
    let month_of = |w: &str| -> Option<u32> {
        let prefix = w.get(..3)?;
        let idx = MONTHS.iter().position(|m| *m == prefix)?;
        u32::try_from(idx + 1).ok()
    };
    let day_of = |w: &str| -> Option<u32> {
        let digits = w.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        digits.parse().ok()
    };
    let year: i32 = words[2].parse().ok()?;
    if let Some(month) = month_of(&words[1]) {
        return Some((year, month, day_of(&words[0])?));
    }
    Some((year, month_of(&words[0])?, day_of(&words[1])?))
}

fn valid(y: i32, m: u32, d: u32) -> bool {
    if !(1..=9999).contains(&y) || !(1..=12).contains(&m) || d == 0 {
        return false;
    }
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => 31,
    };
    d <= days
}
