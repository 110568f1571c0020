#![allow(clippy::unwrap_used, clippy::expect_used)]

use kg_proto::v1::{EntityInstance, EntityType, RelationType, Tbox};

use super::*;

/// An entity type with known instances written `"Canonical = Alias = Alias"`.
fn ty(id: &str, instances: &[&str], patterns: &[&str]) -> EntityType {
    EntityType {
        type_id: id.into(),
        label: id.into(),
        aliases: Vec::new(),
        patterns: patterns.iter().map(|s| (*s).to_owned()).collect(),
        side: String::new(),
        instances: instances
            .iter()
            .map(|forms| {
                let mut forms = forms.split('=').map(|f| f.trim().to_owned());
                EntityInstance {
                    name: forms.next().unwrap_or_default(),
                    aliases: forms.collect(),
                }
            })
            .collect(),
    }
}

fn rel(id: &str, source: &str, target: &str, patterns: &[&str]) -> RelationType {
    RelationType {
        relation_type_id: id.into(),
        label: id.into(),
        source_type_id: source.into(),
        target_type_id: target.into(),
        patterns: patterns.iter().map(|s| (*s).to_owned()).collect(),
    }
}

fn tbox() -> Tbox {
    Tbox {
        namespace: "demo".into(),
        version: 3,
        entity_types: vec![
            ty(
                "Person",
                &["Ada Lovelace = Ada = Countess of Lovelace", "Grace Hopper"],
                &[],
            ),
            ty(
                "Organization",
                &["Acme Corporation = Acme", "Globex", "Zoë Labs"],
                &[],
            ),
            ty("Ticket", &[], &[r"\bOPS-\d+\b", "(unclosed"]),
        ],
        relation_types: vec![
            rel(
                "works_at",
                "Person",
                "Organization",
                &["{source} works at {target}", "{source} joined {target}"],
            ),
            rel(
                "acquired",
                "Organization",
                "Organization",
                &[
                    "{source} acquired {target}",
                    "{target} was acquired by {source}",
                    "no placeholders",
                ],
            ),
        ],
        published_at_ms: 42,
    }
}

fn chunk(key: &str, index: u32, char_start: u64, text: &str) -> ChunkRecord {
    ChunkRecord {
        chunk_key: key.into(),
        index,
        text: text.into(),
        context_header: String::new(),
        char_start,
        char_end: char_start + text.chars().count() as u64,
        line_start: 1,
        line_end: 1,
        page_start: None,
        page_end: None,
        token_count: 1,
        section_key: None,
    }
}

fn quotes(x: &Extraction) -> Vec<(String, &'static str, String)> {
    x.mentions
        .iter()
        .map(|m| (m.quote.clone(), m.method.as_str(), m.entity_key.clone()))
        .collect()
}

#[test]
fn bad_patterns_are_skipped_with_warnings() {
    let ex = Extractor::compile(&tbox());
    assert_eq!(ex.warnings().len(), 2, "{:?}", ex.warnings());
    assert!(ex.warnings()[0].contains("(unclosed"));
    assert!(ex.warnings()[1].contains("no placeholders"));
    assert_eq!(ex.declared().len(), 5);
    assert_eq!(ex.declared()[0].aliases, ["Ada", "Countess of Lovelace"]);
    assert_eq!(ex.types()[0].side, "published");
    assert_eq!(ex.stamp(), "3@42");
}

#[test]
fn gazetteer_matches_whole_words_case_insensitively_longest_first() {
    let ex = Extractor::compile(&tbox());
    let text = "ACME CORPORATION hired ada lovelace. Acmeville is not Acme. Globex's zoë labs.";
    let x = ex.extract(&[chunk("c0", 0, 100, text)]);
    assert_eq!(
        quotes(&x),
        vec![
            (
                "ACME CORPORATION".into(),
                "gazetteer",
                "ent:Organization:acme corporation".into()
            ),
            (
                "ada lovelace".into(),
                "gazetteer",
                "ent:Person:ada lovelace".into()
            ),
            (
                "Acme".into(),
                "gazetteer",
                "ent:Organization:acme corporation".into()
            ),
            (
                "Globex".into(),
                "gazetteer",
                "ent:Organization:globex".into()
            ),
            (
                "zoë labs".into(),
                "gazetteer",
                "ent:Organization:zoë labs".into()
            ),
        ]
    );
    let chars: Vec<char> = text.chars().collect();
    for m in &x.mentions {
        let s = (m.char_start - 100) as usize;
        let e = (m.char_end - 100) as usize;
        assert_eq!(chars[s..e].iter().collect::<String>(), m.quote);
    }
    assert_eq!(
        x.entities["ent:Organization:acme corporation"].name,
        "Acme Corporation"
    );
    assert!(x.entities["ent:Organization:acme corporation"].declared);
}

#[test]
fn patterns_and_relations_in_one_sentence() {
    let ex = Extractor::compile(&tbox());
    let text = "Ada works at Acme. Grace Hopper joined\nGlobex on OPS-12. Globex was acquired by Acme Corporation.\nGrace Hopper.\n- works at Acme";
    let x = ex.extract(&[chunk("c0", 0, 0, text)]);
    let tickets: Vec<&Mention> = x
        .mentions
        .iter()
        .filter(|m| m.method == Method::Pattern)
        .collect();
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0].quote, "OPS-12");
    assert_eq!(tickets[0].entity_key, "ent:Ticket:ops-12");
    assert_eq!(x.entities["ent:Ticket:ops-12"].name, "OPS-12");
    let rels: Vec<(&str, &str, &str)> = x
        .relations
        .iter()
        .map(|r| {
            (
                r.relation_type_id.as_str(),
                r.source_key.as_str(),
                r.target_key.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rels,
        vec![
            (
                "acquired",
                "ent:Organization:acme corporation",
                "ent:Organization:globex"
            ),
            (
                "works_at",
                "ent:Person:ada lovelace",
                "ent:Organization:acme corporation"
            ),
            (
                "works_at",
                "ent:Person:grace hopper",
                "ent:Organization:globex"
            ),
        ]
    );
}

#[test]
fn regex_relations_create_the_mentions_they_need() {
    let mut t = tbox();
    t.relation_types.push(rel(
        "owns",
        "Person",
        "Ticket",
        &[r"re:(?P<source>Grace Hopper) owns (?P<target>[a-z]+ ticket)"],
    ));
    let ex = Extractor::compile(&t);
    let x = ex.extract(&[chunk("c0", 0, 0, "Grace Hopper owns the ticket.")]);
    assert_eq!(x.relations.len(), 1);
    assert_eq!(x.relations[0].target_key, "ent:Ticket:the ticket");
    let methods: Vec<&str> = x.mentions.iter().map(|m| m.method.as_str()).collect();
    assert_eq!(methods, ["gazetteer", "pattern"]);
}

#[test]
fn candidates_are_counted_once_across_overlap_and_never_entities() {
    let ex = Extractor::compile(&tbox());
    let first =
        "Our Network Operations Center paged the SRE team about INC-2024-7. Ada Lovelace agreed.";
    // The second chunk repeats the tail of the first (overlap) and adds one more sighting.
    let overlap = "Ada Lovelace agreed.";
    let second = format!(
        "{overlap} The Network Operations Center closed INC-2024-7 and PROJ-9 at NATS, not OPS-3."
    );
    let start2 = (first.chars().count() - overlap.chars().count()) as u64;
    let x = ex.extract(&[chunk("c0", 0, 0, first), chunk("c1", 1, start2, &second)]);
    let got: Vec<(&str, &str, u32)> = x
        .candidates
        .iter()
        .map(|c| (c.candidate_key.as_str(), c.kind.as_str(), c.count))
        .collect();
    assert_eq!(
        got,
        vec![
            ("acronym:nats", "acronym", 1),
            ("acronym:sre", "acronym", 1),
            ("identifier:inc-2024-7", "identifier", 2),
            ("identifier:proj-9", "identifier", 1),
            ("proper_name:network operations center", "proper_name", 2),
        ]
    );
    // OPS-3 is a Ticket pattern match: TBox mentions win over candidates.
    assert!(x.entities.contains_key("ent:Ticket:ops-3"));
    assert!(!x.entities.keys().any(|k| k.contains("network")));
}

#[test]
fn no_tbox_only_proposes_candidates() {
    let x = extractor_for(None).extract(&[chunk("c0", 0, 0, "Grace Hopper works at Globex.")]);
    assert!(x.mentions.is_empty() && x.entities.is_empty());
    assert_eq!(x.candidates[0].candidate_key, "proper_name:grace hopper");
    let a = extractor_for(Some(&tbox()));
    let b = extractor_for(Some(&tbox()));
    assert!(Arc::ptr_eq(&a, &b), "compiled once per TBox version");
}

#[test]
fn entity_keys_hold_no_hidden_characters() {
    // A name an LLM extractor was told to dress up: the same key as the plain name.
    assert_eq!(
        entity_key("org", "Ac\u{202E}me\u{200B} \u{E0041}Corp\u{FE0F}"),
        "ent:org:acme corp"
    );
    assert_eq!(normalize_name("Ada\u{2066}  Lovelace"), "ada lovelace");
}

#[test]
fn entity_keys_fit_the_services_limit_and_stay_one_per_entity() {
    assert_eq!(entity_key("org", "Acme  Corp"), "ent:org:acme corp");
    let long = |tail: &str| {
        format!(
            "{} {tail}",
            "Consolidated Turbine Blade Works ".repeat(12).trim_end()
        )
    };
    let key = entity_key("org", &long("North"));
    assert!(key.len() <= MAX_KEY_BYTES, "{} bytes", key.len());
    assert!(
        key.starts_with("ent:org:consolidated turbine blade works"),
        "{key}"
    );
    assert_eq!(
        key,
        entity_key("org", &long("north")),
        "spelled another way, the same entity"
    );
    assert_ne!(
        key,
        entity_key("org", &long("South")),
        "same start, another entity"
    );
    // Cut at a character boundary: a name of two-byte letters leaves a valid key.
    let greek = entity_key("place", &"Αθήνα ".repeat(40));
    assert!(
        greek.len() <= MAX_KEY_BYTES && greek.contains("αθήνα"),
        "{greek}"
    );
    // A long type id too.
    assert!(entity_key(&"t".repeat(300), "Acme").len() <= MAX_KEY_BYTES);
}
