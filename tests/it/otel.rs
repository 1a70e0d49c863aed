//! OTLP trace export (`[tracing]`), against receivers started here: the official OTLP
//! gRPC service (`opentelemetry-proto`'s tonic server) and an OTLP/HTTP endpoint decoding
//! the same protobuf messages. Spans arrive with their parents and attributes; errors are
//! exported at ratio 0; a collector that refuses connections, or accepts and never
//! answers, costs the request path nothing (every request answers; what does not fit in
//! the queue is dropped and counted, exactly the queue's bound kept).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::support::*;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// The spans a receiver got, in arrival order.
#[derive(Default)]
struct Received {
    spans: Mutex<Vec<Span>>,
    resources: Mutex<Vec<String>>,
    arrived: Notify,
}

impl Received {
    fn take(&self, req: ExportTraceServiceRequest) {
        for rs in req.resource_spans {
            for kv in rs.resource.iter().flat_map(|r| &r.attributes) {
                if let Some(Value::StringValue(s)) =
                    kv.value.as_ref().and_then(|v| v.value.as_ref())
                {
                    self.resources
                        .lock()
                        .unwrap()
                        .push(format!("{}={s}", kv.key));
                }
            }
            for ss in rs.scope_spans {
                self.spans.lock().unwrap().extend(ss.spans);
            }
        }
        self.arrived.notify_waiters();
    }

    /// Waits until `want` holds of the spans received so far.
    async fn until(&self, want: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        within(20, async {
            loop {
                let arrived = self.arrived.notified();
                {
                    let spans = self.spans.lock().unwrap();
                    if want(&spans) {
                        return spans.clone();
                    }
                }
                arrived.await;
            }
        })
        .await
    }
}

#[derive(Clone)]
struct Grpc(Arc<Received>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.take(req.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The official OTLP/gRPC trace service on a free loopback port.
async fn grpc_receiver() -> (SocketAddr, Arc<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(Received::default());
    let service = TraceServiceServer::new(Grpc(received.clone()));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let svc = hyper_util::service::TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, received)
}

/// An OTLP/HTTP endpoint (`POST /v1/traces`, protobuf) on a free loopback port.
async fn http_receiver() -> (SocketAddr, Arc<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(Received::default());
    let r = received.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let r = r.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let r = r.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/v1/traces");
                        assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                        assert_eq!(req.headers()["x-tenant"], "t1");
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        r.take(ExportTraceServiceRequest::decode(body).unwrap());
                        let answer = ExportTraceServiceResponse::default().encode_to_vec();
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(answer))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, received)
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn text<'a>(span: &'a Span, key: &str) -> &'a str {
    match attr(span, key) {
        Some(Value::StringValue(s)) => s,
        other => panic!("{key}: {other:?} in {span:?}"),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(Value::IntValue(i)) => *i,
        other => panic!("{key}: {other:?} in {span:?}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn of_kind(spans: &[Span], kind: SpanKind) -> Vec<&Span> {
    spans.iter().filter(|s| s.kind == kind as i32).collect()
}

/// The spans of the request whose `x-request-id` is `rid`: (server, client).
fn request_spans<'a>(spans: &'a [Span], rid: &str) -> (Option<&'a Span>, Option<&'a Span>) {
    let server = of_kind(spans, SpanKind::Server)
        .into_iter()
        .find(|s| matches!(attr(s, "aip.request_id"), Some(Value::StringValue(r)) if r == rid));
    let client = server.and_then(|srv| {
        of_kind(spans, SpanKind::Client)
            .into_iter()
            .find(|c| c.parent_span_id == srv.span_id)
    });
    (server, client)
}

/// The gateway's span counters: (exported, failed, dropped).
async fn span_counts(gw: &TestGateway) -> (f64, f64, f64) {
    let m = parse_metrics(&gw.admin_get("/metrics").await.1);
    let get = |k: &str| {
        m.get(&format!("aipgw_trace_spans_{k}_total"))
            .copied()
            .unwrap_or(-1.0)
    };
    (get("exported"), get("failed"), get("dropped"))
}

/// Waits until the span counters satisfy `want`.
async fn until_counts(gw: &TestGateway, want: impl Fn((f64, f64, f64)) -> bool) -> (f64, f64, f64) {
    within(20, async {
        loop {
            let c = span_counts(gw).await;
            if want(c) {
                return c;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

fn tracing_block(endpoint: &str, extra: &str) -> String {
    format!("[tracing]\notlp_endpoint = \"{endpoint}\"\nbatch_size = 1\n{extra}\n")
}

#[tokio::test]
async fn grpc_spans_carry_the_clients_parent_the_client_span_and_the_attributes() {
    let pki = Pki::new();
    let (collector, received) = grpc_receiver().await;
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "{}{}",
            partner_block("demo", "/partners/demo", &partner.url(), ""),
            tracing_block(&format!("http://{collector}"), "service_name = \"gw-test\""),
        ),
    ))
    .await;
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let reply = pki
        .leader(LEADER_A, false)
        .post_with(
            gw.addr,
            "/partners/demo/rpc",
            Bytes::from(rpc_start("\"call-7\"", LEADER_A, "t1")),
            &[("traceparent", &traceparent), ("x-request-id", "req-1")],
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let spans = received.until(|s| s.len() >= 2).await;
    let (server, client) = request_spans(&spans, "req-1");
    let (server, client) = (server.expect("server span"), client.expect("client span"));
    // The server span: the client's trace, the client's span as its parent.
    assert_eq!(hex(&server.trace_id), CLIENT_TRACE);
    assert_eq!(hex(&server.parent_span_id), CLIENT_SPAN);
    assert_eq!(server.name, "rpc");
    assert_eq!(text(server, "rpc.system"), "jsonrpc");
    assert_eq!(text(server, "rpc.method"), "rpc");
    assert_eq!(text(server, "rpc.jsonrpc.version"), "2.0");
    assert_eq!(text(server, "rpc.jsonrpc.request_id"), "call-7");
    assert_eq!(text(server, "aip.caller.aic"), LEADER_A);
    assert_eq!(text(server, "aip.partner"), "demo");
    assert_eq!(text(server, "aip.command"), "start");
    assert_eq!(text(server, "aip.task_id"), "t1");
    assert_eq!(text(server, "aip.session_id"), "s1");
    assert_eq!(text(server, "client.address"), "127.0.0.1");
    assert_eq!(int(server, "http.response.status_code"), 200);
    assert!(attr(server, "rpc.jsonrpc.error_code").is_none());
    assert!(server
        .status
        .as_ref()
        .is_none_or(|s| s.code == StatusCode::Unset as i32));
    assert!(
        server.start_time_unix_nano > 0 && server.start_time_unix_nano <= server.end_time_unix_nano
    );
    // The client span: the server span's child, named in the Partner's traceparent.
    assert_eq!(client.trace_id, server.trace_id);
    assert_eq!(text(client, "rpc.system"), "jsonrpc");
    assert_eq!(text(client, "rpc.method"), "rpc");
    assert_eq!(text(client, "aip.partner"), "demo");
    assert_eq!(text(client, "rpc.jsonrpc.request_id"), "call-7");
    assert!(client.start_time_unix_nano >= server.start_time_unix_nano);
    assert!(client.end_time_unix_nano <= server.end_time_unix_nano);
    let seen = partner.seen();
    let forwarded = seen[0].headers["traceparent"].to_str().unwrap();
    assert_eq!(
        forwarded,
        format!("00-{CLIENT_TRACE}-{}-01", hex(&client.span_id))
    );
    assert_ne!(hex(&client.span_id), CLIENT_SPAN);
    assert!(received
        .resources
        .lock()
        .unwrap()
        .contains(&"service.name=gw-test".to_owned()));
    until_counts(&gw, |(exported, failed, dropped)| {
        exported == 2.0 && failed == 0.0 && dropped == 0.0
    })
    .await;
}

#[tokio::test]
async fn http_protobuf_spans_of_a_stream_carry_its_events_and_outcome() {
    let pki = Pki::new();
    let (collector, received) = http_receiver().await;
    let partner = SsePartner::start(Restream::Error).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "{}{}",
            partner_block("demo", "/partners/demo", &partner.url(), ""),
            tracing_block(
                &format!("http://{collector}"),
                "protocol = \"http/protobuf\"\n[tracing.headers]\nx-tenant = \"t1\"",
            ),
        ),
    ))
    .await;
    let leader = pki.leader(LEADER_A, true);
    let body = stream_body("5", LEADER_A, "ts", "start", None);
    let mut reply = leader
        .open_stream(
            gw.addr,
            "/partners/demo/stream",
            &body,
            &[("x-request-id", "stream-1")],
        )
        .await;
    assert_eq!(reply.status, 200);
    let feed = partner.feed("ts").await;
    feed_events(&feed, 1..=3, Some((3, "completed"))).await;
    drop(feed);
    let mut n = 0;
    while reply.next_event().await.is_some() {
        n += 1;
    }
    assert_eq!(n, 3);
    let spans = received
        .until(|s| request_spans(s, "stream-1").1.is_some())
        .await;
    let (server, client) = request_spans(&spans, "stream-1");
    let (server, client) = (server.unwrap(), client.unwrap());
    for span in [server, client] {
        assert_eq!(text(span, "rpc.method"), "stream");
        assert_eq!(int(span, "aip.stream.events"), 3);
        assert_eq!(text(span, "aip.stream.outcome"), "completed");
        assert_eq!(text(span, "aip.task_id"), "ts");
    }
    // No client traceparent: a root server span, the trace id made here.
    assert!(server.parent_span_id.is_empty());
    assert_eq!(server.trace_id.len(), 16);
}

#[tokio::test]
async fn at_ratio_zero_errors_and_sampled_parents_are_exported_the_rest_is_not() {
    let pki = Pki::new();
    let (collector, received) = grpc_receiver().await;
    let partner = TestPartner::start(Behaviour::Echo).await;
    // A Partner nobody listens on: the request fails with upstream_unavailable.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "{}{}{}",
            partner_block("demo", "/partners/demo", &partner.url(), ""),
            partner_block("gone", "/partners/gone", &dead_url, ""),
            tracing_block(&format!("http://{collector}"), "sample_ratio = 0.0"),
        ),
    ))
    .await;
    let leader = pki.leader(LEADER_A, false);
    let post = |path: &'static str, rid: &'static str, tp: Option<String>| {
        let leader = &leader;
        let gw = &gw;
        async move {
            let mut headers = vec![("x-request-id", rid)];
            let tp = tp.unwrap_or_default();
            if !tp.is_empty() {
                headers.push(("traceparent", tp.as_str()));
            }
            leader
                .post_with(
                    gw.addr,
                    path,
                    Bytes::from(rpc_start("1", LEADER_A, rid)),
                    &headers,
                )
                .await
                .unwrap()
        }
    };
    // Not sampled: no traceparent at ratio 0, and a parent that says "not sampled".
    assert_eq!(post("/partners/demo/rpc", "plain", None).await.status, 200);
    let unsampled = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-00");
    assert_eq!(
        post("/partners/demo/rpc", "unsampled", Some(unsampled))
            .await
            .status,
        200
    );
    // The Partner is told the decision, under the client span's id.
    let seen = partner.seen();
    let forwarded = seen[1].headers["traceparent"].to_str().unwrap();
    assert!(forwarded.starts_with(&format!("00-{CLIENT_TRACE}-")) && forwarded.ends_with("-00"));
    assert!(!forwarded.contains(CLIENT_SPAN), "{forwarded}");
    // Sampled by its parent, whatever the ratio.
    let sampled = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(
        post("/partners/demo/rpc", "sampled", Some(sampled))
            .await
            .status,
        200
    );
    // An error, not sampled at the head: exported.
    let failed = post("/partners/gone/rpc", "failed", None).await;
    let (code, reason) = error_of(&failed.json());
    assert_eq!(reason, "upstream_unavailable", "{}", failed.text());
    let spans = received
        .until(|s| {
            request_spans(s, "failed").1.is_some() && request_spans(s, "sampled").1.is_some()
        })
        .await;
    let (server, client) = request_spans(&spans, "failed");
    for span in [server.unwrap(), client.unwrap()] {
        let status = span.status.as_ref().unwrap();
        assert_eq!(status.code, StatusCode::Error as i32);
        assert_eq!(status.message, "upstream_unavailable");
        assert_eq!(int(span, "rpc.jsonrpc.error_code"), code);
        assert_eq!(
            text(span, "rpc.jsonrpc.error_message"),
            "upstream_unavailable"
        );
        assert_eq!(span.flags & 1, 0, "exported although the head said no");
    }
    assert_eq!(
        int(server.unwrap(), "http.response.status_code"),
        i64::from(failed.status.as_u16())
    );
    // The requests the head did not sample were never queued: nothing of them arrives,
    // before or after the spans that did.
    for rid in ["plain", "unsampled"] {
        assert!(request_spans(&spans, rid).0.is_none(), "{rid} exported");
    }
    assert_eq!(spans.len(), 4, "{spans:?}");
}

/// A listener that accepts connections and never answers on them.
async fn silent_collector() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    (addr, task)
}

/// Ten requests through a gateway exporting to `endpoint`, every one answered at once.
async fn ten_requests(endpoint: &str, extra: &str) -> TestGateway {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "{}[tracing]\notlp_endpoint = \"{endpoint}\"\n{extra}\n",
            partner_block("demo", "/partners/demo", &partner.url(), ""),
        ),
    ))
    .await;
    let leader = pki.leader(LEADER_A, false);
    within(20, async {
        for i in 0..10 {
            let body = rpc_start(&i.to_string(), LEADER_A, &format!("t{i}"));
            let reply = leader
                .post(gw.addr, "/partners/demo/rpc", &body)
                .await
                .unwrap();
            assert_eq!(reply.status, 200, "{}", reply.text());
        }
    })
    .await;
    assert_eq!(partner.seen().len(), 10);
    gw
}

#[tokio::test]
async fn a_collector_that_never_answers_fills_the_queue_to_its_bound_and_the_rest_is_dropped() {
    let (addr, _collector) = silent_collector().await;
    // Batches of one request (none left partial in a worker's batch): the first is taken
    // and waits on the silent collector (30 s bound); two more fill the queue; the last
    // seven requests' spans (two each) are dropped.
    let gw = ten_requests(
        &format!("http://{addr}"),
        "queue_size = 2\nbatch_size = 1\nexport_interval = \"1h\"\ntimeout = \"30s\"",
    )
    .await;
    let (exported, failed, dropped) = until_counts(&gw, |(_, _, d)| d >= 14.0).await;
    assert_eq!((exported, failed, dropped), (0.0, 0.0, 14.0));
}

#[tokio::test]
async fn a_collector_that_refuses_connections_costs_the_request_path_nothing() {
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    for protocol in ["grpc", "http/protobuf"] {
        let gw = ten_requests(
            &format!("http://{addr}"),
            &format!("protocol = \"{protocol}\"\nbatch_size = 2\nexport_interval = \"50ms\""),
        )
        .await;
        // Every span was sent and failed (the queue, 2048 by default, never filled).
        let counts = until_counts(&gw, |(_, f, _)| f >= 20.0).await;
        assert_eq!(counts, (0.0, 20.0, 0.0), "{protocol}");
    }
}

#[tokio::test]
async fn spans_still_queued_at_shutdown_are_sent() {
    let pki = Pki::new();
    let (collector, received) = grpc_receiver().await;
    let partner = TestPartner::start(Behaviour::Echo).await;
    // Neither a full batch nor the interval sends them: only the shutdown can.
    let mut gw = start_gateway(&pki.config(
        "",
        &format!(
            "{}[tracing]\notlp_endpoint = \"http://{collector}\"\nexport_interval = \"1h\"\n",
            partner_block("demo", "/partners/demo", &partner.url(), ""),
        ),
    ))
    .await;
    let body = rpc_start("1", LEADER_A, "t1");
    let reply = pki
        .leader(LEADER_A, false)
        .post(gw.addr, "/partners/demo/rpc", &body)
        .await;
    assert_eq!(reply.unwrap().status, 200);
    // Queued when the request's log line is written, as its metrics are.
    metric(
        &gw,
        r#"aipgw_requests_total{partner="demo",method="rpc",status="200",code="0"}"#,
        1.0,
    )
    .await;
    within(20, gw.shutdown()).await.unwrap().unwrap();
    let spans = received.until(|s| s.len() >= 2).await;
    assert_eq!(spans.len(), 2);
}
