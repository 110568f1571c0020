//! get_knowledge_graph and versions (branches, releases, environments) against
//! a real registry (SQLite, and PostgreSQL for the SQL of every target kind),
//! a real blob directory and a real NATS. The link set is written by hand and
//! fed through the indexer's `FileIndexed` path; every expected edge, broken
//! link and count below is written down by hand too.
use std::collections::{BTreeSet, HashMap};

use kg_common::caller::now_ms;

use crate::common::env;
use kg_common::{ErrorCode, ErrorExt as _};
use kg_files::{FilesError, FilesService};
use kg_proto::v1::{
    AccessFilter, CallerContext, CallerSelector, EnvironmentTarget, FileIndexed, FileInfo,
    FileStatus, GetKnowledgeGraphRequest, GetKnowledgeGraphResponse, GraphFilters, LookupTarget,
    Permission, PreviewBranchTarget, ReleaseTarget, SelectorList, SelectorMap, VersionLink,
    VersionLinkKind, VersionLinkSyntax, VersionMeta, caller_selector, environment_target,
    lookup_target, release_target,
};

const NS: &str = "kg";

fn caller(filter: AccessFilter) -> CallerContext {
    let now = now_ms();
    CallerContext {
        principal_id: "tester".into(),
        access: vec![AccessFilter {
            namespace: NS.into(),
            ..filter
        }],
        issued_at_ms: now,
        expires_at_ms: now + 3_600_000,
        ..Default::default()
    }
}

fn admin() -> CallerContext {
    let mut c = caller(AccessFilter {
        allow_prefixes: vec![String::new()],
        permission: Permission::Admin as i32,
        write_prefixes: vec![String::new()],
        admin_prefixes: vec![String::new()],
        enabled_only: true,
        ..Default::default()
    });
    c.is_admin = true;
    c
}

/// Reads everything but `private/` (folder grant + deny), as auth mints it.
fn reader() -> CallerContext {
    caller(AccessFilter {
        allow_prefixes: vec![String::new()],
        deny_prefixes: vec!["private/".into()],
        permission: Permission::Read as i32,
        enabled_only: true,
        visible_only: true,
        ..Default::default()
    })
}

fn writer() -> CallerContext {
    caller(AccessFilter {
        allow_prefixes: vec![String::new()],
        write_prefixes: vec![String::new()],
        permission: Permission::Write as i32,
        enabled_only: true,
        ..Default::default()
    })
}

/// (kind, target as written). Internal targets are already resolved paths,
/// as the indexer reports them.
type Link = (VersionLinkKind, &'static str);
const INT: VersionLinkKind = VersionLinkKind::Internal;
const EXT: VersionLinkKind = VersionLinkKind::External;

async fn index(
    files: &FilesService,
    file: &FileInfo,
    title: &str,
    doc_type: &str,
    tags: &[&str],
    links: &[Link],
) {
    let event = FileIndexed {
        namespace: NS.into(),
        file_id: file.file_id.clone(),
        version_id: file.version_id.clone(),
        status: FileStatus::Indexed as i32,
        chunk_count: 1,
        indexed_at_ms: now_ms(),
        meta: Some(VersionMeta {
            source_path: file.path.clone(),
            title: title.into(),
            doc_type: doc_type.into(),
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            ..Default::default()
        }),
        links: links
            .iter()
            .enumerate()
            .map(|(i, (kind, target))| VersionLink {
                ordinal: u32::try_from(i).unwrap(),
                kind: *kind as i32,
                syntax: VersionLinkSyntax::Link as i32,
                target_path: (*target).into(),
                raw_target: (*target).into(),
                fragment: String::new(),
                label: format!("link {i}"),
            })
            .collect(),
        ..Default::default()
    };
    files.apply_indexed(&event).await.unwrap();
}

async fn put(files: &FilesService, path: &str, body: &str) -> FileInfo {
    files
        .upload(&admin(), NS, path, body.as_bytes(), "")
        .await
        .unwrap()
        .file
        .unwrap()
}

/// (path, title, type, tags, links) of one hand-written document.
type Doc = (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [Link],
);

/// The hand-written corpus. Returns path -> version id.
async fn corpus(files: &FilesService) -> HashMap<String, String> {
    let mut ids = HashMap::new();
    let docs: [Doc; 8] = [
        (
            "a.md",
            "Alpha",
            "guide",
            &["core", "intro"],
            &[
                (INT, "b.md"),
                (EXT, "https://example.com/x"),
                (INT, "missing.md"),
                (INT, "private/secret.md"),
                (INT, "private/nothere.md"),
                (INT, "c"),
            ],
        ),
        (
            "b.md",
            "Beta",
            "guide",
            &["core"],
            &[(INT, "c.md"), (INT, "a.md")],
        ),
        ("c.md", "Gamma", "reference", &[], &[(INT, "d/")]),
        ("d/index.md", "Delta", "reference", &[], &[(INT, "e.md")]),
        ("e.md", "Epsilon", "note", &["leaf"], &[]),
        (
            "private/secret.md",
            "Secret plan",
            "note",
            &["secret"],
            &[(INT, "a.md")],
        ),
        ("_index.md", "Index", "", &[], &[]),
        ("hidden.md", "Hidden", "note", &[], &[(INT, "a.md")]),
    ];
    for (path, title, ty, tags, links) in docs {
        let file = put(files, path, &format!("# {title}\n")).await;
        index(files, &file, title, ty, tags, links).await;
        ids.insert(path.to_owned(), file.version_id);
    }
    let hidden = files
        .get_file(&admin(), NS, Some("hidden.md"), None)
        .await
        .unwrap();
    files
        .set_flags(&admin(), NS, &hidden.file_id, None, Some(true))
        .await
        .unwrap();
    ids
}

fn request() -> GetKnowledgeGraphRequest {
    GetKnowledgeGraphRequest {
        namespace: NS.into(),
        ..Default::default()
    }
}

async fn graph(
    files: &FilesService,
    who: &CallerContext,
    request: GetKnowledgeGraphRequest,
) -> GetKnowledgeGraphResponse {
    files
        .get_knowledge_graph(who, &request)
        .await
        .unwrap_or_else(|e| panic!("{request:?}: {e}"))
}

async fn graph_err(
    files: &FilesService,
    who: &CallerContext,
    request: GetKnowledgeGraphRequest,
) -> FilesError {
    files
        .get_knowledge_graph(who, &request)
        .await
        .expect_err("the call should fail")
}

/// The answer with version ids replaced by paths, for comparing with sets
/// written by hand.
struct Named {
    nodes: Vec<String>,
    edges: BTreeSet<(String, String, u32)>,
    external: BTreeSet<(String, u32, String)>,
    broken: BTreeSet<(String, u32, String)>,
}

fn named(ids: &HashMap<String, String>, g: &GetKnowledgeGraphResponse) -> Named {
    let path = |v: &str| {
        ids.iter()
            .find(|(_, id)| id.as_str() == v)
            .map(|(p, _)| p.clone())
            .unwrap_or_else(|| format!("?{v}"))
    };
    Named {
        nodes: g.nodes.iter().map(|n| n.path.clone()).collect(),
        edges: g
            .edges
            .iter()
            .map(|e| {
                (
                    path(&e.source_file_version_id),
                    path(&e.target_file_version_id),
                    e.ordinal,
                )
            })
            .collect(),
        external: g
            .external_links
            .iter()
            .map(|e| (path(&e.source_file_version_id), e.ordinal, e.url.clone()))
            .collect(),
        broken: g
            .broken_links
            .iter()
            .map(|e| {
                (
                    path(&e.source_file_version_id),
                    e.ordinal,
                    e.target_path.clone(),
                )
            })
            .collect(),
    }
}

fn edges(list: &[(&str, &str, u32)]) -> BTreeSet<(String, String, u32)> {
    list.iter()
        .map(|(s, t, o)| ((*s).to_owned(), (*t).to_owned(), *o))
        .collect()
}

fn triples(list: &[(&str, u32, &str)]) -> BTreeSet<(String, u32, String)> {
    list.iter()
        .map(|(s, o, t)| ((*s).to_owned(), *o, (*t).to_owned()))
        .collect()
}

fn selector(form: caller_selector::Form) -> Option<CallerSelector> {
    Some(CallerSelector { form: Some(form) })
}

/// Every edge of the admin's whole graph, by hand.
fn all_edges() -> BTreeSet<(String, String, u32)> {
    edges(&[
        ("a.md", "b.md", 0),
        ("a.md", "private/secret.md", 3),
        ("a.md", "c.md", 5),
        ("b.md", "c.md", 0),
        ("b.md", "a.md", 1),
        ("c.md", "d/index.md", 0),
        ("d/index.md", "e.md", 0),
        ("private/secret.md", "a.md", 0),
    ])
}

/// Reader edges: everything that touches `private/` is gone.
fn reader_edges() -> BTreeSet<(String, String, u32)> {
    edges(&[
        ("a.md", "b.md", 0),
        ("a.md", "c.md", 5),
        ("b.md", "c.md", 0),
        ("b.md", "a.md", 1),
        ("c.md", "d/index.md", 0),
        ("d/index.md", "e.md", 0),
    ])
}

async fn whole_graph_and_restricted_reader(files: &FilesService, ids: &HashMap<String, String>) {
    let g = graph(files, &admin(), request()).await;
    let n = named(ids, &g);
    assert_eq!(
        n.nodes,
        [
            "_index.md",
            "a.md",
            "b.md",
            "c.md",
            "d/index.md",
            "e.md",
            "private/secret.md"
        ]
    );
    assert_eq!(n.edges, all_edges());
    assert_eq!(n.external, triples(&[("a.md", 1, "https://example.com/x")]));
    assert_eq!(
        n.broken,
        triples(&[("a.md", 2, "missing.md"), ("a.md", 4, "private/nothere.md")])
    );
    assert_eq!((g.returned_nodes, g.total_nodes, g.limit), (7, 7, 100));
    assert!(!g.partial && !g.links_truncated);
    assert_eq!((g.self_cursor.as_str(), g.next_cursor.as_str()), ("", ""));
    let a = g.nodes.iter().find(|n| n.path == "a.md").unwrap();
    assert_eq!(a.title.as_deref(), Some("Alpha"));
    assert_eq!(a.r#type.as_deref(), Some("guide"));
    assert_eq!(a.tags, ["core", "intro"]);
    assert!(!a.reserved);
    let index = g.nodes.iter().find(|n| n.path == "_index.md").unwrap();
    assert!(index.reserved);
    assert_eq!(index.r#type, None, "an empty type is null");

    // The restricted reader: no denied node, edge, broken-link label or count.
    let g = graph(files, &reader(), request()).await;
    let n = named(ids, &g);
    assert_eq!(
        n.nodes,
        ["_index.md", "a.md", "b.md", "c.md", "d/index.md", "e.md"]
    );
    assert_eq!(n.edges, reader_edges());
    assert_eq!(n.broken, triples(&[("a.md", 2, "missing.md")]));
    assert_eq!((g.returned_nodes, g.total_nodes), (6, 6));
    let text = format!("{g:?}");
    assert!(!text.contains("private"), "{text}");
    assert!(!text.contains(&ids["private/secret.md"]), "{text}");
    assert!(!text.contains(&ids["hidden.md"]), "{text}");

    // A file denied by its id reads as missing: the links to it are broken, labelled as the
    // link to `missing.md` is, so the answer is the same whether a file is there or not.
    let c_file = g
        .nodes
        .iter()
        .find(|n| n.path == "c.md")
        .map(|n| n.file_id.clone())
        .unwrap();
    let no_c = caller(AccessFilter {
        allow_prefixes: vec![String::new()],
        deny_prefixes: vec!["private/".into()],
        deny_file_ids: vec![c_file.clone()],
        permission: Permission::Read as i32,
        enabled_only: true,
        visible_only: true,
        ..Default::default()
    });
    let g = graph(files, &no_c, request()).await;
    let n = named(ids, &g);
    assert_eq!(n.nodes, ["_index.md", "a.md", "b.md", "d/index.md", "e.md"]);
    assert_eq!(
        n.edges,
        edges(&[
            ("a.md", "b.md", 0),
            ("b.md", "a.md", 1),
            ("d/index.md", "e.md", 0)
        ])
    );
    assert_eq!(
        n.broken,
        triples(&[
            ("a.md", 2, "missing.md"),
            ("a.md", 5, "c"),
            ("b.md", 0, "c.md")
        ])
    );
    assert_eq!((g.returned_nodes, g.total_nodes), (5, 5));
    let text = format!("{g:?}");
    assert!(
        !text.contains(&c_file) && !text.contains(&ids["c.md"]),
        "{text}"
    );

    // A denied or hidden root is the same answer as a missing one.
    for root in ["private/secret.md", "hidden.md", "nope.md"] {
        let err = graph_err(
            files,
            &reader(),
            GetKnowledgeGraphRequest {
                root_path: root.into(),
                ..request()
            },
        )
        .await;
        assert_eq!(err.code(), ErrorCode::NotFound, "{root}");
    }
    let err = graph_err(
        files,
        &reader(),
        GetKnowledgeGraphRequest {
            root_file_version_id: ids["private/secret.md"].clone(),
            ..request()
        },
    )
    .await;
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert!(!err.to_string().contains("private"));
}

async fn roots_and_depths(files: &FilesService, ids: &HashMap<String, String>) {
    let rooted = |depth: Option<u32>| GetKnowledgeGraphRequest {
        root_path: "a.md".into(),
        max_depth: depth,
        ..request()
    };
    let g = graph(files, &admin(), rooted(Some(0))).await;
    let n = named(ids, &g);
    assert_eq!(n.nodes, ["a.md"]);
    assert!(n.edges.is_empty(), "targets beyond the depth are no edges");
    assert_eq!(n.external.len(), 1);
    assert_eq!(n.broken.len(), 2);

    // BFS order: depth, then path.
    let one = named(ids, &graph(files, &admin(), rooted(Some(1))).await);
    assert_eq!(one.nodes, ["a.md", "b.md", "c.md", "private/secret.md"]);
    assert_eq!(
        one.edges,
        edges(&[
            ("a.md", "b.md", 0),
            ("a.md", "private/secret.md", 3),
            ("a.md", "c.md", 5),
            ("b.md", "c.md", 0),
            ("b.md", "a.md", 1),
            ("private/secret.md", "a.md", 0),
        ])
    );
    let default = named(ids, &graph(files, &admin(), rooted(None)).await);
    assert_eq!(default.nodes, one.nodes, "max_depth defaults to 1");
    let two = named(ids, &graph(files, &admin(), rooted(Some(2))).await);
    assert_eq!(
        two.nodes,
        ["a.md", "b.md", "c.md", "private/secret.md", "d/index.md"]
    );
    let three = named(ids, &graph(files, &admin(), rooted(Some(3))).await);
    assert_eq!(
        three.nodes,
        [
            "a.md",
            "b.md",
            "c.md",
            "private/secret.md",
            "d/index.md",
            "e.md"
        ]
    );
    assert_eq!(
        three.edges,
        all_edges(),
        "depth 3 reaches every file a.md links to"
    );

    // The reader's walk never passes through a denied file.
    let r = named(ids, &graph(files, &reader(), rooted(Some(1))).await);
    assert_eq!(r.nodes, ["a.md", "b.md", "c.md"]);
    // By version id, from a file that only links back.
    let g = graph(
        files,
        &admin(),
        GetKnowledgeGraphRequest {
            root_file_version_id: ids["e.md"].clone(),
            max_depth: Some(3),
            ..request()
        },
    )
    .await;
    assert_eq!(named(ids, &g).nodes, ["e.md"], "links are followed forward");

    for bad in [
        GetKnowledgeGraphRequest {
            max_depth: Some(4),
            ..rooted(None)
        },
        GetKnowledgeGraphRequest {
            max_depth: Some(1),
            ..request()
        },
        GetKnowledgeGraphRequest {
            root_file_version_id: ids["a.md"].clone(),
            ..rooted(None)
        },
        GetKnowledgeGraphRequest {
            root_file_version_id: "not-a-uuid".into(),
            ..request()
        },
    ] {
        let err = graph_err(files, &admin(), bad.clone()).await;
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{bad:?}");
    }
}

async fn filters(files: &FilesService, ids: &HashMap<String, String>) {
    let filtered = |search: &str, ty: &str, tags: &[&str]| GetKnowledgeGraphRequest {
        filters: Some(GraphFilters {
            search: search.into(),
            r#type: ty.into(),
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
        }),
        ..request()
    };
    let cases: [(&str, &str, &[&str], &[&str]); 7] = [
        ("ALP", "", &[], &["a.md"]),
        ("d/", "", &[], &["d/index.md"]),
        ("", "GUIDE", &[], &["a.md", "b.md"]),
        ("", "", &["core"], &["a.md", "b.md"]),
        ("", "", &["CORE", "intro"], &["a.md"]),
        ("secret", "", &[], &["private/secret.md"]),
        ("", "reference", &["core"], &[]),
    ];
    for (search, ty, tags, want) in cases {
        let g = graph(files, &admin(), filtered(search, ty, tags)).await;
        assert_eq!(named(ids, &g).nodes, want, "{search:?} {ty:?} {tags:?}");
        assert_eq!(g.total_nodes, want.len() as u64);
    }
    // Edges only between filtered nodes; a filtered-out target is not broken.
    let g = graph(files, &admin(), filtered("", "guide", &[])).await;
    let n = named(ids, &g);
    assert_eq!(n.edges, edges(&[("a.md", "b.md", 0), ("b.md", "a.md", 1)]));
    assert_eq!(
        n.broken,
        triples(&[("a.md", 2, "missing.md"), ("a.md", 4, "private/nothere.md")])
    );
    // The reader's search for the secret's title finds nothing, counts nothing.
    let g = graph(files, &reader(), filtered("secret", "", &[])).await;
    assert_eq!((g.returned_nodes, g.total_nodes), (0, 0));
    let err = graph_err(files, &admin(), filtered(&"x".repeat(257), "", &[])).await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

async fn paging(files: &FilesService, ids: &HashMap<String, String>) {
    for who in [admin(), reader()] {
        let whole = graph(files, &who, request()).await;
        let mut cursor = String::new();
        let mut nodes = Vec::new();
        let mut all = Vec::new();
        let mut pages = 0;
        loop {
            let g = graph(
                files,
                &who,
                GetKnowledgeGraphRequest {
                    limit: 2,
                    cursor: cursor.clone(),
                    ..request()
                },
            )
            .await;
            pages += 1;
            assert_eq!(g.limit, 2);
            assert_eq!(g.self_cursor, cursor);
            assert_eq!(g.total_nodes, whole.total_nodes);
            assert!(g.returned_nodes <= 2);
            assert_eq!(g.partial, !g.next_cursor.is_empty());
            nodes.extend(g.nodes.iter().map(|n| n.path.clone()));
            all.push(named(ids, &g));
            if g.next_cursor.is_empty() {
                break;
            }
            cursor = g.next_cursor;
        }
        let want: Vec<String> = whole.nodes.iter().map(|n| n.path.clone()).collect();
        assert_eq!(nodes, want, "pages cover the graph once, in order");
        assert_eq!(pages, want.len().div_ceil(2));
        let paged_edges: BTreeSet<_> = all.iter().flat_map(|n| n.edges.clone()).collect();
        assert_eq!(paged_edges, named(ids, &whole).edges);
        let paged_broken: BTreeSet<_> = all.iter().flat_map(|n| n.broken.clone()).collect();
        assert_eq!(paged_broken, named(ids, &whole).broken);
    }
    // Root walk pages too, in BFS order.
    let first = graph(
        files,
        &admin(),
        GetKnowledgeGraphRequest {
            root_path: "a.md".into(),
            max_depth: Some(3),
            limit: 4,
            ..request()
        },
    )
    .await;
    assert_eq!(
        named(ids, &first).nodes,
        ["a.md", "b.md", "c.md", "private/secret.md"]
    );
    let second = graph(
        files,
        &admin(),
        GetKnowledgeGraphRequest {
            root_path: "a.md".into(),
            max_depth: Some(3),
            limit: 4,
            cursor: first.next_cursor.clone(),
            ..request()
        },
    )
    .await;
    assert_eq!(named(ids, &second).nodes, ["d/index.md", "e.md"]);
    assert!(second.next_cursor.is_empty() && !second.partial);

    // A cursor belongs to its query; garbage and limits are refused.
    let err = graph_err(
        files,
        &admin(),
        GetKnowledgeGraphRequest {
            cursor: first.next_cursor.clone(),
            ..request()
        },
    )
    .await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    for bad in [
        GetKnowledgeGraphRequest {
            cursor: "%%%".into(),
            ..request()
        },
        GetKnowledgeGraphRequest {
            limit: 201,
            ..request()
        },
    ] {
        assert_eq!(
            graph_err(files, &admin(), bad).await.code(),
            ErrorCode::InvalidArgument
        );
    }
    let max = graph(
        files,
        &admin(),
        GetKnowledgeGraphRequest {
            limit: 200,
            ..request()
        },
    )
    .await;
    assert_eq!(max.limit, 200);
}

async fn caller_selectors(files: &FilesService, ids: &HashMap<String, String>) {
    use caller_selector::Form;
    let with = |form: Form| GetKnowledgeGraphRequest {
        caller_selector: selector(form),
        ..request()
    };
    let map = |entries: &[(&str, bool)]| {
        Form::Map(SelectorMap {
            entries: entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        })
    };
    let list = |items: &[&str]| {
        Form::AnyOf(SelectorList {
            selectors: items.iter().map(|s| (*s).to_owned()).collect(),
        })
    };

    // boolean
    let g = graph(files, &reader(), with(Form::All(true))).await;
    assert_eq!(named(ids, &g).edges, reader_edges());
    assert_eq!(g.total_nodes, 6);
    let g = graph(files, &reader(), with(Form::All(false))).await;
    assert_eq!((g.returned_nodes, g.total_nodes), (0, 0));
    assert!(g.edges.is_empty() && g.broken_links.is_empty() && g.external_links.is_empty());

    // string: one path; links out of the selection are dropped, not broken.
    let g = graph(files, &reader(), with(Form::Selector("a.md".into()))).await;
    let n = named(ids, &g);
    assert_eq!(n.nodes, ["a.md"]);
    assert!(n.edges.is_empty());
    assert_eq!(n.broken, triples(&[("a.md", 2, "missing.md")]));
    assert_eq!(g.total_nodes, 1);
    // string: a glob (does not cross folders).
    let g = graph(files, &reader(), with(Form::Selector("*.md".into()))).await;
    assert_eq!(
        named(ids, &g).nodes,
        ["_index.md", "a.md", "b.md", "c.md", "e.md"]
    );

    // string[]: a union.
    let g = graph(files, &reader(), with(list(&["a.md", "b.md"]))).await;
    let n = named(ids, &g);
    assert_eq!(n.nodes, ["a.md", "b.md"]);
    assert_eq!(n.edges, edges(&[("a.md", "b.md", 0), ("b.md", "a.md", 1)]));

    // object: exclusions from everything readable.
    let g = graph(files, &reader(), with(map(&[("d/", false)]))).await;
    let n = named(ids, &g);
    assert_eq!(n.nodes, ["_index.md", "a.md", "b.md", "c.md", "e.md"]);
    assert!(
        !n.edges
            .iter()
            .any(|(s, t, _)| s == "d/index.md" || t == "d/index.md")
    );
    assert!(n.broken.iter().all(|(_, _, t)| t != "d/"));
    // object: inclusions minus exclusions.
    let g = graph(
        files,
        &admin(),
        with(map(&[("private/", true), ("a.md", true), ("a.md", true)])),
    )
    .await;
    assert_eq!(named(ids, &g).nodes, ["a.md", "private/secret.md"]);

    // A selector never widens access: the reader selecting the denied folder
    // gets nothing, counts nothing, sees no label.
    for form in [
        Form::Selector("private/".into()),
        list(&["private/secret.md"]),
        map(&[("private/", true)]),
        Form::Selector("private/*".into()),
    ] {
        let g = graph(files, &reader(), with(form.clone())).await;
        assert_eq!((g.returned_nodes, g.total_nodes), (0, 0), "{form:?}");
        assert!(format!("{g:?}").find("secret").is_none());
    }
    let err = graph_err(files, &reader(), with(Form::Selector("../x".into()))).await;
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

fn branch_target(id: &str, name: &str) -> Option<LookupTarget> {
    Some(LookupTarget {
        kind: Some(lookup_target::Kind::PreviewBranch(PreviewBranchTarget {
            branch_id: id.into(),
            branch_name: name.into(),
        })),
    })
}

fn release_version(v: &str) -> ReleaseTarget {
    ReleaseTarget {
        selector: Some(release_target::Selector::ReleaseVersion(v.into())),
    }
}

fn release_target(r: ReleaseTarget) -> Option<LookupTarget> {
    Some(LookupTarget {
        kind: Some(lookup_target::Kind::Release(r)),
    })
}

fn environment(selector: environment_target::Selector) -> Option<LookupTarget> {
    Some(LookupTarget {
        kind: Some(lookup_target::Kind::Environment(EnvironmentTarget {
            selector: Some(selector),
        })),
    })
}

async fn targets(files: &FilesService, ids: &mut HashMap<String, String>) {
    let on = |target: Option<LookupTarget>| GetKnowledgeGraphRequest {
        lookup_target: target,
        ..request()
    };
    // Release v1.0.0 of main: a snapshot.
    let v1 = files
        .create_release(&admin(), NS, "v1.0.0", "", "first")
        .await
        .unwrap();
    assert_eq!(
        v1.file_count, 8,
        "every version, hidden ones too (flags apply at read)"
    );
    assert_eq!(v1.branch_id, "");

    // A preview branch where b.md stops linking to a.md and links to a new file.
    let branch = files
        .create_branch(&writer(), NS, "preview-1")
        .await
        .unwrap();
    let b2 = files
        .upload_to_branch(&writer(), NS, "preview-1", "b.md", b"# Beta 2\n", "")
        .await
        .unwrap();
    let f = files
        .upload_to_branch(&writer(), NS, &branch.branch_id, "f.md", b"# Phi\n", "")
        .await
        .unwrap();
    assert_eq!(
        b2.file_id,
        files
            .get_file(&admin(), NS, Some("b.md"), None)
            .await
            .unwrap()
            .file_id
    );
    assert_ne!(b2.version_id, ids["b.md"]);
    let as_info = |p: &str, file_id: &str, version_id: &str| FileInfo {
        path: p.into(),
        file_id: file_id.into(),
        version_id: version_id.into(),
        ..Default::default()
    };
    index(
        files,
        &as_info("b.md", &b2.file_id, &b2.version_id),
        "Beta two",
        "guide",
        &["core"],
        &[(INT, "c.md"), (INT, "f.md")],
    )
    .await;
    index(
        files,
        &as_info("f.md", &f.file_id, &f.version_id),
        "Phi",
        "note",
        &[],
        &[(INT, "a.md")],
    )
    .await;
    ids.insert("b2".into(), b2.version_id.clone());
    ids.insert("f.md".into(), f.version_id.clone());

    // Main did not change.
    let main = named(ids, &graph(files, &admin(), request()).await);
    assert_eq!(main.edges, all_edges());
    assert!(!main.nodes.contains(&"f.md".to_owned()));

    for target in [
        branch_target(&branch.branch_id, ""),
        branch_target("", "preview-1"),
    ] {
        let g = graph(files, &reader(), on(target)).await;
        let n = named(ids, &g);
        assert_eq!(
            n.nodes,
            [
                "_index.md",
                "a.md",
                "b.md",
                "c.md",
                "d/index.md",
                "e.md",
                "f.md"
            ]
        );
        assert_eq!(
            n.edges,
            edges(&[
                ("a.md", "b2", 0),
                ("a.md", "c.md", 5),
                ("b2", "c.md", 0),
                ("b2", "f.md", 1),
                ("c.md", "d/index.md", 0),
                ("d/index.md", "e.md", 0),
                ("f.md", "a.md", 0),
            ])
        );
    }
    // The main branch as an explicit preview_branch target (no id).
    let g = graph(files, &admin(), on(branch_target("", ""))).await;
    assert_eq!(named(ids, &g).edges, all_edges());

    // Main moves on after the release: e.md changes and gains a link.
    let e2 = put(files, "e.md", "# Epsilon 2\n").await;
    index(files, &e2, "Epsilon two", "note", &[], &[(INT, "a.md")]).await;
    ids.insert("e2".into(), e2.version_id.clone());
    let main = named(ids, &graph(files, &admin(), request()).await);
    assert!(main.edges.contains(&("e2".into(), "a.md".into(), 0)));

    // The release still reads the old e.md, by id and by version string.
    for target in [
        release_target(ReleaseTarget {
            selector: Some(release_target::Selector::ReleaseId(v1.release_id.clone())),
        }),
        release_target(release_version("v1.0.0")),
    ] {
        let g = graph(files, &admin(), on(target)).await;
        assert_eq!(named(ids, &g).edges, all_edges());
    }
    // Releases are restricted like main.
    let g = graph(
        files,
        &reader(),
        on(release_target(release_version("v1.0.0"))),
    )
    .await;
    assert_eq!(named(ids, &g).edges, reader_edges());

    // A release of the branch, deployed; the environment reads it by name and id.
    let v2 = files
        .create_release(&admin(), NS, "v1.1.0", "preview-1", "")
        .await
        .unwrap();
    assert_eq!(v2.branch_id, branch.branch_id);
    files
        .deploy_environment(&admin(), NS, "production", &release_version("v1.0.0"))
        .await
        .unwrap();
    let prod = files
        .deploy_environment(&admin(), NS, "production", &release_version("v1.1.0"))
        .await
        .unwrap();
    // Main moves on again; the deployed release does not.
    put(files, "e.md", "# Epsilon 3\n").await;
    assert_eq!(prod.release_version, "v1.1.0");
    let history: Vec<&str> = prod
        .history
        .iter()
        .map(|d| d.release_version.as_str())
        .collect();
    assert_eq!(history, ["v1.1.0", "v1.0.0"], "history, newest first");
    for target in [
        environment(environment_target::Selector::EnvironmentName(
            "production".into(),
        )),
        environment(environment_target::Selector::EnvironmentId(
            prod.environment_id.clone(),
        )),
    ] {
        let g = graph(files, &reader(), on(target)).await;
        let n = named(ids, &g);
        assert!(n.edges.contains(&("b2".into(), "f.md".into(), 1)));
        // The branch overlays main as it was when v1.1.0 was cut (e2).
        assert!(n.edges.contains(&("e2".into(), "a.md".into(), 0)));
        let e = g.nodes.iter().find(|n| n.path == "e.md").unwrap();
        assert_eq!(e.file_version_id, ids["e2"]);
    }
    let resolved = files
        .resolve_target(
            &reader(),
            NS,
            environment(environment_target::Selector::EnvironmentName(
                "production".into(),
            ))
            .as_ref(),
            0,
            "",
        )
        .await
        .unwrap();
    assert_eq!(resolved.kind, "environment");
    assert_eq!(resolved.release_version, "v1.1.0");
    assert_eq!(resolved.total, 7, "hidden and denied files are not listed");
    assert!(
        resolved
            .files
            .iter()
            .all(|f| !f.path.starts_with("private/"))
    );
    let envs = files.list_environments(&reader(), NS).await.unwrap();
    assert_eq!(envs.len(), 1);
    let releases = files.list_releases(&reader(), NS).await.unwrap();
    let versions: Vec<&str> = releases.iter().map(|r| r.version.as_str()).collect();
    assert_eq!(versions, ["v1.1.0", "v1.0.0"]);
    let branches = files.list_branches(&reader(), NS).await.unwrap();
    assert_eq!(branches.len(), 1);
    assert_eq!(branches[0].changed_files, 2);

    // Unresolved targets are not found, naming what was looked up.
    let missing = [
        (
            branch_target("0190a0a0-0000-7000-8000-000000000000", ""),
            "0190a0a0-0000-7000-8000-000000000000",
        ),
        (branch_target("", "nope"), "nope"),
        (release_target(release_version("v9.9.9")), "v9.9.9"),
        (
            release_target(ReleaseTarget {
                selector: Some(release_target::Selector::ReleaseId(
                    branch.branch_id.clone(),
                )),
            }),
            branch.branch_id.as_str(),
        ),
        (
            environment(environment_target::Selector::EnvironmentName(
                "staging".into(),
            )),
            "staging",
        ),
        (
            environment(environment_target::Selector::EnvironmentId(
                v1.release_id.clone(),
            )),
            v1.release_id.as_str(),
        ),
    ];
    for (target, key) in missing {
        let err = graph_err(files, &reader(), on(target)).await;
        assert_eq!(err.code(), ErrorCode::NotFound, "{key}");
        assert!(err.to_string().contains(key), "{err}");
    }

    // Who may do what; names and duplicates.
    let err = files
        .create_release(&writer(), NS, "v2", "", "")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    let err = files
        .deploy_environment(&reader(), NS, "production", &release_version("v1.0.0"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    let err = files
        .create_branch(&reader(), NS, "mine")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    let err = files
        .create_release(&admin(), NS, "v1.0.0", "", "")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AlreadyExists);
    let err = files
        .create_branch(&admin(), NS, "preview-1")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AlreadyExists);
    // Commands take a branch "id or name" and `main` for main itself: neither shape is a name.
    for (ambiguous, why) in [
        ("main", "main line"),
        ("Main", "main line"),
        (
            "01a250f3-ac92-768d-8344-6beb07cb9d79",
            "shape of a branch id",
        ),
    ] {
        let err = files
            .create_branch(&admin(), NS, ambiguous)
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{ambiguous}");
        assert!(err.to_string().contains(why), "{ambiguous}: {err}");
    }
    let err = files
        .create_release(&admin(), NS, "v 3", "", "")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = files
        .deploy_environment(&admin(), NS, "qa", &release_version("v7"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
}

async fn scenario(postgres: bool) {
    let env = env(postgres).await;
    let mut ids = corpus(&env.files).await;
    whole_graph_and_restricted_reader(&env.files, &ids).await;
    roots_and_depths(&env.files, &ids).await;
    filters(&env.files, &ids).await;
    paging(&env.files, &ids).await;
    caller_selectors(&env.files, &ids).await;
    targets(&env.files, &mut ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn knowledge_graph_on_sqlite() {
    scenario(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn knowledge_graph_on_postgres() {
    scenario(true).await;
}
