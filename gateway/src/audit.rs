//! Audit recording of MCP tool calls. Each call yields one `AuditEvent` (no
//! arguments, text or secrets) that is queued, never awaited, and sent to auth
//! with the caller's signed context by one background worker. A full queue
//! drops the event and counts it, so auditing never slows a tool call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kg_common::caller::attach_caller;
use kg_common::error::code_of;
use kg_proto::v1::auth_client::AuthClient;
use kg_proto::v1::{AuditEvent, RecordAuditRequest, SignedCallerContext};
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::Channel;

use crate::metrics::gateway_metrics;
use crate::state::Caller;

/// Events that may wait for delivery before new ones are dropped.
pub(crate) const AUDIT_QUEUE_CAPACITY: usize = 1024;
/// RecordAudit calls in flight at once.
const AUDIT_CONCURRENCY: usize = 8;
/// Deadline on one RecordAudit call; well inside the context's lifetime.
const AUDIT_TIMEOUT: Duration = Duration::from_secs(5);
/// A drop is logged on the first one and then once per this many.
const DROP_LOG_EVERY: u64 = 100;
/// First pause before sending an event again after auth could not be reached; doubles up to
/// [`AUDIT_RETRY_MAX`].
const AUDIT_RETRY_FIRST: Duration = Duration::from_millis(250);
const AUDIT_RETRY_MAX: Duration = Duration::from_secs(4);
/// An event is sent again only while its signed context has at least this long to live, or
/// auth would refuse it as expired.
const AUDIT_CONTEXT_MARGIN: Duration = Duration::from_secs(2);

/// How a tool call reached the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Http,
    Stdio,
}

impl Transport {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Transport::Http => "http",
            Transport::Stdio => "stdio",
        }
    }
}

struct AuditJob {
    signed: SignedCallerContext,
    event: AuditEvent,
    /// When the signed context expires (ms since the epoch): auth takes it until then.
    expires_at_ms: i64,
}

impl AuditJob {
    /// The event with who called and the request id taken from `caller`.
    fn new(caller: &Caller, mut event: AuditEvent) -> Self {
        let context = caller.context();
        event.principal_id.clone_from(&context.principal_id);
        event.on_behalf_of.clone_from(&context.on_behalf_of);
        event.request_id = caller.request_id().to_owned();
        Self {
            signed: caller.signed().clone(),
            event,
            expires_at_ms: context.expires_at_ms,
        }
    }
}

/// The sending half of the audit pipeline; cheap to clone.
#[derive(Clone)]
pub(crate) struct AuditSink {
    inner: Arc<SinkInner>,
}

struct SinkInner {
    tx: mpsc::Sender<AuditJob>,
    /// Held until the first event starts the worker: the state may be built
    /// outside a runtime, the first tool call never is.
    pending: Mutex<Option<(mpsc::Receiver<AuditJob>, AuthClient<Channel>)>>,
    dropped: AtomicU64,
}

impl AuditSink {
    /// A sink delivering to `auth` through a queue of `capacity` events.
    pub(crate) fn new(auth: AuthClient<Channel>, capacity: usize) -> Self {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        Self {
            inner: Arc::new(SinkInner {
                tx,
                pending: Mutex::new(Some((rx, auth))),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Queues `event` for `caller`, filling in who called from the decoded
    /// context (auth trusts only the signed one). Returns false when dropped.
    pub(crate) fn record(&self, caller: &Caller, event: AuditEvent) -> bool {
        self.start_worker();
        match self.inner.tx.try_send(AuditJob::new(caller, event)) {
            Ok(()) => true,
            Err(err) => {
                let job = match err {
                    mpsc::error::TrySendError::Full(job)
                    | mpsc::error::TrySendError::Closed(job) => job,
                };
                gateway_metrics().audit_dropped.inc();
                let dropped = self.inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if dropped == 1 || dropped.is_multiple_of(DROP_LOG_EVERY) {
                    tracing::warn!(
                        tool = %job.event.tool,
                        principal = %job.event.principal_id,
                        dropped_total = dropped,
                        "audit queue full: dropped an audit event"
                    );
                }
                false
            }
        }
    }

    fn start_worker(&self) {
        let mut pending = match self.inner.pending.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if pending.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!("audit worker cannot start outside a tokio runtime");
            return;
        };
        if let Some((rx, auth)) = pending.take() {
            runtime.spawn(deliver(rx, auth));
        }
    }
}

/// Sends queued events until every sender is gone, a few at a time.
async fn deliver(mut rx: mpsc::Receiver<AuditJob>, auth: AuthClient<Channel>) {
    let permits = Arc::new(Semaphore::new(AUDIT_CONCURRENCY));
    while let Some(job) = rx.recv().await {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let mut client = auth.clone();
        tokio::spawn(async move {
            let _permit = permit;
            send(&mut client, job).await;
        });
    }
}

/// Sends one event. While auth cannot be reached (restarting, a rollout) the event is sent
/// again with backoff for as long as its signed context lives (a minute from the call), so an
/// auth restart leaves no gap in the log. A refusal from auth itself is final. An attempt whose
/// answer was lost may have been stored: a repeat then shows twice, with the same `requestId`.
async fn send(client: &mut AuthClient<Channel>, job: AuditJob) {
    let tool = job.event.tool.clone();
    let mut pause = AUDIT_RETRY_FIRST;
    loop {
        let mut request = tonic::Request::new(RecordAuditRequest {
            event: Some(job.event.clone()),
        });
        attach_caller(&mut request, &job.signed);
        request.set_timeout(AUDIT_TIMEOUT);
        let Err(status) = client.record_audit(request).await else {
            return;
        };
        let code = code_of(&status);
        let lives_until =
            job.expires_at_ms - i64::try_from(AUDIT_CONTEXT_MARGIN.as_millis()).unwrap_or(i64::MAX);
        let next_try_at =
            kg_common::caller::now_ms() + i64::try_from(pause.as_millis()).unwrap_or(i64::MAX);
        if auth_unreachable(&status) && next_try_at < lives_until {
            tracing::debug!(tool, %code, "auth unreachable: sending the audit event again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(AUDIT_RETRY_MAX);
            continue;
        }
        gateway_metrics().audit_failed.inc();
        // The status comes from auth or the transport; it never holds a token.
        tracing::warn!(
            tool,
            %code,
            message = status.message(),
            "could not record an audit event"
        );
        return;
    }
}

/// Whether auth never answered (not listening, the connection broke, no answer in time), as
/// opposed to answering with a refusal.
fn auth_unreachable(status: &tonic::Status) -> bool {
    let answered = status
        .metadata()
        .get(kg_common::error::ERROR_CODE_METADATA_KEY)
        .is_some();
    !answered
        && (matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
        ) || std::error::Error::source(status).is_some())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_proto::v1::CallerContext;

    fn caller() -> Caller {
        Caller::for_test(
            SignedCallerContext::default(),
            CallerContext {
                principal_id: "agt_1".into(),
                on_behalf_of: "usr_1".into(),
                ..Default::default()
            },
        )
    }

    fn event() -> AuditEvent {
        AuditEvent {
            tool: "kg_search".into(),
            principal_id: "forged".into(),
            ..Default::default()
        }
    }

    /// An auth client to an address nothing listens on.
    async fn dead_auth() -> AuthClient<Channel> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        AuthClient::new(kg_common::grpc::channel(&addr).unwrap())
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let sink = AuditSink::new(dead_auth().await, 2);
        let before = gateway_metrics().audit_dropped.get();
        // The worker cannot run until this task yields, so the queue holds two.
        let queued: Vec<bool> = (0..5).map(|_| sink.record(&caller(), event())).collect();
        assert_eq!(queued, [true, true, false, false, false]);
        assert!(gateway_metrics().audit_dropped.get() >= before + 3);
        assert_eq!(sink.inner.dropped.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn who_called_comes_from_the_caller_not_the_event() {
        let signed = SignedCallerContext {
            key_id: "k1".into(),
            ..Default::default()
        };
        let caller = Caller::for_test(
            signed.clone(),
            CallerContext {
                principal_id: "agt_1".into(),
                on_behalf_of: "usr_1".into(),
                ..Default::default()
            },
        );
        let job = AuditJob::new(&caller, event());
        assert_eq!(job.event.principal_id, "agt_1");
        assert_eq!(job.event.on_behalf_of, "usr_1");
        assert_eq!(job.event.request_id, "req_test");
        assert_eq!(job.event.tool, "kg_search");
        assert_eq!(job.signed, signed);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn undeliverable_events_are_counted_as_failed() {
        let sink = AuditSink::new(dead_auth().await, 4);
        let failed_before = gateway_metrics().audit_failed.get();
        assert!(sink.record(&caller(), event()));
        for _ in 0..500 {
            if gateway_metrics().audit_failed.get() > failed_before {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("an undeliverable event was not counted as failed");
    }

    #[test]
    fn transports_have_stable_names() {
        assert_eq!(Transport::Http.as_str(), "http");
        assert_eq!(Transport::Stdio.as_str(), "stdio");
    }
}
