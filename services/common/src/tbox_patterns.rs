//! The TBox's pattern language, compiled in one place for the ontology service (which refuses
//! a draft holding a pattern that does not compile) and the indexer (which runs them).
//!
//! An entity type's patterns are regexes. A relation type's patterns take two forms: a
//! template between two mentions with `{source}` and `{target}` (each exactly once, in either
//! order; literal words match case-insensitively, whitespace runs match any whitespace, `...`
//! up to 60 characters), or `re:` and a regex with the named groups `source` and `target`.

/// Longest regex pattern accepted, in bytes.
pub const MAX_PATTERN_LEN: usize = 2_000;
/// Compiled-program limit for each TBox regex, so a hostile pattern cannot eat memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Compiles one TBox regex within the length and size limits; the error says why not.
pub fn build_regex(pattern: &str, case_insensitive: bool) -> Result<regex::Regex, String> {
    if pattern.len() > MAX_PATTERN_LEN {
        return Err(format!("longer than {MAX_PATTERN_LEN} bytes"));
    }
    regex::RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| e.to_string())
}

/// An entity type's pattern, compiled; refused when it matches empty text (every position of
/// every chunk would be a mention).
pub fn entity_pattern(pattern: &str) -> Result<regex::Regex, String> {
    let regex = build_regex(pattern, false)?;
    if regex.is_match("") {
        return Err("it matches empty text; make it require at least one character".to_owned());
    }
    Ok(regex)
}

/// A relation type's pattern, compiled.
#[derive(Debug)]
pub enum RelationForm {
    /// A template: the text around and between the two mentions.
    Template {
        /// The placeholder order: `{source}` first when true.
        source_first: bool,
        /// Text right before the first mention.
        before: Option<regex::Regex>,
        /// Text between the mentions, anchored at both ends.
        between: regex::Regex,
        /// Text right after the second mention.
        after: Option<regex::Regex>,
    },
    /// `re:` with the groups `source` and `target`.
    Regex(regex::Regex),
}

/// Compiles one relation pattern; the error says what to change.
pub fn relation_form(pattern: &str) -> Result<RelationForm, String> {
    if let Some(expr) = pattern.strip_prefix("re:") {
        let regex = build_regex(expr, false)?;
        let names: Vec<&str> = regex.capture_names().flatten().collect();
        if !names.contains(&"source") || !names.contains(&"target") {
            return Err("a re: pattern needs the groups (?P<source>..) and (?P<target>..)".into());
        }
        return Ok(RelationForm::Regex(regex));
    }
    let (Some(s), Some(t)) = (pattern.find("{source}"), pattern.find("{target}")) else {
        return Err("a template needs {source} and {target}".into());
    };
    if pattern.matches("{source}").count() != 1 || pattern.matches("{target}").count() != 1 {
        return Err("{source} and {target} must each appear once".into());
    }
    let source_first = s < t;
    let (first, second) = if source_first { (s, t) } else { (t, s) };
    let before = pattern[..first].trim();
    let between = &pattern[first + "{source}".len()..second];
    let after = pattern[second + "{target}".len()..].trim();
    let optional = |text: &str, anchored: &str| -> Result<Option<regex::Regex>, String> {
        if text.is_empty() {
            Ok(None)
        } else {
            build_regex(&anchored.replace("{}", &literal(text)), true).map(Some)
        }
    };
    Ok(RelationForm::Template {
        source_first,
        before: optional(before, r"{}\s*$")?,
        between: build_regex(&format!(r"^\s*{}\s*$", literal(between.trim())), true)?,
        after: optional(after, r"^\s*{}")?,
    })
}

/// Template literal -> regex body: words escaped, whitespace runs flexible, `...` a short gap.
fn literal(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in text.split("...").enumerate() {
        if i > 0 {
            out.push_str(r"\s*.{0,60}?\s*");
        }
        let words: Vec<String> = part.split_whitespace().map(regex::escape).collect();
        out.push_str(&words.join(r"\s+"));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn patterns_that_cannot_run_say_why() {
        assert!(entity_pattern(r"\bOPS-\d+\b").is_ok());
        for (bad, why) in [
            (r"\bOPS-(\d+\b", "unclosed group"),
            ("(?P<name>a)(?P<name>b)", "duplicate capture group name"),
            (".*", "matches empty text"),
            ("x?", "matches empty text"),
        ] {
            let err = entity_pattern(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        assert!(entity_pattern(&"a".repeat(MAX_PATTERN_LEN + 1)).is_err());

        assert!(matches!(
            relation_form("{source} works at {target}").unwrap(),
            RelationForm::Template {
                source_first: true,
                ..
            }
        ));
        assert!(relation_form("re:(?P<source>\\w+) owns (?P<target>\\w+)").is_ok());
        for (bad, why) in [
            ("no placeholders", "needs {source} and {target}"),
            ("{source} x", "needs {source} and {target}"),
            ("{source} and {source} {target}", "each appear once"),
            ("re:(\\w+) owns (\\w+)", "groups (?P<source>..)"),
        ] {
            let err = relation_form(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
