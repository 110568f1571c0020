//! Entities and relations from a namespace's published TBox, without an LLM.
//!
//! [`Extractor::compile`] turns a `kg.v1.Tbox` into matchers once per TBox version
//! ([`extractor_for`] caches them); [`Extractor::extract`] runs them over one file's chunks:
//!
//! - **gazetteer**: the known instances the TBox names, matched case-insensitively (ASCII
//!   letters; other letters as written or lowercased) on word boundaries with one Aho-Corasick
//!   automaton; where names overlap the longest match wins. `EntityType.instances` declares
//!   them: a canonical name and its other surface forms (`Acme Corporation`, aliases `Acme`,
//!   `ACME Corp`). `EntityType.aliases` are synonyms of the type label and are not matched:
//!   "company" in a text is no Organization.
//! - **pattern**: `EntityType.patterns` are regexes (size-limited; a bad one is skipped with a
//!   warning). The whole match, or the named group `name` when present, is a mention of that type.
//! - **relations**: `RelationType.patterns`, see `relations.rs` for the syntax
//!   (`"{source} works at {target}"`, or `re:` and a regex with groups `source` and `target`).
//! - **heuristic**: multi-word proper names, acronyms and identifiers (`ABC-123`) that no
//!   TBox matcher found become counted [`Candidate`]s for the ontology review, never entities.
//!
//! Offsets are in characters of the parsed text: `text[charStart..charEnd] == quote`.

mod gazetteer;
mod heuristic;
pub mod llm;
mod patterns;
mod relations;
mod text;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use kg_proto::limits::MAX_KEY_BYTES;
use kg_proto::v1::Tbox;
use sha2::{Digest as _, Sha256};

use crate::graph_writer::ChunkRecord;

pub use heuristic::CandidateKind;

/// How a mention was found (the `method` of a MENTIONS edge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// A name the TBox declares.
    Gazetteer,
    /// A regex of an entity type or a relation type.
    Pattern,
    /// The proper-name / acronym / identifier heuristics (candidates only).
    Heuristic,
    /// An LLM extractor.
    Llm,
}

impl Method {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Gazetteer => "gazetteer",
            Method::Pattern => "pattern",
            Method::Heuristic => "heuristic",
            Method::Llm => "llm",
        }
    }
}

/// An entity type of the TBox, as the graph stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeRecord {
    pub type_id: String,
    pub label: String,
    /// `EntityType.side`, "published" when the TBox leaves it empty.
    pub side: String,
}

/// A relation type of the TBox (what the LLM extractor is told it may report).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationTypeRecord {
    pub relation_type_id: String,
    pub label: String,
    /// Empty: any entity type.
    pub source_type_id: String,
    pub target_type_id: String,
}

/// An entity node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityRecord {
    /// `ent:<typeId>:<normalised name>`.
    pub entity_key: String,
    /// Display name: the declared canonical name, else the first quote seen.
    pub name: String,
    pub type_id: String,
    /// Other declared surface forms.
    pub aliases: Vec<String>,
    /// Declared in the TBox (kept while the TBox names it, even without mentions).
    pub declared: bool,
}

/// One mention of an entity in one chunk.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mention {
    pub chunk_key: String,
    /// Characters into the parsed text.
    pub char_start: u64,
    pub char_end: u64,
    pub entity_key: String,
    pub method: Method,
    /// The exact text at `char_start..char_end`.
    pub quote: String,
}

/// A relation stated by one chunk.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Relation {
    pub relation_type_id: String,
    pub source_key: String,
    pub target_key: String,
    pub chunk_key: String,
}

/// A name the heuristics propose for the ontology review, counted over one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// `<kind>:<normalised name>`, stable across files.
    pub candidate_key: String,
    /// The text as first seen.
    pub name: String,
    pub kind: CandidateKind,
    /// Occurrences in the file (text repeated by chunk overlap counts once).
    pub count: u32,
}

/// What extraction found in one file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extraction {
    /// Every entity a mention points at, by key.
    pub entities: BTreeMap<String, EntityRecord>,
    /// Mentions in chunk order, then by offset.
    pub mentions: Vec<Mention>,
    pub relations: Vec<Relation>,
    pub candidates: Vec<Candidate>,
}

impl Extraction {
    /// Adds what another pass (the LLM) found: its entities where the key is new, mentions
    /// not already found at the same place for the same entity, relations not already stated.
    pub fn merge(&mut self, other: Extraction) {
        for (key, record) in other.entities {
            self.entities.entry(key).or_insert(record);
        }
        let have: HashSet<(String, u64, u64, String)> = self
            .mentions
            .iter()
            .map(|m| {
                (
                    m.chunk_key.clone(),
                    m.char_start,
                    m.char_end,
                    m.entity_key.clone(),
                )
            })
            .collect();
        self.mentions.extend(other.mentions.into_iter().filter(|m| {
            !have.contains(&(
                m.chunk_key.clone(),
                m.char_start,
                m.char_end,
                m.entity_key.clone(),
            ))
        }));
        self.relations.extend(other.relations);
        self.relations.sort();
        self.relations.dedup();
    }
}

/// Lowercase, whitespace collapsed to single spaces, trimmed, and without the characters
/// the sanitiser strips: the name is part of the entity key, which tools show and take back
/// as it is, so hidden characters (an LLM extractor can be told to put them in a name) must
/// never reach it.
pub fn normalize_name(name: &str) -> String {
    let name = kg_common::sanitize::sanitized(name, usize::MAX);
    let mut out = String::with_capacity(name.len());
    for word in name.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.extend(word.chars().flat_map(char::to_lowercase));
    }
    out
}

/// `ent:<typeId>:<normalised name>`, stable across files. A key that would be longer than
/// the services accept ([`MAX_KEY_BYTES`]: a long name a pattern matched, say) keeps its
/// longest prefix that fits beside `~` and 16 hex digits of the whole key's SHA-256, so it
/// still names one entity, the same from every file, and kg_open and kg_hop take it.
pub fn entity_key(type_id: &str, name: &str) -> String {
    let key = format!("ent:{type_id}:{}", normalize_name(name));
    if key.len() <= MAX_KEY_BYTES {
        return key;
    }
    let digest = hex::encode(&Sha256::digest(key.as_bytes())[..8]);
    let mut cut = MAX_KEY_BYTES - digest.len() - 1;
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{digest}", &key[..cut])
}

/// At most this many mentions per chunk (a too-broad regex must not flood the graph).
const MAX_MENTIONS_PER_CHUNK: usize = 512;

/// The TBox compiled into matchers. Build with [`Extractor::compile`] or get a cached one from
/// [`extractor_for`].
#[derive(Debug)]
pub struct Extractor {
    stamp: String,
    types: Vec<TypeRecord>,
    declared: Vec<EntityRecord>,
    gazetteer: Option<gazetteer::Gazetteer>,
    patterns: Vec<patterns::EntityPattern>,
    relations: Vec<relations::RelationRule>,
    relation_types: Vec<RelationTypeRecord>,
    warnings: Vec<String>,
}

impl Extractor {
    /// No TBox: only the heuristic pass runs (candidates help write the first ontology).
    pub fn empty() -> Extractor {
        Extractor {
            stamp: tbox_stamp(None),
            types: Vec::new(),
            declared: Vec::new(),
            gazetteer: None,
            patterns: Vec::new(),
            relations: Vec::new(),
            relation_types: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// Compiles `tbox`. Never fails: a bad pattern or declaration is skipped and reported in
    /// [`Extractor::warnings`] (and the log).
    pub fn compile(tbox: &Tbox) -> Extractor {
        let mut warnings = Vec::new();
        let mut types = Vec::new();
        let mut declared: Vec<EntityRecord> = Vec::new();
        let mut seen_keys = HashSet::new();
        let mut pattern_list = Vec::new();
        for ty in &tbox.entity_types {
            let type_id = ty.type_id.trim();
            if type_id.is_empty() {
                warnings.push("an entity type without a type id was skipped".to_owned());
                continue;
            }
            types.push(TypeRecord {
                type_id: type_id.to_owned(),
                label: if ty.label.trim().is_empty() {
                    type_id.to_owned()
                } else {
                    ty.label.trim().to_owned()
                },
                side: if ty.side.trim().is_empty() {
                    "published".to_owned()
                } else {
                    ty.side.trim().to_owned()
                },
            });
            for instance in &ty.instances {
                let mut forms = std::iter::once(&instance.name)
                    .chain(&instance.aliases)
                    .map(|f| f.split_whitespace().collect::<Vec<_>>().join(" "))
                    .filter(|f| !f.is_empty());
                let Some(name) = forms.next() else { continue };
                let key = entity_key(type_id, &name);
                if !seen_keys.insert(key.clone()) {
                    continue;
                }
                declared.push(EntityRecord {
                    entity_key: key,
                    name,
                    type_id: type_id.to_owned(),
                    aliases: forms.collect(),
                    declared: true,
                });
            }
            for pattern in &ty.patterns {
                match kg_common::tbox_patterns::entity_pattern(pattern) {
                    Ok(regex) => pattern_list.push(patterns::EntityPattern {
                        type_id: type_id.to_owned(),
                        regex,
                    }),
                    Err(reason) => warnings.push(format!(
                        "entity type `{type_id}`: pattern `{}` skipped: {reason}",
                        truncate(pattern)
                    )),
                }
            }
        }
        let known_types: HashSet<&str> = types.iter().map(|t| t.type_id.as_str()).collect();
        let mut rules = Vec::new();
        let mut relation_types = Vec::new();
        for rel in &tbox.relation_types {
            let id = rel.relation_type_id.trim();
            if id.is_empty() {
                warnings.push("a relation type without an id was skipped".to_owned());
                continue;
            }
            relation_types.push(RelationTypeRecord {
                relation_type_id: id.to_owned(),
                label: rel.label.trim().to_owned(),
                source_type_id: rel.source_type_id.trim().to_owned(),
                target_type_id: rel.target_type_id.trim().to_owned(),
            });
            for endpoint in [&rel.source_type_id, &rel.target_type_id] {
                if !endpoint.is_empty() && !known_types.contains(endpoint.as_str()) {
                    warnings.push(format!(
                        "relation type `{id}` names unknown entity type `{endpoint}`"
                    ));
                }
            }
            for pattern in &rel.patterns {
                match relations::RelationRule::compile(
                    id,
                    &rel.source_type_id,
                    &rel.target_type_id,
                    pattern,
                ) {
                    Ok(rule) => rules.push(rule),
                    Err(reason) => warnings.push(format!(
                        "relation type `{id}`: pattern `{}` skipped: {reason}",
                        truncate(pattern)
                    )),
                }
            }
        }
        let gazetteer = match gazetteer::Gazetteer::build(&declared) {
            Ok(g) => g,
            Err(reason) => {
                warnings.push(format!("gazetteer not built: {reason}"));
                None
            }
        };
        for warning in &warnings {
            tracing::warn!(namespace = %tbox.namespace, version = tbox.version, "{warning}");
        }
        Extractor {
            stamp: tbox_stamp(Some(tbox)),
            types,
            declared,
            gazetteer,
            patterns: pattern_list,
            relations: rules,
            relation_types,
            warnings,
        }
    }

    /// Identifies the TBox this was compiled from (`version@publishedAtMs`, or `none`).
    pub fn stamp(&self) -> &str {
        &self.stamp
    }

    /// The TBox's entity types.
    pub fn types(&self) -> &[TypeRecord] {
        &self.types
    }

    /// The TBox's relation types.
    pub fn relation_types(&self) -> &[RelationTypeRecord] {
        &self.relation_types
    }

    /// The instances the TBox declares.
    pub fn declared(&self) -> &[EntityRecord] {
        &self.declared
    }

    /// What was skipped while compiling.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Runs every matcher over one file's chunks (in any order; overlap between consecutive
    /// chunks is allowed).
    pub fn extract(&self, chunks: &[ChunkRecord]) -> Extraction {
        let mut out = Extraction::default();
        let mut ordered: Vec<&ChunkRecord> = chunks.iter().collect();
        ordered.sort_by_key(|c| c.index);
        let mut candidates = heuristic::Counter::default();
        let mut covered_until = 0u64;
        for chunk in ordered {
            let map = text::CharMap::new(&chunk.text);
            let mut found: Vec<text::Found> = Vec::new();
            if let Some(g) = &self.gazetteer {
                g.find(&chunk.text, &mut found);
            }
            for p in &self.patterns {
                p.find(&chunk.text, &mut found);
            }
            let known: HashSet<&str> = self.types.iter().map(|t| t.type_id.as_str()).collect();
            found.retain(|f| known.contains(f.type_id.as_str()));
            let mut rels = Vec::new();
            for rule in &self.relations {
                rule.find(&chunk.text, &mut found, &mut rels);
            }
            found.sort_by(|a, b| {
                (a.start, a.end, &a.entity_key).cmp(&(b.start, b.end, &b.entity_key))
            });
            found.dedup_by(|a, b| {
                a.start == b.start && a.end == b.end && a.entity_key == b.entity_key
            });
            found.truncate(MAX_MENTIONS_PER_CHUNK);
            for f in &found {
                let quote = chunk.text[f.start..f.end].to_owned();
                out.entities.entry(f.entity_key.clone()).or_insert_with(|| {
                    self.declared
                        .iter()
                        .find(|d| d.entity_key == f.entity_key)
                        .cloned()
                        .unwrap_or_else(|| EntityRecord {
                            entity_key: f.entity_key.clone(),
                            name: quote.split_whitespace().collect::<Vec<_>>().join(" "),
                            type_id: f.type_id.clone(),
                            aliases: Vec::new(),
                            declared: false,
                        })
                });
                out.mentions.push(Mention {
                    chunk_key: chunk.chunk_key.clone(),
                    char_start: chunk.char_start + map.char_at(f.start),
                    char_end: chunk.char_start + map.char_at(f.end),
                    entity_key: f.entity_key.clone(),
                    method: f.method,
                    quote,
                });
            }
            let kept: HashSet<&str> = found.iter().map(|f| f.entity_key.as_str()).collect();
            for (relation_type_id, source_key, target_key) in rels {
                if kept.contains(source_key.as_str()) && kept.contains(target_key.as_str()) {
                    out.relations.push(Relation {
                        relation_type_id,
                        source_key,
                        target_key,
                        chunk_key: chunk.chunk_key.clone(),
                    });
                }
            }
            // Text the previous chunk already covered (overlap) is counted once.
            let fresh_from = covered_until.saturating_sub(chunk.char_start);
            let spans: Vec<(usize, usize)> = found.iter().map(|f| (f.start, f.end)).collect();
            candidates.scan(&chunk.text, &map, fresh_from, &spans, &self.declared);
            covered_until = covered_until.max(chunk.char_end);
        }
        out.relations.sort();
        out.relations.dedup();
        out.candidates = candidates.finish();
        out
    }
}

fn truncate(pattern: &str) -> String {
    pattern.chars().take(80).collect()
}

/// Compiled extractors by (namespace, TBox stamp); the newest per namespace is kept.
fn cache() -> &'static Mutex<HashMap<String, Arc<Extractor>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Extractor>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// What identifies a published TBox in the entity stamps of the files extracted with it:
/// `version@publishedAtMs`, or `none` without one.
pub fn tbox_stamp(tbox: Option<&Tbox>) -> String {
    tbox.map_or_else(
        || "none".to_owned(),
        |tbox| format!("{}@{}", tbox.version, tbox.published_at_ms),
    )
}

/// The extractor for `tbox` (or [`Extractor::empty`] for `None`), compiled once per TBox
/// version and namespace.
pub fn extractor_for(tbox: Option<&Tbox>) -> Arc<Extractor> {
    let Some(tbox) = tbox else {
        static EMPTY: OnceLock<Arc<Extractor>> = OnceLock::new();
        return EMPTY.get_or_init(|| Arc::new(Extractor::empty())).clone();
    };
    let stamp = tbox_stamp(Some(tbox));
    if let Ok(cache) = cache().lock()
        && let Some(found) = cache.get(&tbox.namespace)
        && found.stamp == stamp
    {
        return found.clone();
    }
    let compiled = Arc::new(Extractor::compile(tbox));
    if let Ok(mut cache) = cache().lock() {
        cache.insert(tbox.namespace.clone(), compiled.clone());
    }
    compiled
}
