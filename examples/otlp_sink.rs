//! A live OTLP/gRPC trace receiver for the load comparison (benches/README.md, "Tracing
//! export"): the official trace service (`opentelemetry-proto`'s tonic server), which
//! decodes every export request and counts its spans, printing the count every 10 s.
//!
//! ```text
//! cargo build --release --example otlp_sink
//! taskset -c 0 target/release/examples/otlp_sink 127.0.0.1:4317
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
