//! `[tracing]` as written: OTLP trace export (`crate::otel`), off unless `otlp_endpoint`
//! is set. Read at start: a reload keeps the exporter it started with.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// How spans are sent to the collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP/gRPC: `POST <endpoint>/opentelemetry.proto.collector.trace.v1.TraceService/Export`
    /// over HTTP/2 (cleartext with prior knowledge for `http://`, ALPN `h2` for
    /// `https://`). The default, as in the OpenTelemetry SDKs.
    #[default]
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies: `POST <endpoint>/v1/traces` over HTTP/1.1.
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// `[tracing]`: a server span per request and a client span per Partner exchange,
/// exported over OTLP (README.md, "Tracing (OTLP)").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawTracing {
    /// The collector: `http://host:port` or `https://host:port` (for `http/protobuf`, a
    /// path other than `/` is used as is, otherwise `/v1/traces` is added). Default:
    /// none, export off.
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf`. Default: `grpc`.
    pub protocol: OtlpProtocol,
    /// Headers sent with every export request (an API key, a tenant). Default: none.
    pub headers: BTreeMap<String, String>,
    /// CA bundle (PEM) the collector's certificate is verified against (`https`).
    /// Default: none, the system's trusted roots.
    pub ca: Option<PathBuf>,
    /// The gateway's client certificate chain (PEM) for a collector that requires mutual
    /// TLS; with `client_key`. Default: none.
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM). Default: none.
    pub client_key: Option<PathBuf>,
    /// Time one export request (connect, send, answer) may take; past it the batch is
    /// counted failed and dropped. Default: 10 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Share of traces sampled at the head when the client sent no `traceparent`
    /// (by trace id, as OpenTelemetry's `TraceIdRatioBased`), 0.0 to 1.0; a client's
    /// `traceparent` decides by its sampled flag. A request that ends in an error is
    /// exported whatever the head decision. Default: 1.0.
    pub sample_ratio: f64,
    /// Finished requests whose spans (a server span and at most one client span each)
    /// wait for export, at most; a request finishing with the queue full has its spans
    /// dropped and counted (`aipgw_trace_spans_dropped_total`). Default: 2048.
    pub queue_size: usize,
    /// Finished requests' spans sent in one export request, at most (a full batch is
    /// sent at once, without waiting for `export_interval`). Default: 512.
    pub batch_size: usize,
    /// Queued spans are sent at least this often. Default: 5 s.
    #[serde(with = "humantime_serde")]
    pub export_interval: Duration,
    /// Longest attribute value taken from a request (task and session ids, the JSON-RPC
    /// id), in bytes; longer ones are cut at a character boundary. Default: 256.
    pub max_attribute_bytes: usize,
    /// The `service.name` resource attribute. Default: `aipgw`.
    pub service_name: String,
}

impl Default for RawTracing {
    fn default() -> Self {
        RawTracing {
            otlp_endpoint: None,
            protocol: OtlpProtocol::default(),
            headers: BTreeMap::new(),
            ca: None,
            client_cert: None,
            client_key: None,
            timeout: Duration::from_secs(10),
            sample_ratio: 1.0,
            queue_size: 2048,
            batch_size: 512,
            export_interval: Duration::from_secs(5),
            max_attribute_bytes: 256,
            service_name: "aipgw".to_owned(),
        }
    }
}
