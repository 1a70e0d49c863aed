//! The exporter: a thread of its own with a single-threaded runtime, taking full batches
//! (export requests the workers wrote, `Tracer::record`) from the bounded queue as they
//! come and the workers' partial batches every `tracing.export_interval`, and sending
//! them, one request at a time, within `tracing.timeout`. A failed batch is counted and
//! dropped, not retried: the queue, not a retry buffer, is the bound on what waits. It
//! stops when the queue's sender (the gateway's `Tracer`, which queues its partial
//! batches as it goes) is gone, after sending what was left.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::Request;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio::sync::mpsc;

use super::{Batch, Shared, TracingSettings};
use crate::config::raw::OtlpProtocol;

/// The largest answer body read from a collector (its partial-success message).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// See the module documentation.
pub(super) struct Exporter {
    rx: mpsc::Receiver<Batch>,
    shared: Arc<Shared>,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    url: http::Uri,
    protocol: OtlpProtocol,
    headers: HeaderMap,
    timeout: Duration,
    interval: Duration,
    /// The last export failed (the next failure is logged at debug level only).
    failing: bool,
}

impl Exporter {
    /// The exporter for `settings` (its TLS files read now: an error fails the load).
    pub(super) fn new(
        settings: &TracingSettings,
        rx: mpsc::Receiver<Batch>,
        shared: Arc<Shared>,
    ) -> anyhow::Result<Exporter> {
        let mut headers = settings.headers.clone();
        let content_type = match settings.protocol {
            OtlpProtocol::Grpc => {
                headers.insert(header::TE, HeaderValue::from_static("trailers"));
                "application/grpc"
            }
            OtlpProtocol::HttpProtobuf => "application/x-protobuf",
        };
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        Ok(Exporter {
            rx,
            shared,
            client: client(settings).context("tracing")?,
            url: settings.url.clone(),
            protocol: settings.protocol,
            headers,
            timeout: settings.timeout,
            interval: settings.export_interval,
            failing: false,
        })
    }

    /// Runs on a thread of its own until the queue closes.
    pub(super) fn spawn(self) -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("tracing: the exporter's runtime")?;
        std::thread::Builder::new()
            .name("aipgw-otlp".into())
            .spawn(move || rt.block_on(self.run()))
            .context("tracing: the exporter's thread")?;
        Ok(())
    }

    async fn run(mut self) {
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + self.interval, self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.shared.busy.store(false, Ordering::SeqCst);
            self.shared.idle.notify_waiters();
            tokio::select! {
                batch = self.rx.recv() => {
                    let Some(batch) = batch else {
                        return;
                    };
                    // Busy before the pending count drops, so a flush never sees both
                    // at rest early.
                    self.shared.busy.store(true, Ordering::SeqCst);
                    self.shared.pending.fetch_sub(1, Ordering::SeqCst);
                    self.send(batch).await;
                }
                _ = tick.tick() => {
                    self.shared.busy.store(true, Ordering::SeqCst);
                    for batch in self.shared.partials() {
                        self.send(batch).await;
                    }
                }
            }
        }
    }

    /// One export request, its spans counted.
    async fn send(&mut self, batch: Batch) {
        let n = batch.spans;
        let body = batch.body.clone();
        let result = tokio::time::timeout(self.timeout, self.post(batch.body))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within tracing.timeout")));
        self.shared.recycle(body);
        match result {
            Ok(()) => {
                self.shared.counts.exported.inc_by(n);
                self.failing = false;
            }
            Err(e) => {
                self.shared.counts.failed.inc_by(n);
                if self.failing {
                    tracing::debug!(spans = n, error = %format!("{e:#}"), "OTLP export failed");
                } else {
                    tracing::warn!(spans = n, error = %format!("{e:#}"), "OTLP export failed");
                }
                self.failing = true;
            }
        }
    }

    /// Sends `body` (the encoded request) and judges the answer.
    async fn post(&self, body: Bytes) -> anyhow::Result<()> {
        let mut req = Request::post(self.url.clone()).body(Full::new(body))?;
        *req.headers_mut() = self.headers.clone();
        let resp = self.client.request(req).await?;
        let (parts, body) = resp.into_parts();
        let answer = Limited::new(body, MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?;
        if !parts.status.is_success() {
            bail!("HTTP status {}", parts.status);
        }
        if self.protocol == OtlpProtocol::HttpProtobuf {
            return Ok(());
        }
        // gRPC: the status in the trailers, or in the head of a trailers-only answer.
        let field = |name: &str| {
            parts
                .headers
                .get(name)
                .or_else(|| answer.trailers().and_then(|t| t.get(name)))
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        match field("grpc-status").as_deref() {
            Some("0") => Ok(()),
            Some(code) => bail!(
                "grpc-status {code}: {}",
                field("grpc-message").unwrap_or_default()
            ),
            None => bail!("no grpc-status in the answer"),
        }
    }
}

/// The HTTP client: HTTP/2 only for gRPC (prior knowledge on `http://`), HTTP/1.1 for
/// `http/protobuf`; TLS verified against `tracing.ca` or the system's roots, with the
/// client certificate when set.
fn client(
    s: &TracingSettings,
) -> anyhow::Result<Client<HttpsConnector<HttpConnector>, Full<Bytes>>> {
    let mut roots = rustls::RootCertStore::empty();
    match &s.ca {
        Some(path) => {
            for c in crate::tls::pem::load_certs(path)? {
                roots.add(c).context("ca: not a usable CA certificate")?;
            }
        }
        None if s.url.scheme_str() == Some("https") => {
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(c); // a system root rustls cannot use is left out
            }
        }
        None => {}
    }
    let builder = rustls::ClientConfig::builder_with_provider(crate::tls::server::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let tls = match &s.client_cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                crate::tls::pem::load_certs(cert)?,
                crate::tls::pem::load_key(key)?,
            )
            .context("client_cert")?,
        None => builder.with_no_client_auth(),
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(s.timeout));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .http2_only(s.protocol == OtlpProtocol::Grpc)
        .build(connector))
}

/// The export requests' `Resource` (`service.name`, `service.version`) and
/// `InstrumentationScope` (`aipgw` and its version).
pub(super) fn resource_and_scope(service_name: &str) -> (Resource, InstrumentationScope) {
    let resource = Resource {
        attributes: vec![
            string("service.name", service_name),
            string("service.version", env!("CARGO_PKG_VERSION")),
        ],
        ..Resource::default()
    };
    let scope = InstrumentationScope {
        name: "aipgw".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        ..InstrumentationScope::default()
    };
    (resource, scope)
}

/// A string attribute.
fn string(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..KeyValue::default()
    }
}
