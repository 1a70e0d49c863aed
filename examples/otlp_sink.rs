//! A live OTLP/gRPC trace receiver for the load comparison (benches/README.md, "Tracing
//! export"): the official trace service (`opentelemetry-proto`'s tonic server), which
//! decodes every export request and counts its spans, printing the count every 10 s.
//! With `--drain`, a lighter one: every request's body is read and dropped and answered
//! `grpc-status: 0`, nothing decoded, so a receiver beside the load generator takes
//! little of its core (decoding 100,000 spans a second took enough of it to lower the
//! load the gateway saw, and with it the gateway's batching).
//!
//! ```text
//! cargo build --release --example otlp_sink
//! taskset -c 0 target/release/examples/otlp_sink 127.0.0.1:4317 [--drain]
//! benches/load/run.py --http1 --otlp   # starts it itself
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};

/// Counts the spans it receives.
#[derive(Clone, Default)]
struct Sink(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = req
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.0.fetch_add(spans as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4317".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    // The load comparison reads the port from this line (benches/load/run.py, --otlp).
    println!("otlp_sink: listening on {}", listener.local_addr()?);
    let sink = Sink::default();
    let count = sink.0.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(10));
        loop {
            tick.tick().await;
            eprintln!("otlp_sink: {} spans", count.load(Ordering::Relaxed));
        }
    });
    if std::env::args().any(|a| a == "--drain") {
        return drain(listener).await;
    }
    let service = TraceServiceServer::new(sink);
    loop {
        let (tcp, _) = listener.accept().await?;
        let svc = hyper_util::service::TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                .await;
        });
    }
}

/// `--drain`: reads every request's body to its end, drops it, answers gRPC success.
async fn drain(listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    use http_body_util::BodyExt;
    loop {
        let (tcp, _) = listener.accept().await?;
        let svc =
            hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                let mut body = req.into_body();
                while let Some(frame) = body.frame().await {
                    frame?;
                }
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                let answer = http_body_util::Full::new(bytes::Bytes::new())
                    .with_trailers(async move { Some(Ok(trailers)) });
                http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(answer)
                    .map_err(anyhow::Error::from)
            });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                .await;
        });
    }
}
