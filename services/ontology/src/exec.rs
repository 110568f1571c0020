//! Runs generated tools against the warehouse: get_, list_, traverse_ read
//! (sensitive columns never selected, values sanitised), propose_ checks role,
//! identity, precondition and approval, then hands a proposal to the approval
//! service. Nothing here can execute an effect itself.

use async_trait::async_trait;
use kg_proto::v1::{Proposal, ProposalState, SubmitProposalRequest, WebhookEffect};
use serde_json::{Map, Value, json};

use crate::compile::{
    Compiled, DEFAULT_LIMIT, DEFAULT_PARAM_CHARS, MAX_LIMIT, REDACTION_NOTE, ToolTarget,
};
use crate::effect;
use crate::error::{ToolCode, ToolError};
use crate::expr::EvalError;
use crate::project::{ActionDef, ApprovalDef, ApprovalMode, ObjectDef};
use crate::warehouse::{
    self, Bound, Warehouse, bound_json, coerce, column_expr, identity_order, quote_table, row_json,
    select_list, state_expr,
};

/// Where proposals go: the approval service (over gRPC in the mesh).
#[async_trait]
pub trait ProposalSink: Send + Sync {
    /// Approval.Submit.
    async fn submit(&self, request: SubmitProposalRequest) -> Result<Proposal, tonic::Status>;
}

/// Who calls and how the server runs.
pub struct CallOptions<'a> {
    /// The caller's roles (asserted over stdio, granted over HTTP).
    pub roles: &'a [String],
    /// The approval service; None when none is configured.
    pub approval: Option<&'a dyn ProposalSink>,
    /// `--allow-auto-effects`.
    pub allow_auto_effects: bool,
    /// MCP client name.
    pub agent: &'a str,
}

/// Runs one generated tool; the JSON result or a tool error.
pub async fn call(
    compiled: &Compiled,
    wh: &Warehouse,
    name: &str,
    arguments_json: &str,
    opts: &CallOptions<'_>,
) -> Result<Value, ToolError> {
    let Some(tool) = compiled.tool(name) else {
        return Err(ToolError::new(
            ToolCode::UnknownTool,
            format!("unknown tool `{name}`: call tools/list for the tools this server offers"),
        ));
    };
    let args = parse_args(arguments_json)?;
    match &tool.target {
        ToolTarget::Get { object } => get(obj(compiled, object)?, object, wh, &args).await,
        ToolTarget::List { object } => list(obj(compiled, object)?, object, wh, &args).await,
        ToolTarget::Traverse { object, relation } => {
            traverse(compiled, object, relation, wh, &args).await
        }
        ToolTarget::Propose { object, action } => {
            propose(compiled, object, action, wh, &args, opts).await
        }
    }
}

fn parse_args(text: &str) -> Result<Map<String, Value>, ToolError> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(Value::Null) => Ok(Map::new()),
        _ => Err(ToolError::new(
            ToolCode::InvalidArguments,
            "arguments must be a JSON object",
        )),
    }
}

/// The object named `name`.
pub(crate) fn obj<'a>(compiled: &'a Compiled, name: &str) -> Result<&'a ObjectDef, ToolError> {
    compiled.project.objects.get(name).ok_or_else(|| {
        ToolError::new(
            ToolCode::UnknownObject,
            format!("no object `{name}` in the compiled ontology"),
        )
    })
}

fn reject_unknown(
    args: &Map<String, Value>,
    allowed: &[&str],
    tool: &str,
) -> Result<(), ToolError> {
    for k in args.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(ToolError::new(
                ToolCode::InvalidArguments,
                format!("`{k}` is not an input of {tool}; accepted: {allowed:?}"),
            ));
        }
    }
    Ok(())
}

fn identity(
    obj: &ObjectDef,
    object: &str,
    args: &Map<String, Value>,
) -> Result<Vec<Bound>, ToolError> {
    obj.identity
        .iter()
        .map(|id| {
            let ty = obj
                .properties
                .get(id)
                .map(|d| d.value_type)
                .ok_or_else(|| {
                    ToolError::internal(format!("identity `{id}` of `{object}` has no property"))
                })?;
            let value = args.get(id).filter(|v| !v.is_null()).ok_or_else(|| {
                ToolError::new(
                    ToolCode::InvalidArguments,
                    format!("`{id}` is required (the {object} identity)"),
                )
            })?;
            coerce(value, ty).ok_or_else(|| {
                ToolError::new(
                    ToolCode::InvalidArguments,
                    format!("`{id}` must be {}", ty.json_type_with_article()),
                )
            })
        })
        .collect()
}

fn identity_json(obj: &ObjectDef, values: &[Bound]) -> Value {
    Value::Object(
        obj.identity
            .iter()
            .cloned()
            .zip(values.iter().map(bound_json))
            .collect(),
    )
}

fn identity_text(obj: &ObjectDef, values: &[Bound]) -> String {
    obj.identity
        .iter()
        .zip(values)
        .map(|(k, v)| format!("{k} = {}", bound_json(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn limit(args: &Map<String, Value>) -> Result<i64, ToolError> {
    match args.get("limit") {
        None | Some(Value::Null) => Ok(DEFAULT_LIMIT),
        Some(v) => {
            let n = v
                .as_i64()
                .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
                .ok_or_else(|| {
                    ToolError::new(ToolCode::InvalidArguments, "`limit` must be an integer")
                })?;
            // Always clamped server-side, whatever the client sent.
            Ok(n.clamp(1, MAX_LIMIT))
        }
    }
}

fn redacted(obj: &ObjectDef) -> Vec<String> {
    obj.properties
        .iter()
        .filter(|(_, d)| d.sensitive)
        .map(|(n, _)| n.clone())
        .collect()
}

fn rows_result(obj: &ObjectDef, rows: Vec<Map<String, Value>>, truncated: Option<bool>) -> Value {
    let mut out = json!({
        "rows": rows,
        "count": rows.len(),
        "redacted_properties": redacted(obj),
        "note": REDACTION_NOTE,
    });
    if let (Some(t), Some(m)) = (truncated, out.as_object_mut()) {
        m.insert("truncated".into(), Value::Bool(t));
    }
    out
}

fn decode_rows(
    obj: &ObjectDef,
    rows: &[sqlx::any::AnyRow],
) -> Result<Vec<Map<String, Value>>, ToolError> {
    rows.iter()
        .map(|r| row_json(r, obj).map_err(ToolError::internal))
        .collect()
}

/// Exactly one row or not_found / ambiguous_identity.
fn one<T>(mut rows: Vec<T>, object: &str, what: &str) -> Result<T, ToolError> {
    match rows.len() {
        0 => Err(ToolError::new(
            ToolCode::NotFound,
            format!("no {object} with {what}"),
        )),
        1 => rows
            .pop()
            .ok_or_else(|| ToolError::internal("row vanished")),
        _ => Err(ToolError::new(
            ToolCode::AmbiguousIdentity,
            format!(
                "more than one {object} has {what}; the identity is not unique in the warehouse"
            ),
        )),
    }
}

async fn get(
    obj: &ObjectDef,
    object: &str,
    wh: &Warehouse,
    args: &Map<String, Value>,
) -> Result<Value, ToolError> {
    let allowed: Vec<&str> = obj.identity.iter().map(String::as_str).collect();
    reject_unknown(args, &allowed, &format!("get_{object}"))?;
    let id = identity(obj, object, args)?;
    let sql = format!(
        "SELECT {} FROM {} WHERE {} LIMIT 2",
        select_list(obj),
        quote_table(&obj.table),
        wh.identity_where(obj, 1)
    );
    let rows = wh.fetch(sql, &id).await?;
    let row = one(rows, object, &identity_text(obj, &id))?;
    let row = row_json(&row, obj).map_err(ToolError::internal)?;
    Ok(rows_result(obj, vec![row], None))
}

async fn list(
    obj: &ObjectDef,
    object: &str,
    wh: &Warehouse,
    args: &Map<String, Value>,
) -> Result<Value, ToolError> {
    reject_unknown(args, &["state", "limit"], &format!("list_{object}"))?;
    let limit = limit(args)?;
    let mut binds = Vec::new();
    let mut filter = String::new();
    match args.get("state") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if obj.states.contains_key(s) => {
            if let Some(expr) = state_expr(obj) {
                filter = format!(" WHERE {expr} = $1");
                binds.push(Bound::Text(s.clone()));
            }
        }
        Some(_) => {
            return Err(ToolError::new(
                ToolCode::InvalidArguments,
                format!(
                    "`state` must be one of {:?}",
                    obj.states.keys().collect::<Vec<_>>()
                ),
            ));
        }
    }
    binds.push(Bound::Int(limit + 1));
    let sql = format!(
        "SELECT {} FROM {}{filter} ORDER BY {} LIMIT ${}",
        select_list(obj),
        quote_table(&obj.table),
        identity_order(obj),
        binds.len()
    );
    let rows = wh.fetch(sql, &binds).await?;
    let mut rows = decode_rows(obj, &rows)?;
    let truncated = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(rows_result(obj, rows, Some(truncated)))
}

async fn traverse(
    compiled: &Compiled,
    object: &str,
    relation: &str,
    wh: &Warehouse,
    args: &Map<String, Value>,
) -> Result<Value, ToolError> {
    let src = obj(compiled, object)?;
    let rel = src.relations.get(relation).ok_or_else(|| {
        ToolError::new(
            ToolCode::UnknownTool,
            format!("`{object}` has no relation `{relation}`"),
        )
    })?;
    let target = obj(compiled, &rel.target)?;
    let mut allowed: Vec<&str> = src.identity.iter().map(String::as_str).collect();
    allowed.push("limit");
    reject_unknown(args, &allowed, &format!("traverse_{object}_{relation}"))?;
    let id = identity(src, object, args)?;
    let limit = limit(args)?;
    let from_ty = src
        .properties
        .get(&rel.from)
        .map(|d| d.value_type)
        .ok_or_else(|| ToolError::internal("relation key has no property"))?;
    let to = rel
        .to
        .clone()
        .or_else(|| target.identity.first().cloned())
        .unwrap_or_default();
    let to_ty = target
        .properties
        .get(&to)
        .map(|d| d.value_type)
        .ok_or_else(|| ToolError::internal("relation target key has no property"))?;
    // Only the join key of the source is read, never its properties.
    let sql = format!(
        "SELECT {} FROM {} WHERE {} LIMIT 2",
        column_expr(None, &rel.from, from_ty),
        quote_table(&src.table),
        wh.identity_where(src, 1)
    );
    let rows = wh.fetch(sql, &id).await?;
    let row = one(rows, object, &identity_text(src, &id))?;
    let key = warehouse::decode(&row, 0, from_ty).map_err(ToolError::internal)?;
    let Some(key) = coerce(&key, to_ty) else {
        return Ok(with_object(
            rows_result(target, Vec::new(), Some(false)),
            &rel.target,
        ));
    };
    let sql = format!(
        "SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT $2",
        select_list(target),
        quote_table(&target.table),
        wh.equals(&target.table, &to, to_ty, 1),
        identity_order(target)
    );
    let rows = wh.fetch(sql, &[key, Bound::Int(limit + 1)]).await?;
    let mut rows = decode_rows(target, &rows)?;
    let truncated = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(with_object(
        rows_result(target, rows, Some(truncated)),
        &rel.target,
    ))
}

fn with_object(mut v: Value, object: &str) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.insert("object".into(), json!(object));
    }
    v
}

/// An action checked against live data, ready to propose.
pub(crate) struct Prepared {
    pub(crate) role: String,
    pub(crate) identity: Vec<Bound>,
    pub(crate) params: Map<String, Value>,
    pub(crate) state: Option<String>,
    pub(crate) effect: WebhookEffect,
    pub(crate) canonical_args: Map<String, Value>,
}

/// Role, arguments, identity lookup, precondition and effect rendering, in
/// that order: a refused role never reaches the warehouse.
pub(crate) async fn prepare(
    compiled: &Compiled,
    object: &str,
    action: &str,
    wh: &Warehouse,
    args: &Map<String, Value>,
    roles: &[String],
) -> Result<(Prepared, bool), ToolError> {
    let o = obj(compiled, object)?;
    let act = o.actions.get(action).ok_or_else(|| {
        ToolError::new(
            ToolCode::UnknownTool,
            format!("`{object}` has no action `{action}`"),
        )
    })?;
    let tool = format!("propose_{object}_{action}");
    let Some(role) = act.policy.roles.iter().find(|r| roles.contains(r)) else {
        return Err(ToolError::new(
            ToolCode::DeniedRole,
            format!(
                "{tool} is allowed for roles {:?}; this caller's roles are {roles:?}. Nothing was read or changed.",
                act.policy.roles
            ),
        ));
    };
    let mut allowed: Vec<&str> = o.identity.iter().map(String::as_str).collect();
    allowed.extend(act.parameters.keys().map(String::as_str));
    allowed.push("dry_run");
    reject_unknown(args, &allowed, &tool)?;
    let dry_run = match args.get("dry_run") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ToolError::new(
                ToolCode::InvalidArguments,
                "`dry_run` must be true or false",
            ));
        }
    };
    let id = identity(o, object, args)?;
    let params = parameters(act, args)?;

    let state_sql = state_expr(o).unwrap_or_else(|| "CAST(NULL AS TEXT)".to_owned());
    let sql = format!(
        "SELECT {state_sql} FROM {} WHERE {} LIMIT 2",
        quote_table(&o.table),
        wh.identity_where(o, 1)
    );
    let rows = wh.fetch(sql, &id).await?;
    let row = one(rows, object, &identity_text(o, &id))?;
    let state = warehouse::decode(&row, 0, crate::project::ValueType::String)
        .map_err(ToolError::internal)?
        .as_str()
        .map(str::to_owned);
    if let Some(req) = &act.requires
        && state.as_deref() != Some(req.as_str())
    {
        let actual = state
            .as_deref()
            .map_or("no state".to_owned(), |s| format!("state `{s}`"));
        return Err(ToolError::new(
            ToolCode::PreconditionFailed,
            format!(
                "the {object} with {} is in {actual}; `{action}` requires state `{req}`",
                identity_text(o, &id)
            ),
        ));
    }
    let mut vars = Map::new();
    for (k, v) in o.identity.iter().zip(&id) {
        vars.insert(k.clone(), bound_json(v));
    }
    for name in act.parameters.keys() {
        vars.insert(
            name.clone(),
            params.get(name).cloned().unwrap_or(Value::Null),
        );
    }
    let effect = effect::render(&act.effect, &vars).map_err(|detail| {
        tracing::error!(object, action, %detail, "effect does not render");
        ToolError::new(
            ToolCode::EffectMisconfigured,
            format!("the effect of `{object}.{action}` cannot be rendered for these arguments; an operator must fix the ontology"),
        )
    })?;
    let mut canonical = Map::new();
    for (k, v) in o.identity.iter().zip(&id) {
        canonical.insert(k.clone(), bound_json(v));
    }
    canonical.extend(params.clone());
    Ok((
        Prepared {
            role: role.clone(),
            identity: id,
            params,
            state,
            effect,
            canonical_args: canonical,
        },
        dry_run,
    ))
}

fn parameters(act: &ActionDef, args: &Map<String, Value>) -> Result<Map<String, Value>, ToolError> {
    let mut out = Map::new();
    for (name, def) in &act.parameters {
        match args.get(name).filter(|v| !v.is_null()) {
            None if def.required => {
                return Err(ToolError::new(
                    ToolCode::InvalidArguments,
                    format!("`{name}` is required"),
                ));
            }
            None => {}
            Some(v) => {
                let b = coerce(v, def.value_type).ok_or_else(|| {
                    ToolError::new(
                        ToolCode::InvalidArguments,
                        format!(
                            "`{name}` must be {}",
                            def.value_type.json_type_with_article()
                        ),
                    )
                })?;
                if let Bound::Text(s) = &b {
                    let max = def.max_length.unwrap_or(DEFAULT_PARAM_CHARS);
                    if s.chars().count() > max {
                        return Err(ToolError::new(
                            ToolCode::InvalidArguments,
                            format!("`{name}` is longer than {max} characters"),
                        ));
                    }
                }
                out.insert(name.clone(), bound_json(&b));
            }
        }
    }
    Ok(out)
}

/// What a failed Approval.Submit tells the agent: whether a retry is safe is the part it
/// must know, and the approval service's own status text stays in the log.
fn submit_failed(status: &tonic::Status, needs_approval: bool) -> ToolError {
    match status.code() {
        // The approval service's own validation, in its words (never a store's).
        tonic::Code::InvalidArgument => ToolError::new(
            ToolCode::InvalidArguments,
            format!("{}; nothing was stored or run", status.message()),
        ),
        // A proposal that waits for a human is stored last, so a failure leaves none.
        tonic::Code::Unavailable if needs_approval => {
            tracing::warn!(error = %status.message(), "approval service unavailable");
            ToolError::new(
                ToolCode::Unavailable,
                "the approval service is unavailable, so no proposal was stored; retry shortly",
            )
        }
        // An effect without approval starts before the answer: it may have gone out.
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            tracing::warn!(error = %status.message(), "approval service did not answer");
            let what = if needs_approval {
                "the proposal may have been stored and be waiting for a human"
            } else {
                "the proposal may have been taken and its effect sent"
            };
            ToolError::new(
                ToolCode::InternalError,
                format!(
                    "the approval service did not answer: {what}; do not retry, as a retry \
                     can make a second proposal"
                ),
            )
        }
        _ => ToolError::internal(format!("approval submit failed: {status}")),
    }
}

fn approval_required(
    compiled: &Compiled,
    object: &str,
    action: &str,
    act: &ActionDef,
    params: &Map<String, Value>,
) -> Result<bool, ToolError> {
    match &act.approval {
        ApprovalDef::Mode(ApprovalMode::Always) => Ok(true),
        ApprovalDef::Mode(ApprovalMode::Never) => Ok(false),
        ApprovalDef::When { when } => {
            let e = compiled
                .when
                .get(&(object.to_owned(), action.to_owned()))
                .ok_or_else(|| ToolError::internal("approval expression not compiled"))?;
            e.eval_bool(params).map_err(|err| match err {
                EvalError::Missing(p) => ToolError::new(
                    ToolCode::ApprovalUnevaluable,
                    format!("approval.when `{when}` needs the parameter `{p}`, which the call did not supply; supply it"),
                ),
                EvalError::Type(t) => ToolError::new(
                    ToolCode::InvalidArguments,
                    format!("approval.when `{when}` cannot be evaluated: {t}"),
                ),
            })
        }
    }
}

async fn propose(
    compiled: &Compiled,
    object: &str,
    action: &str,
    wh: &Warehouse,
    args: &Map<String, Value>,
    opts: &CallOptions<'_>,
) -> Result<Value, ToolError> {
    let (prep, dry_run) = prepare(compiled, object, action, wh, args, opts.roles).await?;
    let o = obj(compiled, object)?;
    let act = o
        .actions
        .get(action)
        .ok_or_else(|| ToolError::internal("action vanished"))?;
    let needs_approval = approval_required(compiled, object, action, act, &prep.params)?;
    let mut out = json!({
        "object": object,
        "action": action,
        "identity": identity_json(o, &prep.identity),
        "state": prep.state,
        "approval_required": needs_approval,
        "effect": {"method": prep.effect.method, "url_template": prep.effect.url_template, "host": prep.effect.host},
        "policy_version": compiled.action_version(object, action),
    });
    let set = |out: &mut Value, k: &str, v: Value| {
        if let Some(m) = out.as_object_mut() {
            m.insert(k.to_owned(), v);
        }
    };
    if dry_run {
        let would = if needs_approval {
            "store a proposal for a human to approve or reject; nothing runs until then"
        } else if opts.allow_auto_effects {
            "run the effect once now (this action needs no approval and the server allows automatic effects)"
        } else {
            "refuse with auto_effects_disabled: this action needs no approval and the server does not allow automatic effects"
        };
        set(&mut out, "outcome", json!("dry_run"));
        set(&mut out, "would", json!(would));
        return Ok(out);
    }
    if !needs_approval && !opts.allow_auto_effects {
        return Err(ToolError::new(
            ToolCode::AutoEffectsDisabled,
            format!(
                "`{object}.{action}` declares no approval for these arguments and this server does not run effects automatically (--allow-auto-effects is off); nothing was stored or run"
            ),
        ));
    }
    let Some(approval) = opts.approval else {
        tracing::error!("a proposal was refused: this ontology service has no approval address");
        return Err(ToolError::new(
            ToolCode::InternalError,
            "this server has no approval service configured, so it takes no proposals; nothing \
             was stored or run; an operator must set the ontology service's approval address",
        ));
    };
    let arguments_json = Value::Object(prep.canonical_args.clone()).to_string();
    let most = kg_proto::limits::PROPOSAL_ARGUMENTS_BYTES;
    if arguments_json.len() > most {
        return Err(ToolError::new(
            ToolCode::InvalidArguments,
            format!(
                "the arguments are {} bytes as JSON; a proposal holds at most {most}: shorten the \
                 longest values; nothing was stored or run",
                arguments_json.len()
            ),
        ));
    }
    let request = SubmitProposalRequest {
        object: object.to_owned(),
        action: action.to_owned(),
        arguments_json,
        role: prep.role.clone(),
        policy_version: compiled.action_version(object, action),
        agent: opts.agent.to_owned(),
        execute_now: !needs_approval,
        // Not sent: approval renders what the approver sees and what runs through
        // CheckAction itself, so no submitter can dress either up.
        effect: None,
    };
    let proposal = approval
        .submit(request)
        .await
        .map_err(|status| submit_failed(&status, needs_approval))?;
    set(&mut out, "proposal_id", json!(proposal.id));
    let outcome = match (needs_approval, proposal.state()) {
        (true, _) => "pending_approval",
        (false, ProposalState::Executed) => "executed",
        (false, ProposalState::EffectFailed) => "effect_failed",
        // Approved = the run goes on past the approval service's wait: sent, no answer yet.
        (false, ProposalState::Unknown | ProposalState::Approved) => "unknown",
        (false, ProposalState::PreconditionFailed) => {
            let code = match proposal.refusal.as_str() {
                "denied_role" => ToolCode::DeniedRole,
                "not_found" => ToolCode::NotFound,
                "ambiguous_identity" => ToolCode::AmbiguousIdentity,
                _ => ToolCode::PreconditionFailed,
            };
            return Err(ToolError::new(code, proposal.outcome_detail));
        }
        (false, ProposalState::EffectMisconfigured) => {
            tracing::error!(proposal = %proposal.id, detail = %proposal.outcome_detail, "effect misconfigured");
            return Err(ToolError::new(
                ToolCode::EffectMisconfigured,
                format!(
                    "the effect of `{object}.{action}` is misconfigured (a missing secret or a bad URL); nothing was sent; an operator must fix it"
                ),
            ));
        }
        (false, other) => {
            return Err(ToolError::internal(format!(
                "approval answered execute_now with state {other:?}"
            )));
        }
    };
    set(&mut out, "outcome", json!(outcome));
    if !proposal.outcome_detail.is_empty() {
        set(
            &mut out,
            "detail",
            json!(kg_common::sanitize::sanitize_text(
                &proposal.outcome_detail,
                500
            )),
        );
    }
    if outcome == "unknown" {
        set(
            &mut out,
            "would",
            json!(
                "the request was sent and no response came back: the effect may or may not have been applied; do not retry"
            ),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    /// `list_` and `traverse_` share it: default 100, at most 1000, at least 1, whatever the
    /// client sends.
    #[test]
    fn limit_defaults_and_is_clamped_server_side() {
        assert_eq!((DEFAULT_LIMIT, MAX_LIMIT), (100, 1000));
        for (given, expected) in [
            (json!({}), 100),
            (json!({"limit": null}), 100),
            (json!({"limit": 7}), 7),
            (json!({"limit": 1000}), 1000),
            (json!({"limit": 1001}), 1000),
            (json!({"limit": 1_000_000_000_000_i64}), 1000),
            (json!({"limit": 1e300}), 1000),
            (json!({"limit": 0}), 1),
            (json!({"limit": -5}), 1),
            (json!({"limit": 2.7}), 2),
        ] {
            assert_eq!(limit(&args(given.clone())).ok(), Some(expected), "{given}");
        }
        for bad in [
            json!({"limit": "10"}),
            json!({"limit": true}),
            json!({"limit": [1]}),
        ] {
            let err = limit(&args(bad.clone())).err();
            assert!(
                err.is_some_and(|e| e.code == ToolCode::InvalidArguments),
                "{bad}"
            );
        }
    }
}
