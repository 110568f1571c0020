//! Entity-type regexes -> mentions of that type.

use super::text::Found;
use super::{Method, entity_key};

/// Matches per pattern per chunk, so a too-broad regex stays bounded.
const MAX_MATCHES: usize = 256;

#[derive(Debug)]
pub(crate) struct EntityPattern {
    pub type_id: String,
    pub regex: regex::Regex,
}

impl EntityPattern {
    /// Appends a mention for every non-empty match (or its `name` group when the pattern has one).
    pub fn find(&self, text: &str, out: &mut Vec<Found>) {
        for caps in self.regex.captures_iter(text).take(MAX_MATCHES) {
            let Some(m) = caps.name("name").or_else(|| caps.get(0)) else {
                continue;
            };
            let quote = m.as_str();
            if quote.trim().is_empty() {
                continue;
            }
            // Mentions never start or end in whitespace, so the quote is the name.
            let start = m.start() + (quote.len() - quote.trim_start().len());
            let end = m.end() - (quote.len() - quote.trim_end().len());
            out.push(Found {
                start,
                end,
                type_id: self.type_id.clone(),
                entity_key: entity_key(&self.type_id, &text[start..end]),
                method: Method::Pattern,
            });
        }
    }
}
