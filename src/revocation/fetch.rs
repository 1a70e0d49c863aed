//! One CRL fetch over HTTP(S): hyper-util's client (the gateway's own upstream client is
//! built for Partners: their pools, per-worker runtimes and answers; a CRL is fetched a
//! few times an hour, from the background runtime, and needs none of that). The whole
//! fetch is bounded by `revocation.fetch_timeout`, the body by `revocation.max_crl_bytes`
//! (a `Content-Length` above it is refused before the body is read). The validators of
//! the last good answer go with the next request (`If-None-Match`, `If-Modified-Since`).

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::settings::RevocationSettings;

/// The client CRLs are fetched with.
pub(crate) type CrlClient = HttpClient<Empty<Bytes>>;

/// A client sending bodies of type `B` (CRLs: none; OCSP: the request).
pub(crate) type HttpClient<B> = Client<HttpsConnector<HttpConnector>, B>;

/// A client for `settings`: http, and https verified against `revocation.tls_ca`.
pub(crate) fn client<B>(settings: &RevocationSettings) -> anyhow::Result<HttpClient<B>>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    let mut roots = rustls::RootCertStore::empty();
    if let Some(path) = &settings.tls_ca {
        for c in crate::tls::pem::load_certs(path)? {
            roots.add(c)?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(crate::tls::server::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector))
}

/// The validators of the last good answer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Validators {
    pub(crate) etag: Option<header::HeaderValue>,
    pub(crate) last_modified: Option<header::HeaderValue>,
}

/// How a fetch ended.
#[derive(Debug)]
pub(crate) enum Fetched {
    /// A body (status 200), and its validators.
    Body(Bytes, Validators),
    /// `304 Not Modified`: the CRL held is still current.
    NotModified,
    /// No usable answer; the label says why (a metrics label: `result`).
    Failed(&'static str),
}

/// Fetches `url`, within the settings' time and size bounds.
pub(crate) async fn fetch(
    client: &CrlClient,
    url: &str,
    held: &Validators,
    settings: &RevocationSettings,
) -> Fetched {
    match tokio::time::timeout(settings.fetch_timeout, get(client, url, held, settings)).await {
        Ok(f) => f,
        Err(_) => Fetched::Failed("timeout"),
    }
}

async fn get(
    client: &CrlClient,
    url: &str,
    held: &Validators,
    settings: &RevocationSettings,
) -> Fetched {
    let mut req = Request::get(url);
    if let Some(etag) = &held.etag {
        req = req.header(header::IF_NONE_MATCH, etag);
    }
    if let Some(lm) = &held.last_modified {
        req = req.header(header::IF_MODIFIED_SINCE, lm);
    }
    let Ok(req) = req.body(Empty::new()) else {
        return Fetched::Failed("bad_url");
    };
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(_) => return Fetched::Failed("unreachable"),
    };
    match resp.status() {
        StatusCode::OK => {}
        StatusCode::NOT_MODIFIED => return Fetched::NotModified,
        _ => return Fetched::Failed("http_status"),
    }
    let max = settings.max_crl_bytes;
    let declared = crate::body::declared_length(resp.headers());
    if declared.is_some_and(|n| n > max as u64) {
        return Fetched::Failed("too_large");
    }
    let validators = Validators {
        etag: resp.headers().get(header::ETAG).cloned(),
        last_modified: resp.headers().get(header::LAST_MODIFIED).cloned(),
    };
    match Limited::new(resp.into_body(), max).collect().await {
        Ok(body) => Fetched::Body(body.to_bytes(), validators),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Fetched::Failed("too_large"),
        Err(_) => Fetched::Failed("unreachable"),
    }
}
