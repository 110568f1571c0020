//! HTTPS on the gateway's own port (`[http_tls]`): connections are accepted and their TLS
//! handshakes run on tasks of their own, so a client that stalls mid-handshake holds up no
//! other; axum serves what comes out.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for axum to take them.
const READY_QUEUE: usize = 64;

/// Connections whose TLS handshake is done, for `axum::serve`.
pub(crate) struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` until `shutdown` fires, handshaking each connection with `config`.
    pub(crate) fn spawn(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
        shutdown: CancellationToken,
    ) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (ready, handshaken) = mpsc::channel(READY_QUEUE);
        let acceptor = TlsAcceptor::from(config);
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
                // See `nodelay` in lib.rs: streamed answers otherwise wait on delayed ACKs.
                if let Err(err) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %err, "TCP_NODELAY not set on an accepted connection");
                }
                let acceptor = acceptor.clone();
                let ready = ready.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = ready.send((stream, peer)).await;
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, error = %err, "TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { handshaken, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The accept loop stopped (shutdown): no connection will come again.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
