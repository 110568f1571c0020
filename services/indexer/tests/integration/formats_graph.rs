//! HTML and PDF files through the pipeline into a real FalkorDB: FileRef metadata
//! (title, docType, tags, dates, collections), chunk page spans and outline pages.
use kg_indexer::document::ChunkOptions;
use kg_indexer::graph_writer;
use kg_indexer::pipeline::{FileMeta, index_document};
use kg_stores::embedded::{EmbeddedFalkor, find_venv};
use kg_stores::graph::{GraphStore, Params};
use lopdf::content::{Content, Operation};
use lopdf::{Bookmark, Document, Object, Stream, dictionary};
use serde_json::{Value, json};

const NS: &str = "formats";

/// A two-page PDF with bookmarks and an Info dictionary.
fn report_pdf() -> Vec<u8> {
    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let font_id = doc.add_object(dictionary! {
        "Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Helvetica",
    });
    let resources_id = doc.add_object(dictionary! { "Font" => dictionary! { "F1" => font_id } });
    let pages: [&[&str]; 2] = [
        &["Scope", "This policy covers laptops and phones."],
        &["Retention", "Devices are wiped after ninety days."],
    ];
    let mut page_ids = Vec::new();
    for lines in pages {
        let mut ops = vec![
            Operation::new("BT", vec![]),
            Operation::new("Tf", vec!["F1".into(), 12.into()]),
            Operation::new("Td", vec![72.into(), 760.into()]),
        ];
        for (i, line) in lines.iter().enumerate() {
            if i > 0 {
                ops.push(Operation::new("Td", vec![0.into(), (-30).into()]));
            }
            ops.push(Operation::new("Tj", vec![Object::string_literal(*line)]));
        }
        ops.push(Operation::new("ET", vec![]));
        let content = Content { operations: ops }.encode().unwrap();
        let content_id = doc.add_object(Stream::new(dictionary! {}, content));
        page_ids.push(doc.add_object(dictionary! {
            "Type" => "Page", "Parent" => pages_id, "Contents" => content_id,
        }));
    }
    let kids: Vec<Object> = page_ids.iter().map(|&id| id.into()).collect();
    doc.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! {
            "Type" => "Pages", "Kids" => kids, "Count" => 2,
            "Resources" => resources_id,
            "MediaBox" => vec![0.into(), 0.into(), 612.into(), 792.into()],
        }),
    );
    for (title, page) in [("Scope", 0), ("Retention", 1)] {
        doc.add_bookmark(
            Bookmark::new(title.to_owned(), [0.0; 3], 0, page_ids[page]),
            None,
        );
    }
    let outline = doc.build_outline().unwrap();
    let catalog = doc.add_object(dictionary! {
        "Type" => "Catalog", "Pages" => pages_id, "Outlines" => outline,
    });
    doc.trailer.set("Root", catalog);
    let info = doc.add_object(dictionary! {
        "Title" => Object::string_literal("Device policy"),
        "Keywords" => Object::string_literal("security, devices"),
        "CreationDate" => Object::string_literal("D:20240301000000Z"),
        "DocType" => Object::string_literal("policy"),
    });
    doc.trailer.set("Info", info);
    let mut out = Vec::new();
    doc.save_to(&mut out).unwrap();
    out
}

fn meta(path: &str, mime: &str) -> FileMeta {
    FileMeta {
        namespace: NS.into(),
        file_id: format!("id-{path}"),
        version_id: format!("v-{path}"),
        path: path.into(),
        mime: mime.into(),
        enabled: true,
        hidden: false,
    }
}

async fn one_row(store: &GraphStore, cypher: &str, file_id: &str) -> Vec<Value> {
    let mut params = Params::new();
    params.insert("fileId".into(), json!(file_id));
    let rows = store.query(NS, cypher, &params).await.unwrap();
    assert_eq!(rows.rows.len(), 1, "{cypher}");
    rows.rows.into_iter().next().unwrap()
}

#[tokio::test]
async fn pdf_and_html_land_in_the_graph_with_pages_and_metadata() {
    let venv = find_venv().expect("the dev-deps virtualenv (run deploy/scripts/dev-deps.sh)");
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, dir.path()).await.unwrap();
    let store = GraphStore::connect(&falkor.url).await.unwrap();

    let pdf = index_document(
        &meta("policies/devices.pdf", "application/pdf"),
        &report_pdf(),
        &ChunkOptions {
            target_tokens: 8,
            max_tokens: 64,
            overlap_tokens: 0,
        },
    )
    .unwrap();
    graph_writer::write_document(&store, &pdf.file, &pdf.meta, &pdf.chunks, &pdf.outline)
        .await
        .unwrap();
    let row = one_row(
        &store,
        "MATCH (f:FileRef {fileId: $fileId}) RETURN f.title, f.docType, f.tags, f.documentDate, f.collections, f.chunkCount",
        &pdf.file.file_id,
    )
    .await;
    assert_eq!(row[0], json!("Device policy"));
    assert_eq!(row[1], json!("policy"));
    assert_eq!(row[2], json!(["security", "devices"]));
    assert_eq!(row[3], json!("2024-03-01"));
    assert_eq!(row[4], json!([]));
    assert_eq!(row[5], json!(2));
    let mut params = Params::new();
    params.insert("fileId".into(), json!(pdf.file.file_id));
    let rows = store
        .query(
            NS,
            "MATCH (c:Chunk {fileId: $fileId}) RETURN c.chunkIndex, c.pageStart, c.pageEnd, c.text ORDER BY c.chunkIndex",
            &params,
        )
        .await
        .unwrap();
    let pages: Vec<(Value, Value)> = rows
        .rows
        .iter()
        .map(|r| (r[1].clone(), r[2].clone()))
        .collect();
    assert_eq!(pages, vec![(json!(1), json!(1)), (json!(2), json!(2))]);
    let rows = store
        .query(
            NS,
            "MATCH (o:OutlineNode {fileId: $fileId}) RETURN o.title, o.pageStart, o.pageEnd ORDER BY o.order",
            &params,
        )
        .await
        .unwrap();
    assert_eq!(
        rows.rows,
        vec![
            vec![json!("Scope"), json!(1), json!(1)],
            vec![json!("Retention"), json!(2), json!(2)],
        ]
    );

    let html = br#"<html><head><title>Team page</title><meta name="kg:collections" content="wiki, teams"><meta name="effective-from" content="2024-01-31"></head>
<body><h1>Team</h1><p>We own <a href="../policies/devices.pdf">device policy</a>.</p></body></html>"#;
    let page = index_document(
        &meta("teams/index.html", "text/html"),
        html,
        &ChunkOptions::default(),
    )
    .unwrap();
    assert_eq!(page.links.len(), 1);
    assert_eq!(page.links[0].target_path, "policies/devices.pdf");
    graph_writer::write_document(&store, &page.file, &page.meta, &page.chunks, &page.outline)
        .await
        .unwrap();
    let row = one_row(
        &store,
        "MATCH (f:FileRef {fileId: $fileId}) RETURN f.title, f.collections, f.effectiveFrom, f.effectiveTo, f.docType",
        &page.file.file_id,
    )
    .await;
    assert_eq!(
        row,
        vec![
            json!("Team page"),
            json!(["wiki", "teams"]),
            json!("2024-01-31"),
            Value::Null,
            Value::Null
        ]
    );
    let row = one_row(
        &store,
        "MATCH (c:Chunk {fileId: $fileId}) RETURN c.text, c.pageStart",
        &page.file.file_id,
    )
    .await;
    assert_eq!(
        row,
        vec![json!("Team\n\nWe own device policy."), Value::Null]
    );
}
