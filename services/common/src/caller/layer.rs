//! The tower layer that verifies the caller context before a handler runs.

use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use futures::future::BoxFuture;
use kg_proto::v1::SignedCallerContext;
use prost::Message as _;

use super::{CALLER_METADATA_KEY, CallerError, ContextVerifier, VerifiedCaller, now_ms};

/// gRPC binary metadata is base64, with or without padding depending on the sender.
const BINARY_METADATA: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Verifies `x-kg-caller-bin` on every request except the exempt method paths
/// (the health service, and auth's token-authenticated entry points).
#[derive(Clone)]
pub struct CallerContextLayer {
    verifier: ContextVerifier,
    exempt_paths: Arc<[String]>,
}

impl CallerContextLayer {
    /// A layer that trusts `verifier` and lets `exempt_paths` (exact gRPC paths,
    /// or prefixes ending in `/`) through without a context.
    pub fn new(verifier: ContextVerifier, exempt_paths: &[&str]) -> Self {
        let mut paths: Vec<String> = exempt_paths.iter().map(|p| (*p).to_owned()).collect();
        paths.push("/grpc.health.v1.Health/".to_owned());
        Self {
            verifier,
            exempt_paths: paths.into(),
        }
    }

    fn is_exempt(&self, path: &str) -> bool {
        self.exempt_paths.iter().any(|p| {
            if p.ends_with('/') {
                path.starts_with(p.as_str())
            } else {
                path == p
            }
        })
    }
}

impl<S> tower::Layer<S> for CallerContextLayer {
    type Service = CallerContextService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallerContextService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`CallerContextLayer`] wraps around a gRPC router.
#[derive(Clone)]
pub struct CallerContextService<S> {
    inner: S,
    layer: CallerContextLayer,
}

fn verify_headers(
    verifier: &ContextVerifier,
    headers: &http::HeaderMap,
) -> Result<VerifiedCaller, CallerError> {
    let raw = headers
        .get(CALLER_METADATA_KEY)
        .ok_or(CallerError::Missing)?;
    let bytes = BINARY_METADATA
        .decode(raw.as_bytes())
        .map_err(|_| CallerError::Malformed)?;
    let signed =
        SignedCallerContext::decode(bytes.as_slice()).map_err(|_| CallerError::Malformed)?;
    let context = verifier.verify(&signed, now_ms())?;
    Ok(VerifiedCaller(Arc::new(context)))
}

impl<S, ReqBody> tower::Service<http::Request<ReqBody>> for CallerContextService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        if self.layer.is_exempt(request.uri().path()) {
            return Box::pin(self.inner.call(request));
        }
        match verify_headers(&self.layer.verifier, request.headers()) {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
                Box::pin(self.inner.call(request))
            }
            Err(err) => {
                tracing::debug!(path = %request.uri().path(), error = %err, "caller context refused");
                let status = crate::error::to_status(&err);
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use kg_proto::v1::CallerContext;
    use tower::{Layer as _, Service as _, ServiceExt as _};

    use super::*;
    use crate::caller::{CONTEXT_TTL_MS, ContextSigner};

    fn request_with(header: Option<String>, path: &str) -> http::Request<()> {
        let mut builder = http::Request::builder().uri(format!("http://svc{path}"));
        if let Some(h) = header {
            builder = builder.header(CALLER_METADATA_KEY, h);
        }
        builder.body(()).unwrap()
    }

    #[tokio::test]
    async fn inner_service_never_sees_a_forged_missing_or_expired_context() {
        let signer = ContextSigner::generate();
        let verifier = ContextVerifier::new(vec![signer.public_key()]);
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let inner = tower::service_fn(move |req: http::Request<()>| {
            let counter = counter.clone();
            async move {
                assert!(
                    req.extensions().get::<VerifiedCaller>().is_some()
                        || req.uri().path().starts_with("/grpc.health")
                );
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>(http::Response::new(tonic::body::Body::empty()))
            }
        });
        let mut svc = CallerContextLayer::new(verifier, &[]).layer(inner);
        let encode = |signed: &SignedCallerContext| BINARY_METADATA.encode(signed.encode_to_vec());
        let now = now_ms();
        let good = signer.sign(&CallerContext {
            issued_at_ms: now,
            expires_at_ms: now + CONTEXT_TTL_MS,
            ..Default::default()
        });
        let expired = signer.sign(&CallerContext {
            issued_at_ms: now - 120_000,
            expires_at_ms: now - 60_000,
            ..Default::default()
        });
        let forged = ContextSigner::generate().sign(&CallerContext {
            expires_at_ms: now + CONTEXT_TTL_MS,
            ..Default::default()
        });

        for refused in [
            None,
            Some("!!".to_owned()),
            Some(encode(&expired)),
            Some(encode(&forged)),
        ] {
            let response = svc
                .ready()
                .await
                .unwrap()
                .call(request_with(refused, "/kg.v1.Graph/Open"))
                .await
                .unwrap();
            assert_eq!(response.headers().get("grpc-status").unwrap(), "16");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);

        svc.ready()
            .await
            .unwrap()
            .call(request_with(Some(encode(&good)), "/kg.v1.Graph/Open"))
            .await
            .unwrap();
        svc.ready()
            .await
            .unwrap()
            .call(request_with(None, "/grpc.health.v1.Health/Check"))
            .await
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
