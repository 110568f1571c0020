//! Shared gateway state: config, one gRPC client per backend, the shutdown token,
//! and the authorized caller that travels in request extensions.

use std::sync::Arc;
use std::time::Duration;

use kg_common::caller::attach_caller;
use kg_common::grpc::MAX_MESSAGE_BYTES;
use kg_proto::v1::auth_client::AuthClient;
use kg_proto::v1::files_client::FilesClient;
use kg_proto::v1::graph_client::GraphClient;
use kg_proto::v1::retrieval_client::RetrievalClient;
use kg_proto::v1::{AuthorizeRequest, CallerContext, SignedCallerContext};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::audit::{AUDIT_QUEUE_CAPACITY, AuditSink};
use crate::config::GatewayConfig;
use crate::error::{ClientError, GatewayError};

/// Deadline on one backend call made for a client request.
pub(crate) const BACKEND_TIMEOUT: Duration = Duration::from_secs(20);

/// One tonic client per backend, over lazily connecting channels.
#[derive(Clone)]
pub(crate) struct Backends {
    pub(crate) auth: AuthClient<Channel>,
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
        Ok(Self {
            auth: AuthClient::new(channel("auth", &b.auth)?)
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
        })
    }

    /// Resolves a PAT into a signed caller context. The token goes to auth only.
    pub(crate) async fn authorize(&self, token: &str, tool: &str) -> Result<Caller, ClientError> {
        let request_id = uuid::Uuid::new_v4().to_string();
        let mut request = tonic::Request::new(AuthorizeRequest {
            token: token.to_owned(),
            tool: tool.to_owned(),
            namespaces: Vec::new(),
            request_id: request_id.clone(),
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
                Err(ClientError::new(kg_common::ErrorCode::Internal, ""))
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
