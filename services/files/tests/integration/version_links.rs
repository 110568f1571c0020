//! Per-version metadata and links: the indexer pipeline over `examples/` produces the
//! `FileIndexed` events, the files service stores them in a real SQLite registry, and the
//! link graph's targets are resolved against the live files at read time.
use std::collections::HashMap;
use std::path::Path;

use kg_common::caller::now_ms;
use kg_files::{
    FilesService, LinkKind, LinkResolution, LinkSyntax, LivePaths, VersionLinkRecord, VersionLinks,
};
use kg_indexer::document::{ChunkOptions, indexed_event_fields};
use kg_indexer::pipeline::{FileMeta, index_document};
use kg_proto::v1::{FileIndexed, FileInfo, FileStatus};

use crate::common::{Env, env_with, writer};

const NS: &str = "links";

async fn env() -> Env {
    env_with(false, 64 << 20).await
}

/// Uploads `content` at `path`, runs the indexer pipeline on it and applies the event it
/// would publish. Returns the file and whether it indexed.
async fn upload_and_index(files: &FilesService, path: &str, content: &[u8]) -> (FileInfo, bool) {
    let file = files
        .upload(&writer(NS), NS, path, content, "")
        .await
        .unwrap()
        .file
        .unwrap();
    let meta = FileMeta {
        namespace: NS.into(),
        file_id: file.file_id.clone(),
        version_id: file.version_id.clone(),
        path: file.path.clone(),
        mime: file.mime.clone(),
        enabled: true,
        hidden: false,
    };
    let event = match index_document(&meta, content, &ChunkOptions::default()) {
        Ok(doc) => {
            let (version_meta, links) = indexed_event_fields(&doc.file.path, &doc.meta, &doc.links);
            FileIndexed {
                namespace: NS.into(),
                file_id: file.file_id.clone(),
                version_id: file.version_id.clone(),
                status: FileStatus::Indexed as i32,
                chunk_count: i64::try_from(doc.chunks.len()).unwrap(),
                indexed_at_ms: now_ms(),
                meta: Some(version_meta),
                links,
                ..Default::default()
            }
        }
        Err(err) => FileIndexed {
            namespace: NS.into(),
            file_id: file.file_id.clone(),
            version_id: file.version_id.clone(),
            status: FileStatus::Failed as i32,
            reason: err.to_string(),
            indexed_at_ms: now_ms(),
            ..Default::default()
        },
    };
    let indexed = event.status == FileStatus::Indexed as i32;
    assert!(files.apply_indexed(&event).await.unwrap());
    (file, indexed)
}

fn examples() -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut out: Vec<(String, Vec<u8>)> = walkdir::WalkDir::new(&root)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(&root).unwrap();
            (
                rel.to_string_lossy().replace('\\', "/"),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

fn by_path(data: &[VersionLinks]) -> HashMap<&str, &VersionLinks> {
    data.iter()
        .map(|v| (v.meta.source_path.as_str(), v))
        .collect()
}

/// (ordinal, resolution) of each link of `source`.
fn resolved(live: &LivePaths, v: &VersionLinks) -> Vec<(u32, LinkResolution)> {
    v.links
        .iter()
        .map(|l| (l.ordinal, live.resolve(l)))
        .collect()
}

#[tokio::test]
async fn examples_link_graph_is_stored_per_version_and_resolved_at_read_time() {
    let env = env().await;
    let mut versions = Vec::new();
    let mut live_paths = Vec::new();
    for (path, content) in examples() {
        let (file, indexed) = upload_and_index(&env.files, &path, &content).await;
        versions.push(file.version_id.clone());
        live_paths.push(file.path.clone());
        if path.ends_with(".md") {
            assert!(indexed, "{path} should index");
        }
    }
    let data = env.files.version_links(&versions).await.unwrap();
    // Every indexed file has metadata; failed ones (formats the indexer skips) have none.
    assert!(data.len() >= 10, "{}", data.len());
    let by = by_path(&data);
    let live = LivePaths::new(live_paths.clone());

    // onboarding.md, written down by hand: ordered, relative paths resolved, fragments split.
    let onboarding = by["handbook/onboarding.md"];
    let file = |p: &str| LinkResolution::File(p.to_owned());
    let got = resolved(&live, onboarding);
    assert_eq!(
        got,
        vec![
            (0, file("handbook/security/access-policy.md")),
            (1, file("handbook/security/access-policy.md")),
            (2, file("handbook/offices.md")),
            (3, file("support/faq.md")),
            (4, file("engineering/architecture.md")),
            (5, file("handbook/glossary.md")),
            (6, file("support/faq.md")),
            (7, file("engineering/deploy-runbook.md")),
            (
                8,
                LinkResolution::External("https://commonmark.org/help/".into())
            ),
            (9, LinkResolution::External("https://12factor.net/".into())),
        ]
    );
    assert_eq!(
        onboarding.links[1].fragment.as_deref(),
        Some("requesting-access")
    );
    assert_eq!(
        onboarding.links[1].raw_target,
        "security/access-policy.md#requesting-access"
    );
    assert_eq!(onboarding.links[0].label, "access policy");
    assert_eq!(onboarding.links[0].syntax, LinkSyntax::Link);

    // incident-response links a template nobody uploaded: broken now...
    let incident = by["handbook/security/incident-response.md"];
    let template = incident
        .links
        .iter()
        .find(|l| l.raw_target == "../templates/postmortem.md")
        .unwrap();
    assert_eq!(template.kind, LinkKind::Internal);
    assert_eq!(template.target_path, "handbook/templates/postmortem.md");
    assert_eq!(live.resolve(template), LinkResolution::Broken);
    let rollback = incident
        .links
        .iter()
        .find(|l| l.raw_target.ends_with("#rolling-back"))
        .unwrap();
    assert_eq!(
        live.resolve(rollback),
        file("engineering/deploy-runbook.md")
    );

    // ...and an edge once the target exists, with no re-index of the linking version.
    let (template_file, _) = upload_and_index(
        &env.files,
        "handbook/templates/postmortem.md",
        b"# Postmortem\n\nWhat happened.\n",
    )
    .await;
    let mut with_template = live_paths.clone();
    with_template.push(template_file.path.clone());
    let live2 = LivePaths::new(with_template);
    let again = env
        .files
        .version_links(std::slice::from_ref(&incident.meta.version_id))
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    let template2 = again[0]
        .links
        .iter()
        .find(|l| l.ordinal == template.ordinal)
        .unwrap();
    assert_eq!(
        live2.resolve(template2),
        file("handbook/templates/postmortem.md")
    );

    // Links come back in ordinal order for every version.
    for v in &data {
        let ordinals: Vec<u32> = v.links.iter().map(|l| l.ordinal).collect();
        let mut sorted = ordinals.clone();
        sorted.sort_unstable();
        assert_eq!(ordinals, sorted, "{}", v.meta.source_path);
    }
    // Unknown versions are left out; asked order is kept; duplicates collapse.
    let ask = vec![
        by["support/faq.md"].meta.version_id.clone(),
        "no-such-version".to_owned(),
        onboarding.meta.version_id.clone(),
        by["support/faq.md"].meta.version_id.clone(),
    ];
    let got: Vec<String> = env
        .files
        .version_links(&ask)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.meta.source_path)
        .collect();
    assert_eq!(got, vec!["support/faq.md", "handbook/onboarding.md"]);
}

#[tokio::test]
async fn metadata_is_stored_per_version_and_a_new_version_gets_its_own() {
    let env = env().await;
    let v1 = "---\ntitle: Leave policy\ntype: policy\ntags: [hr, leave]\ndate: 2024-03-01\neffective_from: 2024-04-01\neffective_to: nonsense\ncollections: [handbook]\n---\n# Leave\n\nSee [[Holidays]] and [the form](forms/leave%20form.md).\n";
    let (f1, indexed) = upload_and_index(&env.files, "hr/leave.md", v1.as_bytes()).await;
    assert!(indexed);
    let v2 = "# Leave (draft)\n\nNo links any more.\n";
    let (f2, _) = upload_and_index(&env.files, "hr/leave.md", v2.as_bytes()).await;
    assert_eq!(f1.file_id, f2.file_id);
    assert_ne!(f1.version_id, f2.version_id);

    let data = env
        .files
        .version_links(&[f1.version_id.clone(), f2.version_id.clone()])
        .await
        .unwrap();
    assert_eq!(data.len(), 2);
    let old = &data[0].meta;
    assert_eq!(old.title.as_deref(), Some("Leave policy"));
    assert_eq!(old.doc_type.as_deref(), Some("policy"));
    assert_eq!(old.tags, vec!["hr", "leave"]);
    assert_eq!(old.document_date.as_deref(), Some("2024-03-01"));
    assert_eq!(old.effective_from.as_deref(), Some("2024-04-01"));
    assert_eq!(old.effective_to, None);
    assert_eq!(old.collections, vec!["handbook"]);
    assert_eq!(old.file_id, f1.file_id);
    assert_eq!(
        data[0].links,
        vec![
            VersionLinkRecord {
                ordinal: 0,
                kind: LinkKind::Internal,
                syntax: LinkSyntax::Wiki,
                target_path: "hr/Holidays".into(),
                raw_target: "Holidays".into(),
                fragment: None,
                label: "Holidays".into(),
            },
            VersionLinkRecord {
                ordinal: 1,
                kind: LinkKind::Internal,
                syntax: LinkSyntax::Link,
                target_path: "hr/forms/leave form.md".into(),
                raw_target: "forms/leave%20form.md".into(),
                fragment: None,
                label: "the form".into(),
            },
        ]
    );
    let new = &data[1];
    assert_eq!(new.meta.title.as_deref(), Some("Leave (draft)"));
    assert!(new.meta.tags.is_empty());
    assert!(new.links.is_empty());

    // A redelivered event replaces the version's rows instead of duplicating them.
    let (_, _) = upload_and_index(&env.files, "hr/leave.md", v1.as_bytes()).await;
    let again = env
        .files
        .version_links(std::slice::from_ref(&f1.version_id))
        .await
        .unwrap();
    assert_eq!(again[0].links.len(), 2);

    // An HTML page and a failed file: metadata from <title>/<meta>, nothing for the failure.
    let html = br#"<html><head><title>Ops portal</title><meta name="keywords" content="ops,portal"><meta name="type" content="portal"></head><body><a href="../hr/leave.md">leave</a><a href="mailto:ops@example.com">mail</a></body></html>"#;
    let (page, indexed) = upload_and_index(&env.files, "ops/index.html", html).await;
    assert!(indexed);
    let (bad, indexed) = upload_and_index(&env.files, "ops/broken.pdf", b"not a pdf").await;
    assert!(!indexed);
    let data = env
        .files
        .version_links(&[page.version_id.clone(), bad.version_id.clone()])
        .await
        .unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0].meta.title.as_deref(), Some("Ops portal"));
    assert_eq!(data[0].meta.doc_type.as_deref(), Some("portal"));
    assert_eq!(data[0].meta.tags, vec!["ops", "portal"]);
    let live = LivePaths::new(["hr/leave.md".to_owned(), "ops/index.html".to_owned()]);
    let got: Vec<LinkResolution> = data[0].links.iter().map(|l| live.resolve(l)).collect();
    assert_eq!(
        got,
        vec![
            LinkResolution::File("hr/leave.md".into()),
            LinkResolution::External("mailto:ops@example.com".into()),
        ]
    );
}
