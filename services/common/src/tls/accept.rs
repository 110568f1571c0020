//! What every TLS listener of kgmesh shares (the services' gRPC ports, the gateway's HTTPS):
//! handshakes on tasks of their own, with whichever certificate is current when a connection
//! arrives, and certificate files watched for renewals.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::TlsError;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const READY_QUEUE: usize = 64;

/// Requests to reload, counted ([`reload_now`]). A watch rather than a notification: a
/// request made while a watch is busy reloading is seen when it next waits, not lost.
static RELOAD_REQUESTS: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::Sender::new(0));

/// Reloads every certificate this process watches at once, changed or not (`kgmesh serve` on
/// SIGHUP, as a systemd `reload` sends it), instead of at the next check.
pub fn reload_now() {
    RELOAD_REQUESTS.send_modify(|requests| *requests = requests.wrapping_add(1));
}

/// Connections whose TLS handshake is done, in the order they finished.
pub struct HandshakenConnections {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl HandshakenConnections {
    /// The next connection; `None` once the accept loop has stopped (shutdown).
    pub async fn recv(&mut self) -> Option<(TlsStream<TcpStream>, SocketAddr)> {
        self.handshaken.recv().await
    }
}

/// Accepts on `listener` until `shutdown` fires, with TCP_NODELAY (a reply written in pieces
/// otherwise waits on the peer's delayed ACK), and handshakes each connection on a task of its
/// own with the acceptor `current` gives at that moment, so a client that stalls mid-handshake
/// holds up no other and a reloaded certificate serves the next connection. Needs a tokio
/// runtime.
/// `certificate` names what is served (`cluster`, `http`) in the metric and log of failed
/// handshakes.
pub fn accept_tls<F>(
    listener: TcpListener,
    current: F,
    certificate: &'static str,
    shutdown: CancellationToken,
) -> HandshakenConnections
where
    F: Fn() -> TlsAcceptor + Send + 'static,
{
    let (ready, handshaken) = mpsc::channel(READY_QUEUE);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    // Out of file descriptors and the like: wait, as axum's own loop does.
                    Err(err) => {
                        tracing::debug!(error = %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            if let Err(err) = tcp.set_nodelay(true) {
                tracing::debug!(error = %err, "TCP_NODELAY not set on an accepted connection");
            }
            let acceptor = current();
            let ready = ready.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = ready.send((stream, peer)).await;
                    }
                    Ok(Err(err)) => handshake_failed(certificate, peer, &err.to_string()),
                    Err(_) => handshake_failed(certificate, peer, "timed out"),
                }
            });
        }
    });
    HandshakenConnections { handshaken }
}

/// Unix seconds of the last failed handshake logged at WARN, process-wide.
static LAST_HANDSHAKE_WARNING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts a failed handshake and logs it: at WARN at most once a minute (a mis-issued
/// certificate is then seen on the server too, while a scanner cannot flood the log), else
/// at debug.
fn handshake_failed(certificate: &'static str, peer: SocketAddr, error: &str) {
    use std::sync::atomic::Ordering;
    crate::metrics::metrics()
        .tls_handshakes_failed
        .get_or_create(&crate::metrics::CertificateLabels {
            certificate: certificate.to_owned(),
        })
        .inc();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_HANDSHAKE_WARNING.load(Ordering::Relaxed);
    if now >= last + 60
        && LAST_HANDSHAKE_WARNING
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            %peer,
            certificate,
            error,
            "TLS handshake failed (at most one such line a minute; \
             kgmesh_tls_handshakes_failed_total counts them all)"
        );
    } else {
        tracing::debug!(%peer, certificate, error, "TLS handshake failed");
    }
}

/// When and how large each file is (following symlinks, as a Kubernetes Secret volume's
/// are): a change means a renewal. `None` while one is missing.
fn stamp(paths: &[PathBuf]) -> Option<Vec<(SystemTime, u64)>> {
    let of = |path: &Path| {
        let meta = std::fs::metadata(path).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    };
    paths.iter().map(|path| of(path)).collect()
}

/// Checks `paths` every `every` until `shutdown`, and calls `reload` after each change and at
/// each [`reload_now`]. A change that does not load (a key written before its certificate, say) keeps what was in
/// use, is logged as `what`, and is tried again at the next check.
pub async fn watch_files<R>(
    paths: Vec<PathBuf>,
    every: Duration,
    shutdown: CancellationToken,
    what: &'static str,
    reload: R,
) where
    R: Fn() -> Result<(), TlsError> + Send + 'static,
{
    let mut requests = RELOAD_REQUESTS.subscribe();
    let mut seen = stamp(&paths);
    loop {
        let asked = tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => false,
            // The sender is a static: this never fails.
            Ok(()) = requests.changed() => true,
        };
        let now = stamp(&paths);
        if now == seen && !asked {
            continue;
        }
        match reload() {
            Ok(()) => {
                seen = now;
                let why = if asked {
                    "on request"
                } else {
                    "after its files changed"
                };
                tracing::info!("reloaded {what} {why}");
            }
            Err(err) => {
                tracing::warn!(error = %err, "{what} changed but does not load; keeping the one in use");
            }
        }
    }
}

/// Handshaken connections as a `Stream`, for servers that take one (tonic).
impl futures::Stream for HandshakenConnections {
    type Item = (TlsStream<TcpStream>, SocketAddr);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().handshaken.poll_recv(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn files_are_reloaded_when_they_change_and_when_asked_and_a_failure_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tls.crt");
        std::fs::write(&file, "first").unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let fails = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let shutdown = CancellationToken::new();
        let (counted, failing) = (calls.clone(), fails.clone());
        let every = Duration::from_millis(20);
        tokio::spawn(watch_files(
            vec![file.clone()],
            every,
            shutdown.clone(),
            "a test certificate",
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                if failing.load(Ordering::SeqCst) {
                    return Err(TlsError::AlreadyInstalled);
                }
                Ok(())
            },
        ));
        let until = |wanted: usize| {
            let calls = calls.clone();
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while calls.load(Ordering::SeqCst) < wanted {
                    assert!(tokio::time::Instant::now() < deadline, "no reload");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };

        // Unchanged files are not reloaded.
        tokio::time::sleep(every * 5).await;
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // A change is.
        std::fs::write(&file, "second, longer").unwrap();
        until(1).await;
        tokio::time::sleep(every * 5).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "one change, one reload");
        // Asked, unchanged files are reloaded too (the watch may be between checks: ask again).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while calls.load(Ordering::SeqCst) < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "reload_now was not heard"
            );
            reload_now();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A change that does not load is tried again at each check until it does.
        fails.store(true, Ordering::SeqCst);
        std::fs::write(&file, "third, broken halfway").unwrap();
        let before = calls.load(Ordering::SeqCst);
        until(before + 3).await;
        fails.store(false, Ordering::SeqCst);
        let settled = calls.load(Ordering::SeqCst) + 1;
        until(settled).await;
        tokio::time::sleep(every * 5).await;
        assert!(
            calls.load(Ordering::SeqCst) <= settled + 1,
            "retried after it loaded"
        );
        shutdown.cancel();
    }
}
