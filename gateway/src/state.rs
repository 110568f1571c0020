//! Shared gateway state: config, one gRPC client per backend, the shutdown token,
//! and the authorized caller that travels in request extensions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kg_common::ErrorCode;
use kg_common::caller::{attach_caller, now_ms};
use kg_common::grpc::MAX_MESSAGE_BYTES;
use kg_proto::v1::auth_client::AuthClient;
use kg_proto::v1::files_client::FilesClient;
use kg_proto::v1::graph_client::GraphClient;
use kg_proto::v1::retrieval_client::RetrievalClient;
use kg_proto::v1::{AuthorizeRequest, CallerContext, SignedCallerContext};
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;

use crate::audit::{AUDIT_QUEUE_CAPACITY, AuditSink};
use crate::config::GatewayConfig;
use crate::error::{ClientError, GatewayError};

/// Deadline on one backend call made for a client request.
pub(crate) const BACKEND_TIMEOUT: Duration = Duration::from_secs(20);

/// One tonic client per backend, over lazily connecting channels.
#[derive(Clone)]
pub(crate) struct Backends {
    pub(crate) auth: AuthClient<Channel>,
    /// Auth's health service, which says whether auth can reach its database (`/ready`).
    pub(crate) auth_health: HealthClient<Channel>,
    pub(crate) files: FilesClient<Channel>,
    pub(crate) retrieval: RetrievalClient<Channel>,
    pub(crate) graph: GraphClient<Channel>,
}

fn channel(name: &str, addr: &str) -> Result<Channel, GatewayError> {
    kg_common::grpc::channel(addr)
        .map_err(|err| GatewayError::Config(format!("backends.{name}: cannot use `{addr}`: {err}")))
}

impl Backends {
    fn connect(config: &GatewayConfig) -> Result<Self, GatewayError> {
        let b = &config.backends;
        let auth = channel("auth", &b.auth)?;
        Ok(Self {
            auth_health: HealthClient::new(auth.clone()),
            auth: AuthClient::new(auth)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            files: FilesClient::new(channel("files", &b.files)?)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            retrieval: RetrievalClient::new(channel("retrieval", &b.retrieval)?)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            graph: GraphClient::new(channel("graph", &b.graph)?)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        })
    }
}

/// What the gateway shares between HTTP handlers, the MCP handler and stdio.
#[derive(Clone)]
pub struct GatewayState {
    pub(crate) config: Arc<GatewayConfig>,
    pub(crate) backends: Backends,
    pub(crate) shutdown: CancellationToken,
    /// Where every tool call's audit event goes (to auth, off the call path).
    pub(crate) audit: AuditSink,
    /// Tools generated from the compiled ontology (off without `ontology_addr`).
    pub(crate) generated: crate::mcp::Generated,
    /// Auth's last answer per recent token, so an MCP tool call can start while auth
    /// checks the token again (see [`SpeculativeCaller`]).
    pub(crate) recent_callers: RecentCallers,
}

impl GatewayState {
    /// Validates `config` and builds the backend clients (connections open lazily).
    /// Cancelling `shutdown` ends open MCP sessions and streams.
    pub fn new(config: GatewayConfig, shutdown: CancellationToken) -> Result<Self, GatewayError> {
        config.validate()?;
        let backends = Backends::connect(&config)?;
        let audit = AuditSink::new(backends.auth.clone(), AUDIT_QUEUE_CAPACITY);
        let generated = crate::mcp::Generated::connect(config.ontology_addr.as_deref())?;
        Ok(Self {
            generated,
            config: Arc::new(config),
            backends,
            shutdown,
            audit,
            recent_callers: RecentCallers::default(),
        })
    }

    /// Resolves a PAT into a signed caller context. The token goes to auth only.
    /// `asserted_role` is a stdio launcher's role (`Some("")`: none), signed into the
    /// context in place of the granted roles; HTTP callers pass None.
    pub(crate) async fn authorize(
        &self,
        token: &str,
        tool: &str,
        asserted_role: Option<&str>,
    ) -> Result<Caller, ClientError> {
        let request_id = uuid::Uuid::new_v4().to_string();
        let mut request = tonic::Request::new(AuthorizeRequest {
            token: token.to_owned(),
            tool: tool.to_owned(),
            namespaces: Vec::new(),
            request_id: request_id.clone(),
            asserted_role: asserted_role.map(str::to_owned),
        });
        request.set_timeout(BACKEND_TIMEOUT);
        let response = self
            .backends
            .auth
            .clone()
            .authorize(request)
            .await
            .map_err(|status| ClientError::from_status("auth", &status))?
            .into_inner();
        match (response.context, response.decoded) {
            (Some(signed), Some(decoded)) => Ok(Caller(Arc::new(CallerInner {
                signed,
                decoded,
                request_id,
            }))),
            _ => {
                tracing::error!("auth returned an authorization without a context");
                Err(ClientError::new(ErrorCode::Internal, ""))
            }
        }
    }
}

/// An authorized caller: the signed context forwarded to services and the
/// decoded one the gateway reads for its own decisions.
#[derive(Clone, Debug)]
pub(crate) struct Caller(Arc<CallerInner>);

#[derive(Debug)]
struct CallerInner {
    signed: SignedCallerContext,
    decoded: CallerContext,
    request_id: String,
}

impl Caller {
    /// A caller built directly, for unit tests that need no auth round trip.
    #[cfg(test)]
    pub(crate) fn for_test(signed: SignedCallerContext, decoded: CallerContext) -> Self {
        Self(Arc::new(CallerInner {
            signed,
            decoded,
            request_id: "req_test".to_owned(),
        }))
    }

    pub(crate) fn context(&self) -> &CallerContext {
        &self.0.decoded
    }

    /// The signed form, forwarded to services (and with audit events).
    pub(crate) fn signed(&self) -> &SignedCallerContext {
        &self.0.signed
    }

    /// Whether `other` grants exactly what this caller grants: every field of the decoded
    /// context but the per-call ones (request id, issue and expiry times). Compared as whole
    /// messages, so a field added to the context later counts as a difference.
    pub(crate) fn same_access(&self, other: &Caller) -> bool {
        fn access(context: &CallerContext) -> CallerContext {
            CallerContext {
                request_id: String::new(),
                issued_at_ms: 0,
                expires_at_ms: 0,
                ..context.clone()
            }
        }
        access(&self.0.decoded) == access(&other.0.decoded)
    }

    pub(crate) fn principal_id(&self) -> &str {
        &self.0.decoded.principal_id
    }

    pub(crate) fn request_id(&self) -> &str {
        &self.0.request_id
    }

    /// A backend request carrying this caller's signed context and the deadline.
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        attach_caller(&mut request, &self.0.signed);
        request.set_timeout(BACKEND_TIMEOUT);
        request
    }
}

/// Tokens remembered at most; past this, expired entries go and new tokens are not
/// remembered (their calls simply wait for auth).
const RECENT_CALLERS_CAP: usize = 4096;

/// A remembered context is used only while it stays valid this long: every backend call
/// of the tool call must reach its service before the signed context expires.
const SPECULATION_MARGIN_MS: i64 = 20_000;

/// Auth's last answer per token, keyed by the token's SHA-256 (the token itself is not kept).
///
/// A tool call whose token auth resolved recently starts its backend work with that
/// context while auth resolves the token again; the answer is released only when the fresh
/// context grants exactly the same access, and is computed again under the fresh one when
/// it does not. So auth still decides every call (a revocation or a grant change applies to
/// the next call, as without this), but its round trip is off the call's critical path.
#[derive(Clone, Default)]
pub(crate) struct RecentCallers(Arc<Mutex<HashMap<[u8; 32], Caller>>>);

impl RecentCallers {
    fn key(token: &str) -> [u8; 32] {
        Sha256::digest(token.as_bytes()).into()
    }

    /// The caller auth last returned for `token`, while it stays valid long enough.
    pub(crate) fn get(&self, token: &str) -> Option<Caller> {
        let now = now_ms();
        let callers = self.0.lock().ok()?;
        callers
            .get(&Self::key(token))
            .filter(|caller| caller.context().expires_at_ms - now > SPECULATION_MARGIN_MS)
            .cloned()
    }

    /// Remembers auth's answer for `token`.
    pub(crate) fn remember(&self, token: &str, caller: &Caller) {
        let Ok(mut callers) = self.0.lock() else {
            return;
        };
        if callers.len() >= RECENT_CALLERS_CAP {
            let now = now_ms();
            callers.retain(|_, c| c.context().expires_at_ms - now > SPECULATION_MARGIN_MS);
            if callers.len() >= RECENT_CALLERS_CAP {
                return;
            }
        }
        callers.insert(Self::key(token), caller.clone());
    }

    /// Forgets `token` (auth refused it), so its next call waits for auth again.
    pub(crate) fn forget(&self, token: &str) {
        if let Ok(mut callers) = self.0.lock() {
            callers.remove(&Self::key(token));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().map(|c| c.len()).unwrap_or(0)
    }
}

/// Auth's fresh answer for a request that runs ahead on a remembered caller.
type Verdict = Option<Result<Caller, ClientError>>;

/// A request extension in place of [`Caller`]: the caller auth returned for the same token
/// last time, and auth's answer for this request once it arrives.
///
/// Only read-only tool calls may run on `ahead` before the answer; everything else awaits
/// [`SpeculativeCaller::confirmed`] and uses the fresh caller.
#[derive(Clone, Debug)]
pub(crate) struct SpeculativeCaller {
    pub(crate) ahead: Caller,
    verdict: watch::Receiver<Verdict>,
}

/// Delivers auth's answer to the request's [`SpeculativeCaller`].
pub(crate) struct VerdictSender(watch::Sender<Verdict>);

impl VerdictSender {
    pub(crate) fn send(self, verdict: Result<Caller, ClientError>) {
        // No receiver left means the request is gone: nothing waits for the answer.
        let _ = self.0.send(Some(verdict));
    }
}

impl SpeculativeCaller {
    pub(crate) fn new(ahead: Caller) -> (Self, VerdictSender) {
        let (sender, verdict) = watch::channel(None);
        (Self { ahead, verdict }, VerdictSender(sender))
    }

    /// Auth's answer for this request. Fails closed when the request ended before auth
    /// answered.
    pub(crate) async fn confirmed(&self) -> Result<Caller, ClientError> {
        let mut verdict = self.verdict.clone();
        match verdict.wait_for(Option::is_some).await {
            Ok(answer) => answer.clone().unwrap_or_else(|| Err(not_confirmed())),
            Err(_) => Err(not_confirmed()),
        }
    }
}

fn not_confirmed() -> ClientError {
    ClientError::new(
        ErrorCode::Unauthenticated,
        "the request ended before its token was authorized: send it again",
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use kg_proto::v1::AccessFilter;

    use super::*;

    fn caller(namespace: &str, expires_in_ms: i64, request_id: &str) -> Caller {
        let now = now_ms();
        Caller::for_test(
            SignedCallerContext::default(),
            CallerContext {
                principal_id: "usr_a".into(),
                access: vec![AccessFilter {
                    namespace: namespace.into(),
                    allow_prefixes: vec![String::new()],
                    ..Default::default()
                }],
                issued_at_ms: now,
                expires_at_ms: now + expires_in_ms,
                request_id: request_id.into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn same_access_ignores_only_the_per_call_fields() {
        let first = caller("demo", 60_000, "req_1");
        assert!(first.same_access(&caller("demo", 59_000, "req_2")));
        assert!(!first.same_access(&caller("docs", 60_000, "req_1")));
        let mut admin = first.context().clone();
        admin.is_admin = true;
        let admin = Caller::for_test(SignedCallerContext::default(), admin);
        assert!(!first.same_access(&admin));
    }

    #[test]
    fn recent_callers_hold_only_contexts_with_time_left() {
        let recent = RecentCallers::default();
        assert!(recent.get("kg_pat_a").is_none());
        recent.remember("kg_pat_a", &caller("demo", 60_000, "req_1"));
        assert_eq!(
            recent.get("kg_pat_a").unwrap().context().request_id,
            "req_1"
        );
        assert!(recent.get("kg_pat_b").is_none());
        // Too close to expiry for a call's backend requests to arrive in time.
        recent.remember(
            "kg_pat_b",
            &caller("demo", SPECULATION_MARGIN_MS - 1, "req_2"),
        );
        assert!(recent.get("kg_pat_b").is_none());
        recent.forget("kg_pat_a");
        assert!(recent.get("kg_pat_a").is_none());

        // Full: expired entries make room; a full map of live ones takes no more.
        let full = RecentCallers::default();
        for i in 0..RECENT_CALLERS_CAP {
            full.remember(&format!("kg_pat_{i}"), &caller("demo", 1_000, "req"));
        }
        full.remember("kg_pat_new", &caller("demo", 60_000, "req"));
        assert_eq!(full.len(), 1);
        for i in 0..RECENT_CALLERS_CAP {
            full.remember(&format!("kg_pat_live_{i}"), &caller("demo", 60_000, "req"));
        }
        full.remember("kg_pat_late", &caller("demo", 60_000, "req"));
        assert!(full.get("kg_pat_late").is_none());
        assert_eq!(full.len(), RECENT_CALLERS_CAP);
    }

    #[tokio::test]
    async fn a_speculative_caller_fails_closed_without_an_answer() {
        let (speculative, sender) = SpeculativeCaller::new(caller("demo", 60_000, "req_1"));
        drop(sender);
        let err = speculative.confirmed().await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Unauthenticated);

        let (speculative, sender) = SpeculativeCaller::new(caller("demo", 60_000, "req_1"));
        sender.send(Ok(caller("demo", 60_000, "req_2")));
        let fresh = speculative.confirmed().await.unwrap();
        assert_eq!(fresh.context().request_id, "req_2");
        assert!(fresh.same_access(&speculative.ahead));
    }
}
