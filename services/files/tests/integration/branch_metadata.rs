//! Uploads to a preview branch get their title and links end to end: the files service
//! publishes the branch upload, the real indexer parses it for metadata and links only, and
//! the files status consumer stores them per version id, so get_knowledge_graph on the branch
//! (and on a release cut from it) shows the title and the link edges while main's graph, and
//! main's status rows, never see the branch. Real NATS, FalkorDB, SQLite and blobs.
use std::time::{Duration, Instant};

use kg_common::caller::now_ms;
use kg_files::FilesService;
use kg_indexer::IndexerConfig;
use kg_proto::v1::{
    AccessFilter, CallerContext, FileStatus, GetKnowledgeGraphRequest, GetKnowledgeGraphResponse,
    GraphNode, LookupTarget, Permission, PreviewBranchTarget, ReleaseTarget, lookup_target,
    release_target,
};
use kg_stores::blobs::BlobStore;
use kg_stores::embedded::{EmbeddedFalkor, EmbeddedNats, find_venv};
use kg_stores::graph::{GraphStore, Params};
use kg_stores::sql::SqlStore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const NS: &str = "branchmeta";
const SETUP: &str = "---\ntitle: Setup\n---\n# Setup\n\nInstall it.\n";
const PREVIEW: &str = "---\ntitle: Preview Guide\ntags: [preview]\n---\n# Preview\n\n\
See [setup](setup.md#install), [the site](https://example.com/docs) and [later](../todo.md).\n";
const WAIT: Duration = Duration::from_secs(60);

fn admin() -> CallerContext {
    let now = now_ms();
    CallerContext {
        principal_id: "tester".into(),
        access: vec![AccessFilter {
            namespace: NS.into(),
            allow_prefixes: vec![String::new()],
            permission: Permission::Admin as i32,
            write_prefixes: vec![String::new()],
            admin_prefixes: vec![String::new()],
            ..Default::default()
        }],
        issued_at_ms: now,
        expires_at_ms: now + 3_600_000,
        is_admin: true,
        ..Default::default()
    }
}

struct Mesh {
    dir: tempfile::TempDir,
    _nats: EmbeddedNats,
    falkor: Option<EmbeddedFalkor>,
    graph: GraphStore,
    files: FilesService,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Mesh {
    /// The files service, its status consumer and the indexer (main and branch consumers).
    /// With `graph_down`, FalkorDB is stopped once connected: main's indexing keeps failing
    /// and retrying, while branch uploads (which never touch the graph) still go through.
    async fn start(graph_down: bool) -> Mesh {
        let venv = find_venv().expect("run deploy/scripts/dev-deps.sh first");
        let dir = tempfile::tempdir().unwrap();
        let nats = EmbeddedNats::start(&venv, &dir.path().join("nats"))
            .await
            .unwrap();
        let falkor = EmbeddedFalkor::start(&venv, &dir.path().join("falkor"))
            .await
            .unwrap();
        let graph = GraphStore::connect(&falkor.url).await.unwrap();
        let falkor = if graph_down {
            drop(falkor);
            None
        } else {
            Some(falkor)
        };
        let js = kg_stores::events::connect(&nats.url).await.unwrap();
        let sql = SqlStore::connect(&format!(
            "sqlite://{}",
            dir.path().join("files.db").display()
        ))
        .await
        .unwrap();
        let blobs = BlobStore::new(dir.path().join("blobs"));
        let files = FilesService::new(sql, blobs.clone(), js.clone(), 1 << 20)
            .await
            .unwrap();
        let stop = CancellationToken::new();
        let indexer = tokio::spawn(kg_indexer::run(
            IndexerConfig::default(),
            graph.clone(),
            blobs,
            js.clone(),
            stop.clone(),
        ));
        let status = tokio::spawn(kg_files::run_status_consumer(
            files.clone(),
            js,
            stop.clone(),
        ));
        let tasks = vec![
            tokio::spawn(async move {
                indexer.await.unwrap().unwrap();
            }),
            tokio::spawn(async move {
                status.await.unwrap().unwrap();
            }),
        ];
        Mesh {
            dir,
            _nats: nats,
            falkor,
            graph,
            files,
            stop,
            tasks,
        }
    }

    async fn shutdown(self) {
        self.stop.cancel();
        for task in self.tasks {
            tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        }
        drop(self.falkor);
        drop(self.dir);
    }

    async fn status(&self, path: &str) -> FileStatus {
        self.files
            .get_file(&admin(), NS, Some(path), None)
            .await
            .unwrap()
            .status()
    }

    async fn wait_indexed(&self, path: &str) {
        let deadline = Instant::now() + WAIT;
        while self.status(path).await != FileStatus::Indexed {
            assert!(
                Instant::now() < deadline,
                "{path} was never indexed on main"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the files service holds metadata for `version_id` and returns its title.
    async fn wait_meta(&self, version_id: &str) -> Option<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let stored = self
                .files
                .version_links(&[version_id.to_owned()])
                .await
                .unwrap();
            if let Some(v) = stored.into_iter().next() {
                return v.meta.title;
            }
            assert!(
                Instant::now() < deadline,
                "no metadata stored for {version_id}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn graph_on(&self, target: Option<lookup_target::Kind>) -> GetKnowledgeGraphResponse {
        let request = GetKnowledgeGraphRequest {
            namespace: NS.into(),
            lookup_target: target.map(|kind| LookupTarget { kind: Some(kind) }),
            ..Default::default()
        };
        self.files
            .get_knowledge_graph(&admin(), &request)
            .await
            .unwrap()
    }

    async fn graph_count(&self, cypher: &str, path: &str) -> i64 {
        let mut params = Params::new();
        params.insert("path".into(), serde_json::json!(path));
        let rows = self.graph.query(NS, cypher, &params).await.unwrap();
        rows.rows[0][0].as_i64().unwrap()
    }
}

fn node<'a>(graph: &'a GetKnowledgeGraphResponse, path: &str) -> Option<&'a GraphNode> {
    graph.nodes.iter().find(|n| n.path == path)
}

/// What the graph says about the branch file `preview` linking to main's `setup`.
fn assert_preview_graph(graph: &GetKnowledgeGraphResponse, preview: &str, setup: &str, what: &str) {
    let node = node(graph, "guides/preview.md").unwrap_or_else(|| panic!("{what}: no node"));
    assert_eq!(node.file_version_id, preview, "{what}");
    assert_eq!(node.title.as_deref(), Some("Preview Guide"), "{what}");
    assert_eq!(node.tags, ["preview"], "{what}");
    let setup_node = node_of(graph, "guides/setup.md", what);
    assert_eq!(setup_node.title.as_deref(), Some("Setup"), "{what}");
    let edges: Vec<(&str, &str, u32)> = graph
        .edges
        .iter()
        .map(|e| {
            (
                e.source_file_version_id.as_str(),
                e.target_file_version_id.as_str(),
                e.ordinal,
            )
        })
        .collect();
    assert_eq!(edges, [(preview, setup, 0)], "{what}");
    let external: Vec<(&str, u32, &str)> = graph
        .external_links
        .iter()
        .map(|l| (l.source_file_version_id.as_str(), l.ordinal, l.url.as_str()))
        .collect();
    assert_eq!(
        external,
        [(preview, 1, "https://example.com/docs")],
        "{what}"
    );
    let broken: Vec<(&str, u32, &str)> = graph
        .broken_links
        .iter()
        .map(|l| {
            (
                l.source_file_version_id.as_str(),
                l.ordinal,
                l.target_path.as_str(),
            )
        })
        .collect();
    assert_eq!(broken, [(preview, 2, "todo.md")], "{what}");
    assert_eq!(graph.total_nodes, 2, "{what}");
}

fn node_of<'a>(graph: &'a GetKnowledgeGraphResponse, path: &str, what: &str) -> &'a GraphNode {
    node(graph, path).unwrap_or_else(|| panic!("{what}: no node for {path}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_only_file_has_its_title_and_links_on_the_branch_and_its_releases() {
    let mesh = Mesh::start(false).await;
    let files = &mesh.files;

    let setup = files
        .upload(&admin(), NS, "guides/setup.md", SETUP.as_bytes(), "")
        .await
        .unwrap()
        .file
        .unwrap();
    mesh.wait_indexed("guides/setup.md").await;

    let branch = files.create_branch(&admin(), NS, "preview").await.unwrap();
    let preview = files
        .upload_to_branch(
            &admin(),
            NS,
            "preview",
            "guides/preview.md",
            PREVIEW.as_bytes(),
            "",
        )
        .await
        .unwrap();
    assert_eq!(
        mesh.wait_meta(&preview.version_id).await.as_deref(),
        Some("Preview Guide")
    );

    let on_branch = mesh
        .graph_on(Some(lookup_target::Kind::PreviewBranch(
            PreviewBranchTarget {
                branch_id: branch.branch_id.clone(),
                ..Default::default()
            },
        )))
        .await;
    assert_preview_graph(&on_branch, &preview.version_id, &setup.version_id, "branch");

    let release = files
        .create_release(&admin(), NS, "v1.0.0-preview", "preview", "")
        .await
        .unwrap();
    assert_eq!(release.file_count, 2);
    let in_release = mesh
        .graph_on(Some(lookup_target::Kind::Release(ReleaseTarget {
            selector: Some(release_target::Selector::ReleaseVersion(
                "v1.0.0-preview".into(),
            )),
        })))
        .await;
    assert_preview_graph(
        &in_release,
        &preview.version_id,
        &setup.version_id,
        "release",
    );

    // Main knows nothing of the branch file: not in its link graph, not in FalkorDB.
    let on_main = mesh.graph_on(None).await;
    assert!(node(&on_main, "guides/preview.md").is_none());
    assert_eq!(on_main.total_nodes, 1);
    assert!(on_main.edges.is_empty());
    assert_eq!(
        node_of(&on_main, "guides/setup.md", "main")
            .title
            .as_deref(),
        Some("Setup")
    );
    let refs = "MATCH (f:FileRef {vfsPath: $path}) RETURN count(f)";
    assert_eq!(mesh.graph_count(refs, "guides/preview.md").await, 0);
    assert_eq!(mesh.graph_count(refs, "guides/setup.md").await, 1);
    let chunks = "MATCH (c:Chunk {path: $path}) RETURN count(c)";
    assert_eq!(mesh.graph_count(chunks, "guides/preview.md").await, 0);
    assert!(
        files
            .get_file(&admin(), NS, Some("guides/preview.md"), None)
            .await
            .is_err(),
        "a branch-only file is not a main file"
    );

    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_upload_of_a_version_pending_on_main_leaves_main_pending() {
    // Main's graph cannot be written here, so main's version stays pending for good; the
    // branch upload of the same content (same file id, same version id) must not flip it.
    let mesh = Mesh::start(true).await;
    let files = &mesh.files;

    let main = files
        .upload(&admin(), NS, "guides/preview.md", PREVIEW.as_bytes(), "")
        .await
        .unwrap()
        .file
        .unwrap();
    assert_eq!(main.status(), FileStatus::Pending);
    files.create_branch(&admin(), NS, "preview").await.unwrap();
    let on_branch = files
        .upload_to_branch(
            &admin(),
            NS,
            "preview",
            "guides/preview.md",
            PREVIEW.as_bytes(),
            "",
        )
        .await
        .unwrap();
    assert_eq!(on_branch.file_id, main.file_id);
    assert_eq!(on_branch.version_id, main.version_id);

    // The branch's metadata arrives (the only writer that can succeed here) ...
    assert_eq!(
        mesh.wait_meta(&main.version_id).await.as_deref(),
        Some("Preview Guide")
    );
    // ... and main's row is exactly as the upload left it (a status write would follow the
    // metadata at once, so give it a moment to show up if it were coming).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let row = files
        .get_file(&admin(), NS, Some("guides/preview.md"), None)
        .await
        .unwrap();
    assert_eq!(row.status(), FileStatus::Pending, "{row:?}");
    assert_eq!(row.chunk_count, main.chunk_count);
    assert_eq!(row.version_id, main.version_id);

    mesh.shutdown().await;
}
