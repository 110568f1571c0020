//! HTTPS on the gateway's own port (`[http_tls]`): connections are accepted and their TLS
//! handshakes run on tasks of their own, so a client that stalls mid-handshake holds up no
//! other ([`kg_common::tls::accept_tls`]); axum serves what comes out. A renewed certificate
//! (certbot, cert-manager, a Secret's new version) is picked up without a restart: the files
//! are checked every [`RELOAD_EVERY`], and new handshakes use the new certificate once it
//! loads.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kg_common::tls::{HandshakenConnections, HttpsFiles, RELOAD_EVERY};

use crate::error::GatewayError;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// Connections whose TLS handshake is done, for `axum::serve`.
pub(crate) struct TlsListener {
    handshaken: HandshakenConnections,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` until `shutdown` fires, handshaking each connection with the
    /// certificate in `files` (reloaded when the files change).
    pub(crate) fn spawn(
        listener: TcpListener,
        files: &HttpsFiles,
        shutdown: CancellationToken,
    ) -> Result<Self, GatewayError> {
        Self::spawn_reloading(listener, files, RELOAD_EVERY, shutdown)
    }

    fn spawn_reloading(
        listener: TcpListener,
        files: &HttpsFiles,
        every: Duration,
        shutdown: CancellationToken,
    ) -> Result<Self, GatewayError> {
        let config = kg_common::tls::https_server_config(files)
            .map_err(|err| GatewayError::Config(err.to_string()))?;
        let acceptor = Arc::new(RwLock::new(TlsAcceptor::from(config)));
        let local = listener.local_addr().map_err(GatewayError::Serve)?;
        let renewed = acceptor.clone();
        let watched = files.clone();
        tokio::spawn(kg_common::tls::watch_files(
            vec![files.cert_file.clone(), files.key_file.clone()],
            every,
            shutdown.clone(),
            "the HTTPS certificate (http_tls)",
            move || {
                let fresh = TlsAcceptor::from(kg_common::tls::https_server_config(&watched)?);
                match renewed.write() {
                    Ok(mut current) => *current = fresh,
                    Err(poisoned) => *poisoned.into_inner() = fresh,
                }
                Ok(())
            },
        ));
        // See `nodelay` in lib.rs: streamed answers otherwise wait on delayed ACKs; the accept
        // loop sets it on every connection.
        let handshaken = kg_common::tls::accept_tls(
            listener,
            move || match acceptor.read() {
                Ok(current) => current.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            },
            "http",
            shutdown,
        );
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::ServerName;

    use super::*;

    /// A CA's PEM and a `localhost` certificate and key it issued.
    fn issued(name: &str) -> (String, String, String) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, name);
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (ca_pem, cert.pem(), key.serialize_pem())
    }

    /// Whether a client trusting only `ca_pem` completes a handshake with `addr`.
    async fn handshake(addr: SocketAddr, ca_pem: &str) -> bool {
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await.unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_renewed_certificate_serves_new_handshakes_and_a_broken_one_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let files = HttpsFiles {
            cert_file: dir.path().join("fullchain.pem"),
            key_file: dir.path().join("privkey.pem"),
        };
        let write = |cert: &str, key: &str| {
            std::fs::write(&files.cert_file, cert).unwrap();
            std::fs::write(&files.key_file, key).unwrap();
        };
        let (first_ca, cert, key) = issued("first");
        write(&cert, &key);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let shutdown = CancellationToken::new();
        let every = Duration::from_millis(50);
        let served =
            TlsListener::spawn_reloading(listener, &files, every, shutdown.clone()).unwrap();
        let addr = served.local;
        assert!(handshake(addr, &first_ca).await);

        let (second_ca, cert, key) = issued("second");
        write(&cert, &key);
        // Polled rather than slept on: a loaded machine may run the reload late.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !handshake(addr, &second_ca).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the renewal was not picked up"
            );
            tokio::time::sleep(every).await;
        }
        assert!(!handshake(addr, &first_ca).await);

        // A key that is not the certificate's: the renewed certificate keeps serving.
        let (_, _, stray_key) = issued("stray");
        write(&cert, &stray_key);
        tokio::time::sleep(every * 6).await;
        assert!(handshake(addr, &second_ca).await);
        shutdown.cancel();
    }
}
