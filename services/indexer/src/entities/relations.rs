//! Relation patterns: a relation type's textual patterns between two typed mentions.
//!
//! Two forms are accepted in `RelationType.patterns`:
//!
//! - **Template** (the default): the text between two mentions, written with the placeholders
//!   `{source}` and `{target}` (each exactly once, in either order), e.g.
//!   `"{source} works at {target}"` or `"{target} was acquired by {source}"`. Literal words
//!   match case-insensitively, any run of whitespace matches any whitespace, and `...` matches
//!   up to 60 characters of anything. Text before the first or after the second placeholder
//!   must appear right before / after the mentions. Both mentions must lie in the same sentence
//!   of one chunk and have the relation's source / target entity type (an empty type id in the
//!   relation type accepts any type).
//! - **Regex**: `re:` followed by a regex with the named groups `source` and `target`, run over
//!   each chunk (case as written; add `(?i)` for case-insensitive). A group that coincides with
//!   a mention of the right type uses that entity; otherwise the group's text becomes a
//!   `pattern` mention of the relation's source / target type (which must then be set).

use super::text::{Found, crosses_sentence};
use kg_common::tbox_patterns::{RelationForm as Form, relation_form};

use super::{Method, entity_key};

/// Longest text between two mentions that a template considers, in bytes.
const MAX_GAP: usize = 300;
/// Relation matches per rule per chunk.
const MAX_MATCHES: usize = 256;

/// One compiled relation pattern.
#[derive(Debug)]
pub(crate) struct RelationRule {
    relation_type_id: String,
    source_type: String,
    target_type: String,
    form: Form,
}

impl RelationRule {
    /// Compiles one pattern of relation type `id`.
    pub(crate) fn compile(
        id: &str,
        source_type: &str,
        target_type: &str,
        pattern: &str,
    ) -> Result<RelationRule, String> {
        let form = relation_form(pattern)?;
        Ok(RelationRule {
            relation_type_id: id.to_owned(),
            source_type: source_type.to_owned(),
            target_type: target_type.to_owned(),
            form,
        })
    }

    fn accepts(wanted: &str, type_id: &str) -> bool {
        wanted.is_empty() || wanted == type_id
    }

    /// Appends `(relationTypeId, sourceKey, targetKey)` for every match in `text`; a `re:`
    /// rule may add the mentions it needs to `found`.
    pub(crate) fn find(
        &self,
        text: &str,
        found: &mut Vec<Found>,
        out: &mut Vec<(String, String, String)>,
    ) {
        match &self.form {
            Form::Template {
                source_first,
                before,
                between,
                after,
            } => {
                let mut spans: Vec<&Found> = found.iter().collect();
                spans.sort_by_key(|f| (f.start, f.end));
                let mut matched = 0;
                for (i, a) in spans.iter().enumerate() {
                    for b in &spans[i + 1..] {
                        if b.start < a.end {
                            continue;
                        }
                        if b.start - a.end > MAX_GAP {
                            break;
                        }
                        let (source, target) = if *source_first { (a, b) } else { (b, a) };
                        if !Self::accepts(&self.source_type, &source.type_id)
                            || !Self::accepts(&self.target_type, &target.type_id)
                            || source.entity_key == target.entity_key
                        {
                            continue;
                        }
                        let gap = &text[a.end..b.start];
                        if crosses_sentence(gap) || !between.is_match(gap) {
                            continue;
                        }
                        if before
                            .as_ref()
                            .is_some_and(|r| !r.is_match(&text[..a.start]))
                            || after.as_ref().is_some_and(|r| !r.is_match(&text[b.end..]))
                        {
                            continue;
                        }
                        out.push((
                            self.relation_type_id.clone(),
                            source.entity_key.clone(),
                            target.entity_key.clone(),
                        ));
                        matched += 1;
                        if matched == MAX_MATCHES {
                            return;
                        }
                    }
                }
            }
            Form::Regex(regex) => {
                for caps in regex.captures_iter(text).take(MAX_MATCHES) {
                    let (Some(s), Some(t)) = (caps.name("source"), caps.name("target")) else {
                        continue;
                    };
                    let source = self.resolve(text, s, &self.source_type, found);
                    let target = self.resolve(text, t, &self.target_type, found);
                    if let (Some(source), Some(target)) = (source, target)
                        && source != target
                    {
                        out.push((self.relation_type_id.clone(), source, target));
                    }
                }
            }
        }
    }

    /// The entity key of the mention at `m`, creating a `pattern` mention of `type_id` when
    /// there is none.
    fn resolve(
        &self,
        text: &str,
        m: regex::Match<'_>,
        type_id: &str,
        found: &mut Vec<Found>,
    ) -> Option<String> {
        let quote = m.as_str();
        let start = m.start() + (quote.len() - quote.trim_start().len());
        let end = m.end() - (quote.len() - quote.trim_end().len());
        if start >= end {
            return None;
        }
        if let Some(existing) = found
            .iter()
            .find(|f| f.start == start && f.end == end && Self::accepts(type_id, &f.type_id))
        {
            return Some(existing.entity_key.clone());
        }
        if type_id.is_empty() {
            return None;
        }
        let key = entity_key(type_id, &text[start..end]);
        found.push(Found {
            start,
            end,
            type_id: type_id.to_owned(),
            entity_key: key.clone(),
            method: Method::Pattern,
        });
        Some(key)
    }
}
