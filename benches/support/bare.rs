//! The bare baseline: a tokio + hyper + rustls mTLS reverse proxy that does nothing but
//! terminate TLS 1.3 (client certificate and CRL checked by rustls's WebPKI verifier) and
//! pass each request to one plain-HTTP backend through hyper-util's pooled client. No
//! envelope, identity, policy, quota, metric or log: the floor `aipgw` is measured
//! against (`benches/load/`, `benches/e2e.rs`).
//!
//! Shared by `examples/bare_proxy.rs` and `benches/e2e.rs` (`#[path]`), so the load
//! script and the criterion bench measure the same code.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The baseline's TLS settings: TLS 1.3 only, client certificate required, ALPN `h2` and
/// `http/1.1`. `resumption = false` turns off session tickets and the session cache, so
/// every new connection is a full handshake.
pub(crate) fn tls_config(
    cert: &Path,
    key: &Path,
    ca: &Path,
    crls: &[&Path],
    resumption: bool,
) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca)? {
        roots.add(c?)?;
    }
    let mut crl_ders = Vec::new();
    for path in crls {
        for c in CertificateRevocationListDer::pem_file_iter(path)? {
            crl_ders.push(c?);
        }
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .with_crls(crl_ders)
        .build()?;
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    if !resumption {
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(NoServerSessionStorage {});
    }
    Ok(Arc::new(config))
}

type Body = Either<Incoming, Full<Bytes>>;

/// Accepts connections on `listener` forever, relaying every request to `backend`
/// (`http://host:port`).
pub(crate) async fn serve(listener: TcpListener, tls: Arc<ServerConfig>, backend: Uri) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    let acceptor = TlsAcceptor::from(tls);
    let authority = backend
        .authority()
        .expect("the backend URI has host:port")
        .clone();
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let client = client.clone();
        let authority = authority.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            let svc = service_fn(move |req: Request<Incoming>| {
                let client = client.clone();
                let authority = authority.clone();
                async move { Ok::<_, Infallible>(forward(&client, authority, req).await) }
            });
            let io = TokioIo::new(tls);
            if h2 {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(io, svc)
                    .await;
            } else {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            }
        });
    }
}

async fn forward(
    client: &Client<HttpConnector, Incoming>,
    authority: http::uri::Authority,
    req: Request<Incoming>,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = match Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(path)
        .build()
    {
        Ok(u) => u,
        Err(_) => return status(StatusCode::BAD_REQUEST),
    };
    parts.version = Version::HTTP_11;
    parts.headers.remove(http::header::HOST);
    match client.request(Request::from_parts(parts, body)).await {
        Ok(resp) => resp.map(Either::Left),
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Either::Right(Full::new(Bytes::new())));
    *r.status_mut() = code;
    r
}
