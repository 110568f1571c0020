//! Chunk packages and outline sections as the camelCase JSON tools return.
//! Every string that came from a file or a store is sanitised here, the last
//! hop before a model reads it.

use kg_common::sanitize::{DEFAULT_FIELD_CAP, sanitize_text};
use kg_proto::v1::{ChunkPackage, OutlineRef, OutlineSection, Permission};
use serde_json::{Map, Value, json};

/// Cap on short fields (titles, names, keys).
const SHORT_FIELD_CAP: usize = 1024;

fn clean(text: &str) -> Value {
    Value::String(sanitize_text(text, SHORT_FIELD_CAP))
}

/// A search hit's folded copies (chunks with the same text), when it has any:
/// `{"count": n, "copies": [{"chunkKey", "fileId", "path"}, ...]}` with at most the first
/// few copies listed and `count` counting all of them.
pub(crate) fn duplicates_json(hit: &kg_proto::v1::SearchHit) -> Option<Value> {
    if hit.duplicate_count == 0 {
        return None;
    }
    let copies: Vec<Value> = hit
        .duplicates
        .iter()
        .map(|c| json!({"chunkKey": clean(&c.chunk_key), "fileId": clean(&c.file_id), "path": clean(&c.path)}))
        .collect();
    Some(json!({"count": hit.duplicate_count, "copies": copies}))
}

/// A JSON number; a non-finite float (which JSON cannot carry) becomes 0.
pub(crate) fn number(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or_else(|| json!(0.0), Value::Number)
}

fn put_opt<T: Into<Value>>(map: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(v) = value {
        map.insert(key.to_owned(), v.into());
    }
}

/// The lowercase name of a permission.
pub(crate) fn permission_name(permission: Permission) -> &'static str {
    match permission {
        Permission::Admin => "admin",
        Permission::Write => "write",
        // An access entry exists only for readable namespaces.
        Permission::Read | Permission::Unspecified => "read",
    }
}

fn outline_ref(r: &OutlineRef) -> Value {
    json!({
        "outlineKey": clean(&r.outline_key),
        "title": clean(&r.title),
        "depth": r.depth,
        "order": r.order,
    })
}

/// One chunk package in the shared JSON shape.
pub(crate) fn package_json(p: &ChunkPackage) -> Value {
    let mut out = Map::new();
    out.insert("namespace".into(), clean(&p.namespace));
    out.insert("chunkKey".into(), clean(&p.chunk_key));
    out.insert("fileId".into(), clean(&p.file_id));
    out.insert("path".into(), clean(&p.path));
    put_opt(&mut out, "score", p.score.map(number));
    let text = p.text.clone().unwrap_or_default();
    out.insert(
        "text".into(),
        Value::String(sanitize_text(&text.text, DEFAULT_FIELD_CAP)),
    );
    out.insert("contextHeader".into(), clean(&text.context_header));
    out.insert("citation".into(), clean(&text.citation));
    if text.text_truncated {
        out.insert("textTruncated".into(), Value::Bool(true));
    }
    if text.text_omitted {
        out.insert("textOmitted".into(), Value::Bool(true));
    }

    let pos = p.position.clone().unwrap_or_default();
    let mut position = Map::new();
    position.insert("chunkIndex".into(), pos.chunk_index.into());
    put_opt(&mut position, "charStart", pos.char_start);
    put_opt(&mut position, "charEnd", pos.char_end);
    put_opt(&mut position, "pageStart", pos.page_start);
    put_opt(&mut position, "pageEnd", pos.page_end);
    put_opt(&mut position, "lineStart", pos.line_start);
    put_opt(&mut position, "lineEnd", pos.line_end);
    position.insert("tokenCount".into(), pos.token_count.into());
    put_opt(
        &mut position,
        "prevChunkKey",
        pos.prev_chunk_key.as_deref().map(clean),
    );
    put_opt(
        &mut position,
        "nextChunkKey",
        pos.next_chunk_key.as_deref().map(clean),
    );
    out.insert("position".into(), Value::Object(position));

    let outline = p.outline.clone().unwrap_or_default();
    let mut outline_json = Map::new();
    put_opt(
        &mut outline_json,
        "section",
        outline.section.as_ref().map(outline_ref),
    );
    outline_json.insert(
        "ancestors".into(),
        outline.ancestors.iter().map(outline_ref).collect(),
    );
    outline_json.insert(
        "siblings".into(),
        outline.siblings.iter().map(outline_ref).collect(),
    );
    outline_json.insert(
        "children".into(),
        outline.children.iter().map(outline_ref).collect(),
    );
    out.insert("outline".into(), Value::Object(outline_json));

    let mentions: Vec<Value> = p
        .mentions
        .iter()
        .map(|m| {
            let mut v = Map::new();
            v.insert("entityKey".into(), clean(&m.entity_key));
            v.insert("name".into(), clean(&m.name));
            v.insert("typeId".into(), clean(&m.type_id));
            v.insert("typeLabel".into(), clean(&m.type_label));
            v.insert("method".into(), clean(&m.method));
            v.insert("quote".into(), clean(&m.quote));
            put_opt(&mut v, "charStart", m.char_start);
            put_opt(&mut v, "charEnd", m.char_end);
            Value::Object(v)
        })
        .collect();
    out.insert("mentions".into(), Value::Array(mentions));
    let rel: Vec<Value> = p
        .rel_neighbors
        .iter()
        .map(|r| {
            json!({
                "sourceEntityKey": clean(&r.source_entity_key),
                "relationTypeId": clean(&r.relation_type_id),
                "targetEntityKey": clean(&r.target_entity_key),
                "targetName": clean(&r.target_name),
                "statedInFileId": clean(&r.stated_in_file_id),
                "sourceName": clean(&r.source_name),
                "direction": clean(&r.direction),
                "entityKey": clean(&r.entity_key),
                "otherEntityKey": clean(&r.other_entity_key),
                "otherName": clean(&r.other_name),
                "otherTypeId": clean(&r.other_type_id),
                "statedInChunkKey": clean(&r.stated_in_chunk_key),
            })
        })
        .collect();
    out.insert("relNeighbors".into(), Value::Array(rel));

    let dates = p.dates.clone().unwrap_or_default();
    let mut dates_json = Map::new();
    put_opt(
        &mut dates_json,
        "documentDate",
        dates.document_date.as_deref().map(clean),
    );
    put_opt(
        &mut dates_json,
        "effectiveFrom",
        dates.effective_from.as_deref().map(clean),
    );
    put_opt(
        &mut dates_json,
        "effectiveTo",
        dates.effective_to.as_deref().map(clean),
    );
    dates_json.insert(
        "collections".into(),
        dates.collections.iter().map(|c| clean(c)).collect(),
    );
    out.insert("dates".into(), Value::Object(dates_json));

    let similar: Vec<Value> = p
        .similar_files
        .iter()
        .map(|s| json!({"fileId": clean(&s.file_id), "path": clean(&s.path), "score": number(s.score)}))
        .collect();
    out.insert("similarFiles".into(), Value::Array(similar));

    if let Some(counts) = p.counts.as_ref().filter(|c| !c.lists.is_empty()) {
        let map: Map<String, Value> = counts
            .lists
            .iter()
            .map(|c| {
                (
                    sanitize_text(&c.list, SHORT_FIELD_CAP),
                    json!({"total": c.total, "truncated": c.truncated}),
                )
            })
            .collect();
        out.insert("counts".into(), Value::Object(map));
    }
    Value::Object(out)
}

/// One outline section in the kg_outline JSON shape.
pub(crate) fn section_json(s: &OutlineSection) -> Value {
    let mut out = Map::new();
    out.insert("outlineKey".into(), clean(&s.outline_key));
    out.insert("title".into(), clean(&s.title));
    out.insert("depth".into(), s.depth.into());
    out.insert("order".into(), s.order.into());
    put_opt(&mut out, "parentKey", s.parent_key.as_deref().map(clean));
    put_opt(&mut out, "lineStart", s.line_start);
    put_opt(&mut out, "pageStart", s.page_start);
    put_opt(&mut out, "pageEnd", s.page_end);
    out.insert("chunkCount".into(), s.chunk_count.into());
    Value::Object(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_proto::v1::{ChunkText, ListCount, ListCounts, Position};

    #[test]
    fn package_has_the_shared_shape_and_clean_text() {
        let p = ChunkPackage {
            namespace: "demo".into(),
            chunk_key: "c1".into(),
            file_id: "f1".into(),
            path: "guides/intro.md".into(),
            score: Some(0.5),
            text: Some(ChunkText {
                text: "Hello\u{202E} world\u{1b}[31m!".into(),
                context_header: "Intro › Setup".into(),
                citation: "demo/guides/intro.md › Setup".into(),
                ..Default::default()
            }),
            position: Some(Position {
                chunk_index: 2,
                char_start: Some(10),
                char_end: Some(20),
                line_start: Some(3),
                line_end: Some(4),
                token_count: 5,
                next_chunk_key: Some("c2".into()),
                ..Default::default()
            }),
            counts: Some(ListCounts {
                lists: vec![ListCount {
                    list: "mentions".into(),
                    total: 30,
                    truncated: true,
                }],
            }),
            ..Default::default()
        };
        let v = package_json(&p);
        assert_eq!(v["text"], "Hello world!");
        assert_eq!(v["score"], 0.5);
        assert_eq!(v["position"]["chunkIndex"], 2);
        assert_eq!(v["position"]["nextChunkKey"], "c2");
        assert!(v["position"].get("prevChunkKey").is_none());
        assert!(v["position"].get("pageStart").is_none());
        assert_eq!(v["outline"]["ancestors"], json!([]));
        assert!(v["outline"].get("section").is_none());
        assert_eq!(v["dates"], json!({"collections": []}));
        assert_eq!(
            v["counts"]["mentions"],
            json!({"total": 30, "truncated": true})
        );
        assert!(v.get("textOmitted").is_none());
    }
}
