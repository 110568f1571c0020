//! `kgmesh ontology validate|compile|schema` (a project directory against its
//! live warehouse; `compile` also makes a running mesh reload it, which sends
//! `notifications/tools/list_changed` to MCP sessions; over gRPC to the local mesh found in
//! the data dir, as the token's principal) and `kgmesh tbox
//! draft|show|review|publish|published` (a namespace's TBox lifecycle, over the gateway's admin
//! REST, so from anywhere the gateway is reachable).

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use kg_proto::v1::auth_client::AuthClient;
use kg_proto::v1::ontology_client::OntologyClient;
use kg_proto::v1::{
    AuthorizeRequest, ReloadProjectRequest, SignedCallerContext, WatchCompiledRequest,
};
use kgmesh::MeshInfo;

use super::Remote;
use serde_json::{Value, json};
use tonic::transport::Channel;

#[derive(Args, Clone)]
pub(crate) struct ProjectArgs {
    /// Directory holding ontology.yaml.
    #[arg(long)]
    project_dir: PathBuf,
    /// Overrides the project's warehouse URL (sqlite://... or postgres://...).
    #[arg(long, env = "KGMESH_WAREHOUSE_URL")]
    warehouse_url: Option<String>,
}

#[derive(Args, Clone)]
pub(crate) struct MeshArgs {
    /// Data dir of the running mesh (read for its service addresses).
    #[arg(long, default_value = ".kgmesh", env = "KGMESH_DATA_DIR")]
    data_dir: PathBuf,
    /// An admin PAT.
    #[arg(long, env = "KGMESH_TOKEN", hide_env_values = true, default_value = "")]
    token: String,
}

#[derive(Subcommand)]
pub(crate) enum OntologyCommand {
    /// Check the project against the live warehouse; every problem at once.
    Validate(ProjectArgs),
    /// Validate, print the generated tools; with --reload, make the running mesh reload it.
    Compile {
        #[command(flatten)]
        project: ProjectArgs,
        /// Also tell the running mesh to reload the project.
        #[arg(long)]
        reload: bool,
        #[command(flatten)]
        mesh: MeshArgs,
    },
    /// Print the JSON Schema of ontology.yaml.
    Schema,
}

#[derive(Subcommand)]
pub(crate) enum TboxCommand {
    /// Put a draft from a YAML or JSON file ({entity_types: [...], relation_types: [...]});
    /// it replaces any draft and clears its review.
    Draft {
        #[arg(long, short)]
        namespace: String,
        /// The TBox file.
        #[arg(long)]
        file: PathBuf,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show the current draft, and who reviewed it.
    Show {
        #[arg(long, short)]
        namespace: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Mark the draft reviewed by the token's principal.
    Review {
        #[arg(long, short)]
        namespace: String,
        /// The `digest` that `tbox show` printed: the review is refused if the draft changed
        /// since you read it.
        #[arg(long)]
        digest: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Publish the reviewed draft as the next version; the indexer re-extracts the entities of
    /// the namespace's files with it.
    Publish {
        #[arg(long, short)]
        namespace: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show the published TBox.
    Published {
        #[arg(long, short)]
        namespace: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Names the indexer saw in the namespace's files that no TBox matcher found (proper
    /// names, acronyms, identifiers), most widespread first: what to draft the TBox from.
    Candidates {
        #[arg(long, short)]
        namespace: String,
        /// Only this kind: proper_name, acronym or identifier.
        #[arg(long)]
        kind: Option<String>,
        /// Most candidates to list (default 100, at most 1000).
        #[arg(long)]
        limit: Option<u32>,
        #[command(flatten)]
        remote: Remote,
    },
}

fn print(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Runs `kgmesh ontology …`; exit code 2 when validation finds problems.
pub(crate) async fn ontology(command: OntologyCommand) -> anyhow::Result<std::process::ExitCode> {
    match command {
        OntologyCommand::Schema => {
            print(&kg_ontology::project_schema())?;
        }
        OntologyCommand::Validate(p) => {
            let active =
                match kg_ontology::load_project(&p.project_dir, p.warehouse_url.as_deref()).await {
                    Ok(active) => active,
                    Err(problems) => return Ok(report(&problems)),
                };
            println!(
                "{}: valid ({} objects, {} tools, policy version {})",
                p.project_dir.display(),
                active.compiled.project.objects.len(),
                active.compiled.tools.len(),
                active.compiled.policy_version
            );
            warn_unset_secrets(&active.compiled.project);
        }
        OntologyCommand::Compile {
            project: p,
            reload,
            mesh,
        } => {
            let active =
                match kg_ontology::load_project(&p.project_dir, p.warehouse_url.as_deref()).await {
                    Ok(active) => active,
                    Err(problems) => return Ok(report(&problems)),
                };
            let tools: Vec<Value> = active
                .compiled
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name, "readOnly": t.read_only, "roles": t.roles,
                        "description": t.description, "inputSchema": t.input_schema, "outputSchema": t.output_schema
                    })
                })
                .collect();
            print(&json!({"policyVersion": active.compiled.policy_version, "tools": tools}))?;
            if reload {
                let (mut client, signed) = ontology_client(&mesh).await?;
                // The version served before, to say whether the reload changed anything (a
                // session is notified only when it did).
                let before = match client.watch_compiled(WatchCompiledRequest {}).await {
                    Ok(watch) => watch
                        .into_inner()
                        .message()
                        .await
                        .ok()
                        .flatten()
                        .map(|v| v.compiled_version),
                    Err(_) => None,
                };
                let response = client
                    .reload_project(with_caller(ReloadProjectRequest {}, &signed))
                    .await
                    .map_err(|s| anyhow::anyhow!("reload failed: {}", s.message()))?
                    .into_inner();
                if !response.problems.is_empty() {
                    return Ok(report(&response.problems));
                }
                if before == Some(response.compiled_version) {
                    eprintln!(
                        "the running mesh already served policy version {} ({} tools): nothing changed, no MCP session was notified",
                        response.compiled_version,
                        response.tools.len()
                    );
                } else {
                    eprintln!(
                        "the running mesh now serves policy version {} ({} tools); MCP sessions were notified",
                        response.compiled_version,
                        response.tools.len()
                    );
                }
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Not a problem of the project: the approval service reads the variables from its own
/// environment (`kgmesh up` passes its own on), which is usually this shell's.
fn warn_unset_secrets(project: &kg_ontology::Project) {
    for (variable, action) in project.unset_effect_secrets() {
        eprintln!(
            "note: `{variable}` (a secret header of `{action}`'s effect) is not set in this environment; \
             the approval service needs it, or approving that action ends `effect_misconfigured`"
        );
    }
}

fn report(problems: &[String]) -> std::process::ExitCode {
    eprintln!("the project has {} problem(s):", problems.len());
    for p in problems {
        eprintln!("  - {p}");
    }
    std::process::ExitCode::from(2)
}

fn with_caller<T>(message: T, signed: &SignedCallerContext) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    kg_common::caller::attach_caller(&mut request, signed);
    request
}

/// An ontology client and a signed context for the token's principal.
async fn ontology_client(
    mesh: &MeshArgs,
) -> anyhow::Result<(OntologyClient<Channel>, SignedCallerContext)> {
    if mesh.token.trim().is_empty() {
        bail!("set KGMESH_TOKEN (or --token) to an admin PAT");
    }
    let info = MeshInfo::load(&mesh.data_dir)?;
    let addr = info
        .ontology
        .clone()
        .context("the running mesh has no ontology service")?;
    let mut auth = AuthClient::new(kg_common::grpc::channel(&info.grpc.auth)?);
    let authorized = auth
        .authorize(AuthorizeRequest {
            token: mesh.token.trim().to_owned(),
            tool: "admin:ontology".to_owned(),
            namespaces: Vec::new(),
            request_id: uuid::Uuid::new_v4().to_string(),
            asserted_role: None,
        })
        .await
        .map_err(|s| anyhow::anyhow!("auth refused the token: {}", s.message()))?
        .into_inner();
    let signed = authorized.context.context("auth returned no context")?;
    Ok((
        OntologyClient::new(kg_common::grpc::channel(&addr)?)
            .max_decoding_message_size(kg_common::grpc::MAX_MESSAGE_BYTES),
        signed,
    ))
}

/// Runs `kgmesh tbox …`.
pub(crate) async fn tbox(command: TboxCommand) -> anyhow::Result<()> {
    let (remote, value) = match command {
        TboxCommand::Draft {
            namespace,
            file,
            remote,
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let parsed: kg_gateway::tbox_json::TboxBody = serde_yaml_ng::from_str(&text)
                .with_context(|| format!("{} is not a TBox file", file.display()))?;
            let value = remote
                .client()?
                .put(
                    &["namespaces", &namespace, "tbox", "draft"],
                    serde_json::to_value(parsed)?,
                )
                .await?;
            (remote, value)
        }
        TboxCommand::Show { namespace, remote } => {
            let value = remote
                .client()?
                .get(&["namespaces", &namespace, "tbox", "draft"], &[])
                .await?;
            (remote, value)
        }
        TboxCommand::Review {
            namespace,
            digest,
            remote,
        } => {
            let value = remote
                .client()?
                .post(
                    &["namespaces", &namespace, "tbox", "draft", "review"],
                    json!({ "digest": digest.unwrap_or_default() }),
                )
                .await?;
            (remote, value)
        }
        TboxCommand::Publish { namespace, remote } => {
            let value = remote
                .client()?
                .post(&["namespaces", &namespace, "tbox", "publish"], json!({}))
                .await?;
            (remote, value)
        }
        TboxCommand::Candidates {
            namespace,
            kind,
            limit,
            remote,
        } => {
            let query = [
                ("kind", kind.unwrap_or_default()),
                ("limit", limit.map(|n| n.to_string()).unwrap_or_default()),
            ];
            let value = remote
                .client()?
                .get(&["namespaces", &namespace, "tbox", "candidates"], &query)
                .await?;
            (remote, value)
        }
        TboxCommand::Published { namespace, remote } => {
            let value = remote
                .client()?
                .get(&["namespaces", &namespace, "tbox"], &[])
                .await?;
            (remote, value)
        }
    };
    remote.print(&value)
}

/// Serves `dir`'s generated tools from this process (`kgmesh mcp --stdio
/// --project-dir`): an ontology service on a loopback port that trusts the
/// mesh's auth key and submits proposals to the mesh's approval service.
/// Returns its gRPC address. Problems with the project fail the start.
pub(crate) async fn serve_local(
    info: &MeshInfo,
    dir: &std::path::Path,
    warehouse_url: Option<String>,
    allow_auto_effects: bool,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<String> {
    let mut auth = AuthClient::new(kg_common::grpc::channel(&info.grpc.auth)?);
    let key = auth
        .signing_key(kg_proto::v1::SigningKeyRequest {})
        .await
        .map_err(|s| anyhow::anyhow!("cannot reach the mesh's auth service: {}", s.message()))?
        .into_inner();
    let verifier = kg_common::caller::ContextVerifier::new(vec![
        kg_common::caller::PublicKey::from_bytes(&key.public_key)
            .context("auth sent a bad signing key")?,
    ]);
    let service = match kg_ontology::OntologyService::new(
        kg_ontology::OntologyConfig {
            project_dir: Some(dir.to_path_buf()),
            warehouse_url,
            approval_addr: info.approval.clone(),
            allow_auto_effects,
        },
        None,
    )
    .await
    {
        Ok(service) => service,
        Err(err) => bail!("{err}"),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        if let Err(err) = kg_ontology::serve(service, verifier, listener, shutdown).await {
            tracing::error!(error = %err, "local ontology service stopped");
        }
    });
    kgmesh::mesh::wait_serving(&addr, "kg.v1.Ontology", std::time::Duration::from_secs(10)).await?;
    Ok(addr)
}
