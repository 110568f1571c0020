//! Mutual TLS between kgmesh's own services (`kgmesh serve`, `[cluster.tls]`): one private CA
//! issues every process a certificate. A server accepts only clients showing a certificate from
//! that CA; a client checks the server's certificate against the CA and the name it dialled,
//! and shows its own. The setting belongs to the process, not to a call site: it is installed
//! once at start, before any server listens or channel connects, and [`crate::grpc`] applies
//! it to every server and to every `https://` channel.
//!
//! Certificates follow their files: a renewal (cert-manager writes a new Secret version every
//! few weeks, a CA rotation included) is picked up within [`RELOAD_EVERY`] without a restart.
//! New handshakes then use it on both sides; connections already open keep the certificate they
//! were made with, which stays valid until it expires.

mod accept;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

pub use accept::{HandshakenConnections, accept_tls, reload_now, watch_files};

/// How often certificate files are checked for a renewal.
pub const RELOAD_EVERY: Duration = Duration::from_secs(30);

/// `[cluster.tls]`: PEM files, as a cert-manager Secret holds them (`ca.crt`, `tls.crt`,
/// `tls.key`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The CA that issues every service's certificate; peers are trusted by it alone.
    pub ca_file: PathBuf,
    /// This process's certificate (then any intermediates). Its names must cover the host
    /// names other services dial it by, and it must be usable by a client as well as a server.
    pub cert_file: PathBuf,
    /// The private key of `cert_file`.
    pub key_file: PathBuf,
}

impl TlsFiles {
    fn paths(&self) -> Vec<PathBuf> {
        vec![
            self.ca_file.clone(),
            self.cert_file.clone(),
            self.key_file.clone(),
        ]
    }
}

/// Why the service certificates cannot be used; each names the setting to change.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{key}: cannot read {}: {reason}", path.display())]
    Read {
        /// The setting naming the file (`cluster.tls.ca_file`).
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// A file's content is not what the setting needs.
    #[error("{key}: {} {problem}", path.display())]
    Invalid {
        /// The setting naming the file (`cluster.tls.ca_file`).
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// TLS was already installed in this process.
    #[error("TLS between services is already set up in this process")]
    AlreadyInstalled,
}

/// A process's certificates for serving and for calling other services, as last loaded from
/// their files. Cheap to clone; every clone sees a reload.
#[derive(Clone)]
pub struct ClusterTls {
    files: Arc<TlsFiles>,
    current: Arc<watch::Sender<Arc<ClusterCertificates>>>,
}

/// One loaded generation of the certificates.
pub(crate) struct ClusterCertificates {
    /// Handshakes accepted connections: this certificate, and a client certificate from the
    /// CA required.
    pub(crate) acceptor: TlsAcceptor,
    /// For dialling: the CA to check servers by, and this certificate to show them.
    pub(crate) client: ClientTlsConfig,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ClusterTls {
    /// Reads and checks the three files: each parses, the key belongs to the certificate, and
    /// the certificate is issued by the CA, valid now, and usable by a client (every service
    /// is one). A certificate's host names are checked by the peers that dial it.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let loaded = ClusterCertificates::load(files)?;
        Ok(Self {
            files: Arc::new(files.clone()),
            current: Arc::new(watch::Sender::new(Arc::new(loaded))),
        })
    }

    /// Reads the files again and, when they load, makes them the certificates of every new
    /// handshake, served or dialled. When they do not (a key written before its certificate,
    /// say), the certificates in use stay and the error says why.
    pub fn reload(&self) -> Result<(), TlsError> {
        let loaded = ClusterCertificates::load(&self.files)?;
        self.current.send_replace(Arc::new(loaded));
        Ok(())
    }

    /// Reloads whenever the files change, checking every `every` until `shutdown`. Needs a
    /// tokio runtime.
    pub fn spawn_reload(&self, every: Duration, shutdown: CancellationToken) {
        let tls = self.clone();
        tokio::spawn(watch_files(
            self.files.paths(),
            every,
            shutdown,
            "the service certificate (cluster.tls)",
            move || tls.reload(),
        ));
    }

    /// The acceptor for a connection arriving now.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        self.current.borrow().acceptor.clone()
    }

    /// The client settings for a connection dialled now.
    pub(crate) fn client(&self) -> ClientTlsConfig {
        self.current.borrow().client.clone()
    }

    /// Notified at each reload.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<ClusterCertificates>> {
        self.current.subscribe()
    }

    /// These server certificates with `client` for dialling (tests: a peer without a
    /// certificate, or with a foreign one).
    #[cfg(test)]
    pub(crate) fn with_client(&self, client: ClientTlsConfig) -> Self {
        let acceptor = self.acceptor();
        Self {
            files: self.files.clone(),
            current: Arc::new(watch::Sender::new(Arc::new(ClusterCertificates {
                acceptor,
                client,
            }))),
        }
    }
}

impl ClusterCertificates {
    fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        // tonic builds its client configs from the process's default provider, which rustls
        // cannot pick on its own here: reqwest's aws-lc-rs is linked in beside ring. An
        // `Err` means a provider is already the default, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca_pem = read("cluster.tls.ca_file", &files.ca_file)?;
        let (server, expires_at) = server_config(files, &ca_pem)?;
        let cert_pem = read("cluster.tls.cert_file", &files.cert_file)?;
        let key_pem = read("cluster.tls.key_file", &files.key_file)?;
        let loaded = Self {
            acceptor: TlsAcceptor::from(server),
            client: ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&ca_pem))
                .identity(Identity::from_pem(&cert_pem, &key_pem)),
        };
        record_expiry("cluster", expires_at);
        Ok(loaded)
    }
}

/// When the first certificate of `chain` (the leaf) expires, in Unix seconds.
fn expires_at(chain: &[CertificateDer<'_>]) -> Option<i64> {
    let (_, leaf) = x509_parser::parse_x509_certificate(chain.first()?.as_ref()).ok()?;
    Some(leaf.validity().not_after.timestamp())
}

/// Whether the leaf of `chain` is valid now: every client would refuse it otherwise, so a
/// renewal that is not is not taken, and `--check` refuses it.
fn valid_now(chain: &[CertificateDer<'_>]) -> Result<(), String> {
    let Some(leaf) = chain.first() else {
        return Err("holds no certificate".to_owned());
    };
    let (_, leaf) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|err| format!("holds a certificate that does not parse: {err}"))?;
    let validity = leaf.validity();
    let now = x509_parser::time::ASN1Time::now();
    if now > validity.not_after {
        return Err(format!(
            "holds a certificate that expired on {}: renew it",
            validity.not_after
        ));
    }
    if now < validity.not_before {
        return Err(format!(
            "holds a certificate not valid before {}",
            validity.not_before
        ));
    }
    Ok(())
}

/// Exports when the certificate now in use as `which` expires.
fn record_expiry(which: &str, expires_at: Option<i64>) {
    if let Some(at) = expires_at {
        crate::metrics::metrics()
            .tls_certificate_expiry
            .get_or_create(&crate::metrics::CertificateLabels {
                certificate: which.to_owned(),
            })
            .set(at);
    }
}

static INSTALLED: OnceLock<ClusterTls> = OnceLock::new();

/// Makes `tls` this process's: every gRPC server it starts from now on requires it, and every
/// `https://` channel uses it. Once per process.
pub fn install(tls: ClusterTls) -> Result<(), TlsError> {
    INSTALLED.set(tls).map_err(|_| TlsError::AlreadyInstalled)
}

/// The process's TLS settings, when [`install`] ran.
pub(crate) fn installed() -> Option<&'static ClusterTls> {
    INSTALLED.get()
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|err| TlsError::Read {
        key,
        path: path.to_owned(),
        reason: err.kind().to_string(),
    })
}

fn invalid(key: &'static str, path: &Path, problem: String) -> TlsError {
    TlsError::Invalid {
        key,
        path: path.to_owned(),
        problem,
    }
}

/// The certificates of a PEM file named by setting `key`; at least one.
fn certificates(
    key: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let found = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| invalid(key, path, format!("is not PEM: {err}")))?;
    if found.is_empty() {
        return Err(invalid(
            key,
            path,
            "holds no `BEGIN CERTIFICATE` block".to_owned(),
        ));
    }
    Ok(found)
}

/// A certificate chain with its private key, checked to belong together.
struct KeyedChain {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

/// Reads the chain in `cert` and its key in `key` (setting name, path), checking that the key
/// parses, can sign, and is the chain's.
fn keyed_chain(
    provider: &rustls::crypto::CryptoProvider,
    cert: (&'static str, &Path),
    key: (&'static str, &Path),
) -> Result<KeyedChain, TlsError> {
    let chain = certificates(cert.0, cert.1, &read(cert.0, cert.1)?)?;
    let private_key = PrivateKeyDer::from_pem_slice(&read(key.0, key.1)?).map_err(|_| {
        invalid(
            key.0,
            key.1,
            "holds no PEM private key (PKCS#8, PKCS#1 or SEC1)".to_owned(),
        )
    })?;
    let signing_key = provider
        .key_provider
        .load_private_key(private_key.clone_key())
        .map_err(|err| {
            invalid(
                key.0,
                key.1,
                format!("holds a key TLS cannot sign with: {err}"),
            )
        })?;
    rustls::sign::CertifiedKey::new(chain.clone(), signing_key)
        .keys_match()
        .map_err(|_| {
            invalid(
                key.0,
                key.1,
                format!("is not the key of the certificate in {}", cert.1.display()),
            )
        })?;
    Ok(KeyedChain {
        chain,
        key: private_key,
    })
}

/// The server side of the service certificates, checked: HTTP/2 by ALPN (tonic's clients
/// require it), and a client certificate from the CA required of every peer. With it, when the
/// certificate expires.
fn server_config(
    files: &TlsFiles,
    ca_pem: &[u8],
) -> Result<(Arc<rustls::ServerConfig>, Option<i64>), TlsError> {
    let authorities = certificates("cluster.tls.ca_file", &files.ca_file, ca_pem)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let KeyedChain { chain, key } = keyed_chain(
        &provider,
        ("cluster.tls.cert_file", &files.cert_file),
        ("cluster.tls.key_file", &files.key_file),
    )?;
    let mut roots = rustls::RootCertStore::empty();
    for authority in authorities {
        roots.add(authority).map_err(|err| {
            invalid(
                "cluster.tls.ca_file",
                &files.ca_file,
                format!("holds a certificate that cannot be a trust anchor: {err}"),
            )
        })?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|err| {
        invalid(
            "cluster.tls.ca_file",
            &files.ca_file,
            format!("cannot verify peers: {err}"),
        )
    })?;
    let (end_entity, intermediates) = chain.split_first().ok_or_else(|| {
        invalid(
            "cluster.tls.cert_file",
            &files.cert_file,
            "is empty".to_owned(),
        )
    })?;
    let expires = expires_at(&chain);
    verifier
        .verify_client_cert(end_entity, intermediates, UnixTime::now())
        .map_err(|err| {
            invalid(
                "cluster.tls.cert_file",
                &files.cert_file,
                format!(
                    "would be refused by the other services: {err} (it must be issued by the CA \
                     in {}, valid now, and allowed for client authentication)",
                    files.ca_file.display()
                ),
            )
        })?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|builder| {
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)
        })
        .map_err(|err| {
            invalid(
                "cluster.tls.cert_file",
                &files.cert_file,
                format!("cannot serve TLS: {err}"),
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok((Arc::new(config), expires))
}

/// `[http_tls]`: the certificate the gateway serves HTTPS with on `http_addr` (PEM; the chain
/// from the leaf up, as an ACME client or cert-manager writes it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpsFiles {
    /// The certificate chain.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
}

/// A rustls server config for HTTPS from `files`: HTTP/2 or HTTP/1.1 by ALPN, no client
/// certificates (clients authenticate with bearer tokens). Every problem names its setting.
/// The certificate's expiry is exported (`kgmesh_tls_certificate_expiry_timestamp_seconds`).
pub fn https_server_config(files: &HttpsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let KeyedChain { chain, key } = keyed_chain(
        &provider,
        ("http_tls.cert_file", &files.cert_file),
        ("http_tls.key_file", &files.key_file),
    )?;
    let expires = expires_at(&chain);
    valid_now(&chain)
        .map_err(|problem| invalid("http_tls.cert_file", &files.cert_file, problem))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|err| {
            invalid(
                "http_tls.cert_file",
                &files.cert_file,
                format!("cannot serve TLS: {err}"),
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    record_expiry("http", expires);
    Ok(Arc::new(config))
}

/// Certificates for tests: a CA and leaf certificates it issues.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod testing {
    use std::path::Path;

    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };

    use super::TlsFiles;

    /// A private CA.
    pub(crate) struct Authority {
        pub(crate) pem: String,
        issuer: Issuer<'static, KeyPair>,
    }

    impl Authority {
        pub(crate) fn new(name: &str) -> Self {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            let pem = params.self_signed(&key).unwrap().pem();
            Self {
                pem,
                issuer: Issuer::new(params, key),
            }
        }

        /// A leaf for `names` with the usages given, as PEM certificate and key.
        pub(crate) fn leaf(
            &self,
            names: &[&str],
            usages: &[ExtendedKeyUsagePurpose],
        ) -> (String, String) {
            self.leaf_until(names, usages, None)
        }

        /// [`Self::leaf`] valid until the start of `year` (rcgen's default: 4096).
        pub(crate) fn leaf_until(
            &self,
            names: &[&str],
            usages: &[ExtendedKeyUsagePurpose],
            year: Option<i32>,
        ) -> (String, String) {
            let key = KeyPair::generate().unwrap();
            let mut params =
                CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                    .unwrap();
            params.extended_key_usages = usages.to_vec();
            if let Some(year) = year {
                params.not_after = rcgen::date_time_ymd(year, 1, 1);
            }
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        }

        /// A service leaf (server and client use) for `localhost` and 127.0.0.1, written
        /// under `dir` with this CA.
        pub(crate) fn service_files(&self, dir: &Path, stem: &str) -> TlsFiles {
            let (cert, key) = self.leaf(
                &["localhost", "127.0.0.1"],
                &[
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ],
            );
            write(dir, stem, &self.pem, &cert, &key)
        }
    }

    pub(crate) fn write(dir: &Path, stem: &str, ca: &str, cert: &str, key: &str) -> TlsFiles {
        let files = TlsFiles {
            ca_file: dir.join(format!("{stem}-ca.crt")),
            cert_file: dir.join(format!("{stem}.crt")),
            key_file: dir.join(format!("{stem}.key")),
        };
        std::fs::write(&files.ca_file, ca).unwrap();
        std::fs::write(&files.cert_file, cert).unwrap();
        std::fs::write(&files.key_file, key).unwrap();
        files
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use rcgen::ExtendedKeyUsagePurpose;

    use super::testing::{Authority, write};
    use super::*;

    #[test]
    fn an_https_certificate_loads_with_h2_and_its_problems_name_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::new("public CA");
        let service = ca.service_files(dir.path(), "gateway");
        let files = HttpsFiles {
            cert_file: service.cert_file.clone(),
            key_file: service.key_file.clone(),
        };
        let config = https_server_config(&files).unwrap();
        assert_eq!(
            config.alpn_protocols,
            [b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        let other = Authority::new("other").service_files(dir.path(), "other");
        let mismatched = HttpsFiles {
            key_file: other.key_file,
            ..files.clone()
        };
        let text = https_server_config(&mismatched).unwrap_err().to_string();
        assert!(
            text.starts_with("http_tls.key_file:") && text.contains("is not the key of"),
            "{text}"
        );
        let missing = HttpsFiles {
            cert_file: dir.path().join("absent.pem"),
            ..files
        };
        let text = https_server_config(&missing).unwrap_err().to_string();
        assert!(text.starts_with("http_tls.cert_file: "), "{text}");
        // An expired certificate every client would refuse is not served (nor taken as a
        // renewal, which loads through here too).
        let (cert, key) = ca.leaf_until(
            &["localhost"],
            &[rcgen::ExtendedKeyUsagePurpose::ServerAuth],
            Some(2001),
        );
        let expired = write(dir.path(), "expired", &ca.pem, &cert, &key);
        let text = https_server_config(&HttpsFiles {
            cert_file: expired.cert_file,
            key_file: expired.key_file,
        })
        .unwrap_err()
        .to_string();
        assert!(
            text.starts_with("http_tls.cert_file: ") && text.contains("expired on"),
            "{text}"
        );
    }

    #[test]
    fn the_expiry_of_the_certificate_in_use_is_exported() {
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::new("kgmesh services");
        let (cert, key) = ca.leaf_until(&["localhost"], &[ServerAuth, ClientAuth], Some(2030));
        let files = write(dir.path(), "expiring", &ca.pem, &cert, &key);
        let chain =
            certificates("cluster.tls.cert_file", &files.cert_file, cert.as_bytes()).unwrap();
        // 2030-01-01T00:00:00Z.
        assert_eq!(expires_at(&chain), Some(1_893_456_000));
        ClusterTls::load(&files).unwrap();
        https_server_config(&HttpsFiles {
            cert_file: files.cert_file.clone(),
            key_file: files.key_file.clone(),
        })
        .unwrap();
        let exported = crate::metrics::encode_text();
        for which in ["cluster", "http"] {
            // The value is this test's unless another test in the process loaded one since.
            let line = format!(
                "kgmesh_tls_certificate_expiry_timestamp_seconds{{certificate=\"{which}\"}} "
            );
            assert!(
                exported.contains(&line),
                "{which} not exported:\n{exported}"
            );
        }
        assert!(expires_at(&[]).is_none());
    }

    /// Asserts `files` are refused, naming `setting` and saying `why`; returns the message.
    fn refused(files: &TlsFiles, setting: &str, why: &str) -> String {
        let text = ClusterTls::load(files).unwrap_err().to_string();
        assert!(
            text.starts_with(&format!("{setting}:")) && text.contains(why),
            "{text}"
        );
        // No key or certificate material in any message.
        assert!(!text.contains("-----BEGIN"), "{text}");
        text
    }

    #[test]
    fn certificates_a_peer_would_refuse_are_refused_at_load_with_the_setting_to_change() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::new("kgmesh services");
        let good = ca.service_files(dir.path(), "good");
        ClusterTls::load(&good).unwrap();
        let foreign = Authority::new("someone else").service_files(dir.path(), "foreign");
        let with = |change: fn(&mut TlsFiles, &TlsFiles)| {
            let mut files = good.clone();
            change(&mut files, &foreign);
            files
        };

        refused(
            &with(|files, _| files.ca_file = files.ca_file.with_file_name("absent.crt")),
            "cluster.tls.ca_file",
            "cannot read",
        );
        refused(
            &with(|files, other| {
                files.cert_file = other.cert_file.clone();
                files.key_file = other.key_file.clone();
            }),
            "cluster.tls.cert_file",
            "issued by the CA",
        );
        refused(
            &with(|files, other| files.key_file = other.key_file.clone()),
            "cluster.tls.key_file",
            "is not the key of",
        );
        let (cert, key) = ca.leaf(&["localhost"], &[ExtendedKeyUsagePurpose::ServerAuth]);
        refused(
            &write(dir.path(), "server-only", &ca.pem, &cert, &key),
            "cluster.tls.cert_file",
            "allowed for client authentication",
        );
        refused(
            &write(dir.path(), "not-pem", "hello", "hello", "hello"),
            "cluster.tls.ca_file",
            "holds no `BEGIN CERTIFICATE` block",
        );
        refused(
            &write(dir.path(), "no-key", &ca.pem, &cert, &ca.pem),
            "cluster.tls.key_file",
            "holds no PEM private key",
        );
    }
}
