//! The static Partner every proxy in the load comparison forwards to: plain HTTP/1.1
//! keep-alive, a fixed JSON-RPC answer to every POST, and for a `stream` request a
//! complete SSE body of `events` AIP stream events (`eventSeq` 1..=events, about 150 bytes
//! of event data each). Answers are built once at start, so the backend costs the same
//! behind every proxy.
//!
//! Shared by `examples/load_backend.rs` and `benches/e2e.rs` (`#[path]`).

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The answer to an `rpc` (and to any other non-`stream` POST).
pub(crate) const RPC_ANSWER: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"taskId":"load-task","status":{"state":"completed","timestamp":"2026-11-21T00:00:00Z"},"products":[{"id":"p1","parts":[{"type":"text","text":"ok"}]}]}}"#;

/// The SSE body answering a `stream` request: `events` events.
pub(crate) fn sse_body(events: usize) -> Bytes {
    let mut out = String::with_capacity(events * 200);
    for seq in 1..=events {
        out.push_str(r#"data: {"jsonrpc":"2.0","id":1,"result":{"eventSeq":"#);
        out.push_str(&seq.to_string());
        out.push_str(r#","eventData":{"type":"product-chunk","taskId":"load-task","chunk":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}}}"#);
        out.push_str("\n\n");
    }
    Bytes::from(out)
}

/// Serves `listener` forever.
pub(crate) async fn serve(listener: TcpListener, events: usize) {
    let rpc = Bytes::from_static(RPC_ANSWER.as_bytes());
    let sse = sse_body(events);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (rpc, sse) = (rpc.clone(), sse.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let (rpc, sse) = (rpc.clone(), sse.clone());
                async move {
                    let body = req
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let stream = find(&body, br#""method":"stream""#);
                    let (answer, kind) = if stream {
                        (sse, "text/event-stream")
                    } else {
                        (rpc, "application/json")
                    };
                    let mut resp = Response::new(Full::new(answer));
                    resp.headers_mut()
                        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
                    Ok::<_, Infallible>(resp)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
