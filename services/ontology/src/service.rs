//! The ontology service: the compiled project in force (swapped atomically on
//! reload), generated tool calls, CheckAction for the approval service, and
//! the TBox lifecycle.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use kg_common::sanitize::{sanitize_json, sanitize_text};
use kg_proto::v1::approval_client::ApprovalClient;
use kg_proto::v1::{
    CheckActionResponse, GeneratedTool, Proposal, SignedCallerContext, SubmitProposalRequest,
};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::compile::{self, Compiled, GeneratedToolDef};
use crate::error::{OntologyError, Result, ToolCode, ToolError};
use crate::exec::{self, CallOptions, ProposalSink};
use crate::project::{ApprovalDef, ApprovalMode, LoadedProject};
use crate::tbox::TboxStore;
use crate::warehouse::Warehouse;

/// How the service runs.
#[derive(Debug, Clone, Default)]
pub struct OntologyConfig {
    /// The project directory (holding `ontology.yaml`); None serves no generated tools.
    pub project_dir: Option<PathBuf>,
    /// Overrides the project's warehouse URL.
    pub warehouse_url: Option<String>,
    /// gRPC address of the approval service.
    pub approval_addr: Option<String>,
    /// Actions without approval may run at once (`--allow-auto-effects`).
    pub allow_auto_effects: bool,
}

/// A compiled project and its warehouse.
#[derive(Debug)]
pub struct Active {
    /// The compiled project.
    pub compiled: Compiled,
    /// Its warehouse.
    pub warehouse: Warehouse,
}

/// Loads, validates (static and live) and compiles a project: every problem at once.
pub async fn load_project(
    dir: &Path,
    warehouse_url: Option<&str>,
) -> std::result::Result<Active, Vec<String>> {
    let loaded = LoadedProject::load(dir).map_err(|e| vec![e.to_string()])?;
    let mut problems = compile::check_static(&loaded.project);
    let url = match loaded.warehouse_url(warehouse_url) {
        Ok(url) => url,
        Err(err) => {
            problems.push(err.to_string());
            return Err(problems);
        }
    };
    let mut warehouse = match Warehouse::connect(&url).await {
        Ok(w) => w,
        Err(err) => {
            tracing::warn!(error = %err, "cannot connect to the warehouse");
            problems.push("warehouse: cannot connect (check the URL and that the database runs; details in the log)".into());
            return Err(problems);
        }
    };
    problems.extend(compile::check_live(&loaded.project, &mut warehouse).await);
    if !problems.is_empty() {
        warehouse.close().await;
        return Err(problems);
    }
    match compile::compile(&loaded.project) {
        Ok(compiled) => Ok(Active {
            compiled,
            warehouse,
        }),
        Err(problems) => Err(problems),
    }
}

/// Longest generated tool description, and longest string in its schemas, in characters.
const TOOL_TEXT_CHARS: usize = 4096;

/// The proto form of a tool. Its descriptions come from the project file, written by
/// people but handed to a model, so they are sanitised and capped like stored text.
pub fn tool_proto(t: &GeneratedToolDef) -> GeneratedTool {
    let schema = |s: &Value| sanitize_json(s.clone(), TOOL_TEXT_CHARS, TOOL_TEXT_CHARS).to_string();
    GeneratedTool {
        name: t.name.clone(),
        description: sanitize_text(&t.description, TOOL_TEXT_CHARS),
        input_schema_json: schema(&t.input_schema),
        output_schema_json: schema(&t.output_schema),
        read_only: t.read_only,
    }
}

/// What a generated tool call forwards to the approval service: the caller's signed
/// context, and how long the call may take from when it arrived (its gRPC deadline).
#[derive(Clone, Debug)]
pub struct Forward {
    /// The caller's context, as the gateway signed it.
    pub signed: SignedCallerContext,
    /// The time the call is allowed ([`kg_common::grpc::time_allowed`]).
    pub allowed: std::time::Duration,
}

/// Submits over gRPC with the caller's signed context, within the call's deadline (less
/// room to answer), so an execute_now run that outlasts it reads as sent-not-yet-answered
/// instead of failing the tool call.
struct GrpcSink {
    client: ApprovalClient<Channel>,
    signed: SignedCallerContext,
    done_by: tokio::time::Instant,
}

#[async_trait::async_trait]
impl ProposalSink for GrpcSink {
    async fn submit(
        &self,
        request: SubmitProposalRequest,
    ) -> std::result::Result<Proposal, tonic::Status> {
        let left = self
            .done_by
            .saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(tonic::Status::deadline_exceeded(
                "no time was left to submit the proposal",
            ));
        }
        let mut request = tonic::Request::new(request);
        kg_common::caller::attach_caller(&mut request, &self.signed);
        request.set_timeout(left);
        self.client
            .clone()
            .submit(request)
            .await
            .map(tonic::Response::into_inner)
    }
}

struct Inner {
    config: OntologyConfig,
    active: RwLock<Option<Arc<Active>>>,
    version: watch::Sender<i64>,
    approval: Option<ApprovalClient<Channel>>,
    tbox: Option<TboxStore>,
    /// Ends every WatchCompiled stream: a stopping server waits for its open streams, and a
    /// watch otherwise never ends.
    watches_end: CancellationToken,
}

/// The ontology service; cheap to clone.
#[derive(Clone)]
pub struct OntologyService {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for OntologyService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OntologyService").finish_non_exhaustive()
    }
}

impl OntologyService {
    /// Builds the service and loads the project when one is configured; a
    /// project with problems is an error listing all of them.
    pub async fn new(config: OntologyConfig, tbox: Option<TboxStore>) -> Result<Self> {
        let approval = match &config.approval_addr {
            Some(addr) => Some(ApprovalClient::new(
                kg_common::grpc::channel(addr).map_err(|e| {
                    OntologyError::BadRequest(format!("approval address `{addr}`: {e}"))
                })?,
            )),
            None => None,
        };
        let (version, _) = watch::channel(0);
        let service = Self {
            inner: Arc::new(Inner {
                config,
                active: RwLock::new(None),
                version,
                approval,
                tbox,
                watches_end: CancellationToken::new(),
            }),
        };
        if service.inner.config.project_dir.is_some() {
            service.reload().await?;
        }
        Ok(service)
    }

    /// Reloads the project directory; on problems the previous tool set stays.
    pub async fn reload(&self) -> Result<Arc<Active>> {
        let dir = self
            .inner
            .config
            .project_dir
            .clone()
            .ok_or(OntologyError::NoProject)?;
        let active = Arc::new(
            load_project(&dir, self.inner.config.warehouse_url.as_deref())
                .await
                .map_err(OntologyError::Invalid)?,
        );
        let old = self
            .inner
            .active
            .write()
            .map(|mut g| g.replace(active.clone()))
            .map_err(|_| OntologyError::Store("active project lock poisoned".into()))?;
        let version = active.compiled.policy_version;
        self.inner.version.send_replace(version);
        tracing::info!(
            version,
            tools = active.compiled.tools.len(),
            "ontology project compiled"
        );
        if let Some(old) = old
            && Arc::strong_count(&old) == 1
        {
            old.warehouse.close().await;
        }
        Ok(active)
    }

    /// The compiled project in force.
    pub fn active(&self) -> Option<Arc<Active>> {
        self.inner.active.read().ok().and_then(|g| g.clone())
    }

    /// Follows the compiled version (0 before any project is loaded).
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.inner.version.subscribe()
    }

    /// Cancelled when the service stops: each WatchCompiled stream ends then.
    pub(crate) fn watches_end(&self) -> CancellationToken {
        self.inner.watches_end.clone()
    }

    /// Ends every WatchCompiled stream (the server is stopping), so the watchers' connections
    /// close and the server need not wait out its grace for them.
    pub fn end_watches(&self) {
        self.inner.watches_end.cancel();
    }

    /// The TBox store, when configured.
    pub fn tbox(&self) -> Option<&TboxStore> {
        self.inner.tbox.as_ref()
    }

    /// Tools visible to `roles` (the signed context's); (tools, compiled version).
    pub fn tools_for(&self, roles: &[String]) -> (Vec<GeneratedTool>, i64) {
        let Some(active) = self.active() else {
            return (Vec::new(), 0);
        };
        (
            active
                .compiled
                .tools_for(roles)
                .into_iter()
                .map(tool_proto)
                .collect(),
            active.compiled.policy_version,
        )
    }

    /// Runs a generated tool as `roles` (the signed context's), proposing through the
    /// approval service with the forwarded context; the result JSON (a tool error as
    /// `{"error", "message"}`).
    pub async fn call_tool(
        &self,
        name: &str,
        arguments_json: &str,
        roles: &[String],
        agent: &str,
        forward: Option<Forward>,
    ) -> Value {
        let sink = match (&self.inner.approval, forward) {
            (Some(client), Some(forward)) => Some(GrpcSink {
                client: client.clone(),
                signed: forward.signed,
                done_by: kg_common::grpc::work_deadline(forward.allowed),
            }),
            _ => None,
        };
        let sink = sink.as_ref().map(|s| s as &dyn ProposalSink);
        self.call_tool_with(name, arguments_json, roles, agent, sink)
            .await
    }

    /// Runs a generated tool with a custom proposal sink (in-process callers and tests).
    pub async fn call_tool_with(
        &self,
        name: &str,
        arguments_json: &str,
        roles: &[String],
        agent: &str,
        sink: Option<&dyn ProposalSink>,
    ) -> Value {
        let Some(active) = self.active() else {
            return ToolError::new(
                ToolCode::UnknownTool,
                format!(
                    "unknown tool `{name}`: call tools/list for the tools this server offers \
                     (no ontology project is loaded, so it offers only the built-in kg_ tools)"
                ),
            )
            .to_json();
        };
        let opts = CallOptions {
            roles,
            approval: sink,
            allow_auto_effects: self.inner.config.allow_auto_effects,
            agent,
        };
        match exec::call(
            &active.compiled,
            &active.warehouse,
            name,
            arguments_json,
            &opts,
        )
        .await
        {
            Ok(v) => v,
            Err(e) => e.to_json(),
        }
    }

    /// CheckAction: role, identity, precondition against live data, approval
    /// requirement and the rendered effect. Refusals are in the response.
    pub async fn check_action(
        &self,
        object: &str,
        action: &str,
        arguments_json: &str,
        role: &str,
    ) -> Result<CheckActionResponse> {
        let active = self.active().ok_or(OntologyError::NoProject)?;
        let compiled = &active.compiled;
        let args = match serde_json::from_str::<Value>(arguments_json) {
            Ok(Value::Object(m)) => m,
            _ => {
                return Err(OntologyError::BadRequest(
                    "arguments_json must be a JSON object".into(),
                ));
            }
        };
        let refusal = |e: ToolError| CheckActionResponse {
            refusal: e.code.as_str().to_owned(),
            detail: e.message,
            effect: None,
            policy_version: compiled.action_version(object, action),
            approval_required: None,
        };
        let roles = [role.to_owned()];
        match exec::prepare(compiled, object, action, &active.warehouse, &args, &roles).await {
            Ok((prep, _)) => {
                let act = compiled
                    .project
                    .objects
                    .get(object)
                    .and_then(|o| o.actions.get(action))
                    .ok_or_else(|| {
                        OntologyError::NotFound(format!("no action `{object}.{action}`"))
                    })?;
                let approval_required = match &act.approval {
                    ApprovalDef::Mode(ApprovalMode::Always) => Some(true),
                    ApprovalDef::Mode(ApprovalMode::Never) => Some(false),
                    ApprovalDef::When { .. } => compiled
                        .when
                        .get(&(object.to_owned(), action.to_owned()))
                        .and_then(|e| e.eval_bool(&prep.params).ok()),
                };
                // Without --allow-auto-effects every effect waits for a decision, so the
                // approval service refuses `execute_now` even from a caller that went round
                // the generated tool (which refuses with auto_effects_disabled first).
                let approval_required = if self.inner.config.allow_auto_effects {
                    approval_required
                } else {
                    Some(true)
                };
                Ok(CheckActionResponse {
                    refusal: String::new(),
                    detail: String::new(),
                    effect: Some(prep.effect),
                    policy_version: compiled.action_version(object, action),
                    approval_required,
                })
            }
            Err(e) => match e.code {
                ToolCode::DeniedRole
                | ToolCode::PreconditionFailed
                | ToolCode::NotFound
                | ToolCode::AmbiguousIdentity => Ok(refusal(e)),
                ToolCode::UnknownObject | ToolCode::UnknownTool => {
                    Err(OntologyError::NotFound(e.message))
                }
                ToolCode::InvalidArguments => Err(OntologyError::BadRequest(e.message)),
                ToolCode::EffectMisconfigured => Err(OntologyError::Conflict(e.message)),
                _ => Err(OntologyError::Store(e.message)),
            },
        }
    }
}
