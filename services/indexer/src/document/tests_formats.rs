//! HTML, PDF, metadata and link resolution over real documents (PDFs are written here with
//! lopdf, then read back through the same path an upload takes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lopdf::content::{Content, Operation};
use lopdf::{Bookmark, Dictionary, Document, Object, Stream, dictionary};

use super::*;

fn check_offsets(doc: &ParsedDocument, spans: &[ChunkSpan]) {
    let chars: Vec<char> = doc.text.chars().collect();
    for c in spans {
        let slice: String = chars[c.char_start as usize..c.char_end as usize]
            .iter()
            .collect();
        assert_eq!(slice, c.text, "chunk {} offsets", c.index);
        assert_eq!(&doc.text[c.byte_start..c.byte_end], c.text);
    }
}

// ---------- HTML ----------

const PAGE: &str = r#"<!doctype html>
<html><head>
<title>  Release   Guide </title>
<meta name="keywords" content="ops, release">
<meta name="dcterms.date" content="2024-05-01T09:00:00Z">
<meta name="kg:effective-to" content="not a date">
<meta name="collections" content="handbook">
<style>body { color: red }</style>
<script>var hidden = "never indexed";</script>
</head>
<body>
<noscript>Enable JavaScript</noscript>
<template><p>template text</p></template>
<h1>Release guide</h1>
<p>Read the <a href="../ops/runbook.md#rollback">rollback   section</a> first,
then the <a href="https://example.com/docs?x=1">vendor docs</a>.</p>
<div hidden>secret</div>
<h2>Steps</h2>
<ol><li>Tag the build</li><li>Deploy <b>canary</b><ul><li>watch errors</li></ul></li></ol>
<h3>Matrix</h3>
<table><tr><th>Env</th><th>Owner</th></tr><tr><td>prod</td><td>Ada</td></tr></table>
<pre>
  indented code
    more
</pre>
<h2>Notes</h2>
<p>Line one<br>line two é</p>
</body></html>"#;

#[test]
fn html_visible_text_blocks_headings_and_links() {
    let doc = parse(DocumentKind::Html, PAGE.as_bytes()).unwrap();
    assert_eq!(doc.kind, DocumentKind::Html);
    for hidden in [
        "never indexed",
        "color: red",
        "Enable JavaScript",
        "template text",
        "secret",
    ] {
        assert!(
            !doc.text.contains(hidden),
            "{hidden} leaked into {:?}",
            doc.text
        );
    }
    assert!(
        doc.text
            .starts_with("Release guide\n\nRead the rollback section first, then the vendor docs.")
    );
    assert!(
        doc.text
            .contains("1. Tag the build\n2. Deploy canary\n  - watch errors")
    );
    assert!(doc.text.contains("Env | Owner\nprod | Ada"));
    assert!(doc.text.contains("  indented code\n    more"));
    assert!(doc.text.ends_with("Line one\nline two é"));

    let titles: Vec<(u8, &str)> = doc
        .headings
        .iter()
        .map(|h| (h.level, h.title.as_str()))
        .collect();
    assert_eq!(
        titles,
        vec![
            (1, "Release guide"),
            (2, "Steps"),
            (3, "Matrix"),
            (2, "Notes")
        ]
    );
    for h in &doc.headings {
        assert_eq!(&doc.text[h.byte_start..h.byte_end], h.title);
        assert!(
            doc.blocks
                .iter()
                .any(|b| b.byte_start == h.byte_start && b.kind == BlockKind::Heading)
        );
    }
    let kinds: Vec<BlockKind> = doc.blocks.iter().map(|b| b.kind).collect();
    assert!(kinds.contains(&BlockKind::List));
    assert!(kinds.contains(&BlockKind::Table));
    assert!(kinds.contains(&BlockKind::CodeBlock));

    assert_eq!(doc.links.len(), 2);
    assert_eq!(doc.links[0].target, "../ops/runbook.md#rollback");
    assert_eq!(doc.links[0].text, "rollback section");
    assert!(doc.text[doc.links[0].byte_start..].starts_with("rollback section"));
    assert!(doc.text[doc.links[1].byte_start..].starts_with("vendor docs"));
    assert_eq!(doc.links[1].ordinal, 1);

    assert_eq!(doc.title.as_deref(), Some("Release Guide"));
    assert_eq!(doc.meta.tags, vec!["ops", "release"]);
    assert_eq!(doc.meta.document_date.as_deref(), Some("2024-05-01"));
    assert_eq!(doc.meta.collections, vec!["handbook"]);
    assert_eq!(doc.meta.effective_to, None);
    assert_eq!(doc.meta.warnings.len(), 1, "{:?}", doc.meta.warnings);

    let spans = chunk(
        &doc,
        &ChunkOptions {
            target_tokens: 20,
            max_tokens: 40,
            overlap_tokens: 0,
        },
    );
    assert!(spans.len() >= 4);
    check_offsets(&doc, &spans);
    assert!(spans.iter().all(|s| s.page_start.is_none()));
    let matrix = spans
        .iter()
        .find(|s| s.text.contains("prod | Ada"))
        .unwrap();
    assert_eq!(
        matrix.heading_path,
        vec!["Release guide", "Steps", "Matrix"]
    );
    let sections = outline(&doc);
    assert_eq!(sections[2].parent, Some(1));
    assert_eq!(sections[3].parent, Some(0));
}

#[test]
fn html_is_detected_by_type_or_name() {
    assert_eq!(
        DocumentKind::detect("a/b.html", ""),
        Some(DocumentKind::Html)
    );
    assert_eq!(
        DocumentKind::detect("a/b.htm", "text/plain"),
        Some(DocumentKind::Html)
    );
    assert_eq!(
        DocumentKind::detect("page", "text/html; charset=utf-8"),
        Some(DocumentKind::Html)
    );
    assert_eq!(
        DocumentKind::detect("r.pdf", "application/pdf"),
        Some(DocumentKind::Pdf)
    );
    assert_eq!(
        DocumentKind::detect("r.pdf", "application/octet-stream"),
        Some(DocumentKind::Pdf)
    );
    assert_eq!(DocumentKind::detect("r.pdf", "image/png"), None);
}

#[test]
fn html_without_title_uses_first_h1_and_survives_junk() {
    let doc = parse(
        DocumentKind::Html,
        b"<div><h1>Only <i>heading</i></h1>text<p></p><p>  </p></div>",
    )
    .unwrap();
    assert_eq!(doc.title.as_deref(), Some("Only heading"));
    assert_eq!(doc.text, "Only heading\n\ntext");
    let deep = "<div>".repeat(5000) + "deep" + &"</div>".repeat(5000);
    let doc = parse(DocumentKind::Html, deep.as_bytes()).unwrap();
    assert_eq!(doc.text, "deep");
}

// ---------- PDF ----------

struct PdfPage<'a> {
    /// Paragraphs of lines.
    paragraphs: &'a [&'a [&'a str]],
}

/// A real PDF: Helvetica text, one content stream per page, optional bookmarks
/// (level, title, 1-based page) and Info entries.
fn build_pdf(
    pages: &[PdfPage<'_>],
    bookmarks: &[(u8, &str, usize)],
    info: Option<Dictionary>,
) -> Document {
    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let font_id = doc.add_object(dictionary! {
        "Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Helvetica",
    });
    let resources_id = doc.add_object(dictionary! { "Font" => dictionary! { "F1" => font_id } });
    let mut page_ids = Vec::new();
    for page in pages {
        let mut ops = vec![
            Operation::new("BT", vec![]),
            Operation::new("Tf", vec!["F1".into(), 12.into()]),
            Operation::new("Td", vec![72.into(), 760.into()]),
        ];
        for (p, para) in page.paragraphs.iter().enumerate() {
            for (l, line) in para.iter().enumerate() {
                if p > 0 || l > 0 {
                    // 14pt inside a paragraph, 30pt between paragraphs.
                    let dy = if l == 0 { -30 } else { -14 };
                    ops.push(Operation::new("Td", vec![0.into(), dy.into()]));
                }
                ops.push(Operation::new("Tj", vec![Object::string_literal(*line)]));
            }
        }
        ops.push(Operation::new("ET", vec![]));
        let content = Content { operations: ops };
        let content_id = doc.add_object(Stream::new(dictionary! {}, content.encode().unwrap()));
        let page_id = doc.add_object(dictionary! {
            "Type" => "Page", "Parent" => pages_id, "Contents" => content_id,
        });
        page_ids.push(page_id);
    }
    let kids: Vec<Object> = page_ids.iter().map(|&id| id.into()).collect();
    let count = i64::try_from(kids.len()).unwrap();
    doc.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! {
            "Type" => "Pages", "Kids" => kids, "Count" => count,
            "Resources" => resources_id,
            "MediaBox" => vec![0.into(), 0.into(), 612.into(), 792.into()],
        }),
    );
    let mut parents: Vec<u32> = Vec::new();
    for &(level, title, page) in bookmarks {
        parents.truncate(usize::from(level) - 1);
        let id = doc.add_bookmark(
            Bookmark::new(title.to_owned(), [0.0, 0.0, 0.0], 0, page_ids[page - 1]),
            parents.last().copied(),
        );
        parents.push(id);
    }
    let mut catalog = dictionary! { "Type" => "Catalog", "Pages" => pages_id };
    if let Some(outline_id) = doc.build_outline() {
        catalog.set("Outlines", outline_id);
    }
    let catalog_id = doc.add_object(catalog);
    doc.trailer.set("Root", catalog_id);
    if let Some(info) = info {
        let info_id = doc.add_object(info);
        doc.trailer.set("Info", info_id);
    }
    doc
}

fn save(mut doc: Document) -> Vec<u8> {
    let mut out = Vec::new();
    doc.save_to(&mut out).unwrap();
    out
}

const REPORT: &[PdfPage<'static>] = &[
    PdfPage {
        paragraphs: &[
            &["Annual Report"],
            &[
                "This report covers the year.",
                "It has three pages of text.",
            ],
        ],
    },
    PdfPage {
        paragraphs: &[
            &["1 Finance"],
            &["Revenue grew by ten percent.", "Costs stayed flat."],
            &["1.1 Cash Flow"],
            &["Cash flow was positive all year."],
        ],
    },
    PdfPage {
        paragraphs: &[
            &["2 Outlook"],
            &["Next year we expect growth.", "Risks are listed below."],
        ],
    },
];

#[test]
fn pdf_with_bookmarks_gives_pages_and_nested_outline() {
    let info = dictionary! {
        "Title" => Object::string_literal("Annual Report 2024"),
        "Keywords" => Object::string_literal("finance; annual"),
        "CreationDate" => Object::string_literal("D:20240115093000+01'00'"),
        "Collections" => Object::string_literal("reports"),
    };
    let bytes = save(build_pdf(
        REPORT,
        &[(1, "Finance", 2), (2, "Cash Flow", 2), (1, "Outlook", 3)],
        Some(info),
    ));
    let doc = parse(DocumentKind::Pdf, &bytes).unwrap();
    assert_eq!(doc.pages.len(), 3);
    for (i, page) in doc.pages.iter().enumerate() {
        assert_eq!(page.number as usize, i + 1);
    }
    let page2 = &doc.text[doc.pages[1].byte_start..doc.pages[1].byte_end];
    assert!(page2.contains("Revenue grew by ten percent."), "{page2:?}");
    assert!(!page2.contains("Next year"));

    let sections = outline(&doc);
    type Row<'a> = (&'a str, u8, Option<usize>, Option<u32>, Option<u32>);
    let got: Vec<Row<'_>> = sections
        .iter()
        .map(|s| {
            (
                s.title.as_str(),
                s.depth,
                s.parent,
                s.page_start,
                s.page_end,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("Finance", 1, None, Some(2), Some(2)),
            ("Cash Flow", 2, Some(0), Some(2), Some(2)),
            ("Outlook", 1, None, Some(3), Some(3)),
        ]
    );
    // Bookmarks land on the lines that carry their titles.
    assert_eq!(&doc.text[sections[0].byte_start..][..9], "1 Finance");
    assert_eq!(&doc.text[sections[1].byte_start..][..13], "1.1 Cash Flow");

    let spans = chunk(
        &doc,
        &ChunkOptions {
            target_tokens: 12,
            max_tokens: 30,
            overlap_tokens: 0,
        },
    );
    check_offsets(&doc, &spans);
    let first = &spans[0];
    assert_eq!((first.page_start, first.page_end), (Some(1), Some(1)));
    let cash = spans
        .iter()
        .find(|s| s.text.contains("Cash flow was positive"))
        .unwrap();
    assert_eq!((cash.page_start, cash.page_end), (Some(2), Some(2)));
    assert_eq!(cash.heading_path, vec!["Finance", "Cash Flow"]);
    let outlook = spans.iter().find(|s| s.text.contains("Next year")).unwrap();
    assert_eq!(outlook.page_start, Some(3));
    // A chunk packed across a page break (no heading between) reports both pages.
    let plain = parse(
        DocumentKind::Pdf,
        &save(build_pdf(
            &[
                PdfPage {
                    paragraphs: &[&["the first page ends here."]],
                },
                PdfPage {
                    paragraphs: &[&["the second page goes on."]],
                },
            ],
            &[],
            None,
        )),
    )
    .unwrap();
    let wide = chunk(&plain, &ChunkOptions::default());
    assert_eq!(wide.len(), 1);
    assert_eq!((wide[0].page_start, wide[0].page_end), (Some(1), Some(2)));
    check_offsets(&plain, &wide);

    assert_eq!(doc.title.as_deref(), Some("Annual Report 2024"));
    assert_eq!(doc.meta.tags, vec!["finance", "annual"]);
    assert_eq!(doc.meta.document_date.as_deref(), Some("2024-01-15"));
    assert_eq!(doc.meta.collections, vec!["reports"]);
}

#[test]
fn pdf_without_bookmarks_takes_heading_like_lines() {
    let bytes = save(build_pdf(REPORT, &[], None));
    let doc = parse(DocumentKind::Pdf, &bytes).unwrap();
    let sections = outline(&doc);
    let got: Vec<(&str, u8, Option<u32>)> = sections
        .iter()
        .map(|s| (s.title.as_str(), s.depth, s.page_start))
        .collect();
    assert_eq!(
        got,
        vec![
            ("Annual Report", 1, Some(1)),
            ("1 Finance", 1, Some(2)),
            ("1.1 Cash Flow", 2, Some(2)),
            ("2 Outlook", 1, Some(3)),
        ]
    );
    assert_eq!(sections[0].page_end, Some(1));
    assert_eq!(sections[1].page_end, Some(2));
    // No Info title: the first heading names the document.
    assert_eq!(doc.title.as_deref(), Some("Annual Report"));
    let spans = chunk(&doc, &ChunkOptions::default());
    check_offsets(&doc, &spans);
}

#[test]
fn unreadable_pdfs_fail_with_an_actionable_reason() {
    // Image-only: pages without any text operators.
    let scanned = save(build_pdf(
        &[PdfPage { paragraphs: &[] }, PdfPage { paragraphs: &[] }],
        &[],
        None,
    ));
    let err = parse(DocumentKind::Pdf, &scanned).unwrap_err();
    assert!(err.reason().contains("OCR"), "{}", err.reason());

    let err = parse(
        DocumentKind::Pdf,
        b"%PDF-1.5\n1 0 obj << /Type /Catalog >> garbage",
    )
    .unwrap_err();
    assert!(err.reason().contains("damaged"), "{}", err.reason());

    let err = parse(DocumentKind::Pdf, b"hello, not a pdf").unwrap_err();
    assert!(err.reason().contains("not a PDF"), "{}", err.reason());

    let mut doc = build_pdf(REPORT, &[], None);
    doc.trailer.set(
        "ID",
        Object::Array(vec![
            Object::string_literal("0123456789abcdef"),
            Object::string_literal("0123456789abcdef"),
        ]),
    );
    let version = lopdf::EncryptionVersion::V2 {
        document: &doc,
        owner_password: "owner",
        user_password: "user-secret",
        key_length: 128,
        permissions: lopdf::Permissions::all(),
    };
    let state = lopdf::EncryptionState::try_from(version).unwrap();
    doc.encrypt(&state).unwrap();
    let err = parse(DocumentKind::Pdf, &save(doc)).unwrap_err();
    assert!(err.reason().contains("encrypted"), "{}", err.reason());
}

// ---------- metadata ----------

#[test]
fn dates_normalise_or_are_refused() {
    for (raw, want) in [
        ("2024-05-01", Some("2024-05-01")),
        ("2024-5-1", Some("2024-05-01")),
        ("2024/05/01", Some("2024-05-01")),
        ("2024.05.01", Some("2024-05-01")),
        ("2024-05-01T23:59:59+02:00", Some("2024-05-01")),
        ("20240501", Some("2024-05-01")),
        ("D:20240229120000Z", Some("2024-02-29")),
        ("1 May 2024", Some("2024-05-01")),
        ("May 1, 2024", Some("2024-05-01")),
        ("'2024-12-31'", Some("2024-12-31")),
        ("2023-02-29", None),
        ("2024-13-01", None),
        ("2024-05", None),
        ("soon", None),
        ("", None),
    ] {
        assert_eq!(normalize_date(raw).as_deref(), want, "{raw}");
    }
}

#[test]
fn markdown_front_matter_fills_meta_and_bad_dates_only_warn() {
    let src = "---\ntitle: Policy\ntype: policy\ntags: [hr, leave]\ndate: 2024/03/01\neffective_from: 1 April 2024\neffectiveTo: someday\ncollections:\n  - handbook\n  - hr\n---\n# Heading\n\nBody.\n";
    let doc = parse(DocumentKind::Markdown, src.as_bytes()).unwrap();
    let m = &doc.meta;
    assert_eq!(m.title.as_deref(), Some("Policy"));
    assert_eq!(m.doc_type.as_deref(), Some("policy"));
    assert_eq!(m.tags, vec!["hr", "leave"]);
    assert_eq!(m.document_date.as_deref(), Some("2024-03-01"));
    assert_eq!(m.effective_from.as_deref(), Some("2024-04-01"));
    assert_eq!(m.effective_to, None);
    assert_eq!(m.collections, vec!["handbook", "hr"]);
    assert_eq!(m.warnings.len(), 1);
    assert!(m.warnings[0].contains("someday"));
    // Without front matter the first H1 is the title.
    let doc = parse(DocumentKind::Markdown, b"# First\n\ntext\n").unwrap();
    assert_eq!(doc.meta.title.as_deref(), Some("First"));
    assert_eq!(
        doc.meta,
        DocumentMeta {
            title: Some("First".into()),
            ..DocumentMeta::default()
        }
    );
}

// ---------- links ----------

fn link(target: &str, kind: LinkKind) -> Link {
    Link {
        ordinal: 0,
        kind,
        target: target.into(),
        text: "t".into(),
        byte_start: 0,
    }
}

#[test]
fn links_resolve_against_the_source_path() {
    let cases: &[(&str, LinkKind, LinkTargetKind, &str, Option<&str>)] = &[
        (
            "setup.md",
            LinkKind::Link,
            LinkTargetKind::Internal,
            "guides/setup.md",
            None,
        ),
        (
            "./setup.md#install",
            LinkKind::Link,
            LinkTargetKind::Internal,
            "guides/setup.md",
            Some("install"),
        ),
        (
            "../ops/run%20book.md?plain=1",
            LinkKind::Link,
            LinkTargetKind::Internal,
            "ops/run book.md",
            None,
        ),
        (
            "/README.md",
            LinkKind::Link,
            LinkTargetKind::Internal,
            "README.md",
            None,
        ),
        (
            "sub/../other",
            LinkKind::Link,
            LinkTargetKind::Internal,
            "guides/other",
            None,
        ),
        (
            "Team Page",
            LinkKind::WikiLink,
            LinkTargetKind::Internal,
            "guides/Team Page",
            None,
        ),
        (
            "#faq",
            LinkKind::Link,
            LinkTargetKind::Internal,
            "guides/intro.md",
            Some("faq"),
        ),
        (
            "img/a.png",
            LinkKind::Image,
            LinkTargetKind::Internal,
            "guides/img/a.png",
            None,
        ),
        (
            "../../../etc/passwd",
            LinkKind::Link,
            LinkTargetKind::Invalid,
            "",
            None,
        ),
        ("", LinkKind::Link, LinkTargetKind::Invalid, "", None),
        (
            "javascript:alert(1)",
            LinkKind::Link,
            LinkTargetKind::Invalid,
            "",
            None,
        ),
        (
            "https://example.com/a#b",
            LinkKind::Link,
            LinkTargetKind::External,
            "https://example.com/a#b",
            None,
        ),
        (
            "mailto:ops@example.com",
            LinkKind::Link,
            LinkTargetKind::External,
            "mailto:ops@example.com",
            None,
        ),
        (
            "//cdn.example.com/x.js",
            LinkKind::Link,
            LinkTargetKind::External,
            "//cdn.example.com/x.js",
            None,
        ),
    ];
    for &(target, syntax, kind, path, fragment) in cases {
        let r = resolve_link("guides/intro.md", &link(target, syntax));
        assert_eq!(
            (r.kind, r.target_path.as_str(), r.fragment.as_deref()),
            (kind, path, fragment),
            "{target}"
        );
        assert_eq!(r.raw_target, target);
        assert_eq!(r.syntax, syntax);
    }
}

#[test]
fn markdown_links_keep_order_through_resolution() {
    let src = "See [setup](setup.md), [[Glossary]], ![diagram](img/d.png) and [site](https://kg.example).\n";
    let doc = parse(DocumentKind::Markdown, src.as_bytes()).unwrap();
    let resolved = resolve_links("docs/index.md", &doc.links);
    let got: Vec<(u32, LinkTargetKind, &str, &str)> = resolved
        .iter()
        .map(|l| (l.ordinal, l.kind, l.target_path.as_str(), l.label.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, LinkTargetKind::Internal, "docs/setup.md", "setup"),
            (1, LinkTargetKind::Internal, "docs/Glossary", "Glossary"),
            (2, LinkTargetKind::Internal, "docs/img/d.png", "diagram"),
            (3, LinkTargetKind::External, "https://kg.example", "site"),
        ]
    );
    let (meta, links) = indexed_event_fields("docs/index.md", &doc.meta, &resolved);
    assert_eq!(meta.source_path, "docs/index.md");
    assert_eq!(links.len(), 4);
    assert_eq!(
        links[1].syntax,
        kg_proto::v1::VersionLinkSyntax::Wiki as i32
    );
}
