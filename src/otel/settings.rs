//! `[tracing]` checked once at load: the endpoint a usable URL, the headers valid, the
//! bounds at least one, the ratio a share.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::config::raw::{OtlpProtocol, RawTracing};

/// The path of OTLP/gRPC's trace export method.
const GRPC_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// OTLP/HTTP's default trace path.
const HTTP_PATH: &str = "/v1/traces";

/// `[tracing]`, validated (field meanings and defaults: [`RawTracing`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// Where export requests go: the endpoint with the protocol's path.
    pub url: http::Uri,
    /// `grpc` or `http/protobuf`.
    pub protocol: OtlpProtocol,
    /// Headers sent with every export request.
    pub headers: HeaderMap,
    /// CA bundle for an `https` collector (`None`: the system's roots).
    pub ca: Option<PathBuf>,
    /// Client certificate chain and key.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// One export request's time bound.
    pub timeout: Duration,
    /// Head sampling share for requests without a `traceparent`.
    pub sample_ratio: f64,
    /// Finished requests waiting for export, at most.
    pub queue_size: usize,
    /// Finished requests per export request, at most.
    pub batch_size: usize,
    /// Longest wait before queued spans are sent.
    pub export_interval: Duration,
    /// Longest attribute value taken from a request, in bytes.
    pub max_attribute_bytes: usize,
    /// `service.name`.
    pub service_name: String,
}

impl TracingSettings {
    /// Whether export requests are gRPC (framed), not HTTP/protobuf.
    pub(crate) fn grpc(&self) -> bool {
        self.protocol == OtlpProtocol::Grpc
    }

    /// `None` when `otlp_endpoint` is not set (export off).
    pub(crate) fn from_raw(r: &RawTracing) -> anyhow::Result<Option<TracingSettings>> {
        let Some(endpoint) = r.otlp_endpoint.as_deref() else {
            return Ok(None);
        };
        let url = export_url(endpoint, r.protocol)
            .with_context(|| format!("tracing.otlp_endpoint: {endpoint:?}"))?;
        let mut headers = HeaderMap::new();
        for (k, v) in &r.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .with_context(|| format!("tracing.headers: {k:?} is not a header name"))?;
            let value = HeaderValue::from_str(v)
                .with_context(|| format!("tracing.headers.{k}: not a header value"))?;
            headers.insert(name, value);
        }
        let client_cert = match (&r.client_cert, &r.client_key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            (None, None) => None,
            _ => bail!("tracing.client_cert and tracing.client_key: set both or neither"),
        };
        for (key, d) in [
            ("timeout", r.timeout),
            ("export_interval", r.export_interval),
        ] {
            if d.is_zero() {
                bail!("tracing.{key}: must be greater than zero");
            }
        }
        for (key, n) in [
            ("queue_size", r.queue_size),
            ("batch_size", r.batch_size),
            ("max_attribute_bytes", r.max_attribute_bytes),
        ] {
            if n == 0 {
                bail!("tracing.{key}: must be at least 1");
            }
        }
        if !(0.0..=1.0).contains(&r.sample_ratio) {
            bail!("tracing.sample_ratio: must be between 0.0 and 1.0");
        }
        Ok(Some(TracingSettings {
            url,
            protocol: r.protocol,
            headers,
            ca: r.ca.clone(),
            client_cert,
            timeout: r.timeout,
            sample_ratio: r.sample_ratio,
            queue_size: r.queue_size,
            batch_size: r.batch_size,
            export_interval: r.export_interval,
            max_attribute_bytes: r.max_attribute_bytes,
            service_name: r.service_name.clone(),
        }))
    }
}

/// The URL export requests go to: gRPC's method path after the endpoint's; for
/// `http/protobuf`, the endpoint's own path, or `/v1/traces` when it has none.
fn export_url(endpoint: &str, protocol: OtlpProtocol) -> anyhow::Result<http::Uri> {
    let uri: http::Uri = endpoint.parse().context("not a URL")?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => bail!("not an http:// or https:// URL"),
    }
    if uri.query().is_some() {
        bail!("a query is not allowed");
    }
    let path = uri.path().trim_end_matches('/');
    let path = match protocol {
        OtlpProtocol::Grpc => format!("{path}{GRPC_PATH}"),
        OtlpProtocol::HttpProtobuf if path.is_empty() => HTTP_PATH.to_owned(),
        OtlpProtocol::HttpProtobuf => path.to_owned(),
    };
    let authority = uri.authority().context("no host")?;
    http::Uri::builder()
        .scheme(uri.scheme_str().unwrap_or("http"))
        .authority(authority.as_str())
        .path_and_query(path)
        .build()
        .context("not a URL")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(endpoint: &str) -> RawTracing {
        RawTracing {
            otlp_endpoint: Some(endpoint.to_owned()),
            ..RawTracing::default()
        }
    }

    #[test]
    fn off_unless_an_endpoint_is_set() {
        assert_eq!(
            TracingSettings::from_raw(&RawTracing::default()).unwrap(),
            None
        );
    }

    #[test]
    fn export_paths_by_protocol() {
        let s = TracingSettings::from_raw(&raw("http://c:4317"))
            .unwrap()
            .unwrap();
        assert_eq!(
            s.url,
            "http://c:4317/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        let mut r = raw("https://c:4318/");
        r.protocol = OtlpProtocol::HttpProtobuf;
        let s = TracingSettings::from_raw(&r).unwrap().unwrap();
        assert_eq!(s.url, "https://c:4318/v1/traces");
        r.otlp_endpoint = Some("https://c/otlp/traces".into());
        let s = TracingSettings::from_raw(&r).unwrap().unwrap();
        assert_eq!(s.url, "https://c/otlp/traces");
    }

    #[test]
    fn bad_values_name_their_key() {
        type Spoil = fn(&mut RawTracing);
        let cases: [(&str, Spoil); 7] = [
            ("otlp_endpoint", |r| {
                r.otlp_endpoint = Some("ftp://c".into())
            }),
            ("sample_ratio", |r| r.sample_ratio = 1.5),
            ("queue_size", |r| r.queue_size = 0),
            ("batch_size", |r| r.batch_size = 0),
            ("timeout", |r| r.timeout = Duration::ZERO),
            ("client_key", |r| r.client_cert = Some("c.pem".into())),
            ("headers", |r| {
                r.headers.insert("bad name".into(), "v".into());
            }),
        ];
        for (key, spoil) in cases {
            let mut r = raw("http://c:4317");
            spoil(&mut r);
            let e = format!("{:#}", TracingSettings::from_raw(&r).unwrap_err());
            assert!(e.contains(key), "{key}: {e}");
        }
    }
}
