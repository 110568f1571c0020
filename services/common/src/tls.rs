//! Mutual TLS between kgmesh's own services (`kgmesh serve`, `[cluster.tls]`): one private CA
//! issues every process a certificate. A server accepts only clients showing a certificate from
//! that CA; a client checks the server's certificate against the CA and the name it dialled,
//! and shows its own. The setting belongs to the process, not to a call site: it is installed
//! once at start, before any server listens or channel connects, and [`crate::grpc`] applies
//! it to every server and to every `https://` channel.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use serde::Deserialize;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

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

/// Why the service certificates cannot be used; each names the setting to change.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cluster.tls.{key}: cannot read {}: {reason}", path.display())]
    Read {
        /// The setting naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// A file's content is not what the setting needs.
    #[error("cluster.tls.{key}: {} {problem}", path.display())]
    Invalid {
        /// The setting naming the file.
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

/// A process's TLS settings for serving and for calling other services.
#[derive(Debug, Clone)]
pub struct ClusterTls {
    pub(crate) server: ServerTlsConfig,
    pub(crate) client: ClientTlsConfig,
}

impl ClusterTls {
    /// Reads and checks the three files: each parses, the key belongs to the certificate, and
    /// the certificate is issued by the CA, valid now, and usable by a client (every service
    /// is one). A certificate's host names are checked by the peers that dial it.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        // tonic builds its rustls configs from the process's default provider, which rustls
        // cannot pick on its own here: reqwest's aws-lc-rs is linked in beside ring. An
        // `Err` means a provider is already the default, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca_pem = read("ca_file", &files.ca_file)?;
        let cert_pem = read("cert_file", &files.cert_file)?;
        let key_pem = read("key_file", &files.key_file)?;
        check(files, &ca_pem, &cert_pem, &key_pem)?;
        let identity = Identity::from_pem(&cert_pem, &key_pem);
        let ca = Certificate::from_pem(&ca_pem);
        Ok(Self {
            server: ServerTlsConfig::new()
                .identity(identity.clone())
                .client_ca_root(ca.clone()),
            client: ClientTlsConfig::new().ca_certificate(ca).identity(identity),
        })
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

fn check(files: &TlsFiles, ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
    let invalid = |key: &'static str, path: &Path, problem: String| TlsError::Invalid {
        key,
        path: path.to_owned(),
        problem,
    };
    let certificates = |key: &'static str, path: &Path, pem: &[u8]| {
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
    };
    let authorities = certificates("ca_file", &files.ca_file, ca_pem)?;
    let chain = certificates("cert_file", &files.cert_file, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| {
        invalid(
            "key_file",
            &files.key_file,
            "holds no PEM private key (PKCS#8, PKCS#1 or SEC1)".to_owned(),
        )
    })?;

    let mut roots = rustls::RootCertStore::empty();
    for authority in authorities {
        roots.add(authority).map_err(|err| {
            invalid(
                "ca_file",
                &files.ca_file,
                format!("holds a certificate that cannot be a trust anchor: {err}"),
            )
        })?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let signing_key = provider.key_provider.load_private_key(key).map_err(|err| {
        invalid(
            "key_file",
            &files.key_file,
            format!("holds a key TLS cannot sign with: {err}"),
        )
    })?;
    rustls::sign::CertifiedKey::new(chain.clone(), signing_key)
        .keys_match()
        .map_err(|_| {
            invalid(
                "key_file",
                &files.key_file,
                format!(
                    "is not the key of the certificate in {}",
                    files.cert_file.display()
                ),
            )
        })?;
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|err| {
                invalid(
                    "ca_file",
                    &files.ca_file,
                    format!("cannot verify peers: {err}"),
                )
            })?;
    let (end_entity, intermediates) = chain
        .split_first()
        .ok_or_else(|| invalid("cert_file", &files.cert_file, "is empty".to_owned()))?;
    verifier
        .verify_client_cert(end_entity, intermediates, UnixTime::now())
        .map_err(|err| {
            invalid(
                "cert_file",
                &files.cert_file,
                format!(
                    "would be refused by the other services: {err} (it must be issued by the CA \
                     in {}, valid now, and allowed for client authentication)",
                    files.ca_file.display()
                ),
            )
        })?;
    Ok(())
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
            let key = KeyPair::generate().unwrap();
            let mut params =
                CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                    .unwrap();
            params.extended_key_usages = usages.to_vec();
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

    /// Asserts `files` are refused, naming `setting` and saying `why`; returns the message.
    fn refused(files: &TlsFiles, setting: &str, why: &str) -> String {
        let text = ClusterTls::load(files).unwrap_err().to_string();
        assert!(
            text.starts_with(&format!("cluster.tls.{setting}:")) && text.contains(why),
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
            "ca_file",
            "cannot read",
        );
        refused(
            &with(|files, other| {
                files.cert_file = other.cert_file.clone();
                files.key_file = other.key_file.clone();
            }),
            "cert_file",
            "issued by the CA",
        );
        refused(
            &with(|files, other| files.key_file = other.key_file.clone()),
            "key_file",
            "is not the key of",
        );
        let (cert, key) = ca.leaf(&["localhost"], &[ExtendedKeyUsagePurpose::ServerAuth]);
        refused(
            &write(dir.path(), "server-only", &ca.pem, &cert, &key),
            "cert_file",
            "allowed for client authentication",
        );
        refused(
            &write(dir.path(), "not-pem", "hello", "hello", "hello"),
            "ca_file",
            "holds no `BEGIN CERTIFICATE` block",
        );
        refused(
            &write(dir.path(), "no-key", &ca.pem, &cert, &ca.pem),
            "key_file",
            "holds no PEM private key",
        );
    }
}
