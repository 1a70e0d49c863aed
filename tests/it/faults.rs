//! Issue 14: Partner failures tell the truth. A Partner speaking raw HTTP/1.1 over TCP
//! answers with an HTML 500, a body cut by a reset or a close, or an event stream reset
//! in the middle of an event; the Leader's answer, the access-log line and the metric
//! deltas are checked for each.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::ops::capture;
use crate::support::*;

/// What the raw Partner does, chosen by the request path's first segment.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// `500 text/html`, an error page.
    Html500,
    /// `500 application/json` with a valid JSON-RPC error.
    JsonRpc500,
    /// `200 application/json`, `content-length: 100`, 40 bytes, then (on `go`) a TCP
    /// reset or a clean close.
    HalfBody { reset: bool },
    /// `200 text/event-stream` (chunked): event 1, half of event 2, then (on `go`) a
    /// TCP reset.
    SseReset,
}

const HALF: &[u8] = br#"{"jsonrpc":"2.0","id":"c","result":{"x":"#;
const RPC_ERROR: &str =
    r#"{"jsonrpc":"2.0","id":"e","error":{"code":-32001,"message":"Task not found"}}"#;

struct RawPartner {
    addr: SocketAddr,
    /// Lets a waiting script finish its fault.
    go: Arc<Notify>,
}

impl RawPartner {
    async fn start() -> RawPartner {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let go = Arc::new(Notify::new());
        let go2 = go.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(answer(tcp, go2.clone()));
            }
        });
        RawPartner { addr, go }
    }

    fn url(&self, script: &str) -> String {
        format!("http://{}/{script}", self.addr)
    }
}

/// Reads one request (head and `content-length` body); returns its path.
async fn read_request(tcp: &mut TcpStream) -> String {
    let request = String::from_utf8_lossy(&read_http1_message(tcp).await).to_ascii_lowercase();
    request.split(' ').nth(1).unwrap_or("").to_owned()
}

async fn answer(mut tcp: TcpStream, go: Arc<Notify>) {
    let path = read_request(&mut tcp).await;
    let script = match path.split('/').nth(1).unwrap_or("") {
        "html" => Script::Html500,
        "jsonrpc" => Script::JsonRpc500,
        "reset" => Script::HalfBody { reset: true },
        "close" => Script::HalfBody { reset: false },
        "sse" => Script::SseReset,
        other => panic!("no script {other:?}"),
    };
    let head = |status: &str, ctype: &str, framing: &str| {
        format!("HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\n{framing}\r\n")
    };
    match script {
        Script::Html500 => {
            let page = "<!DOCTYPE html><html><body><h1>Internal Server Error</h1></body></html>";
            let h = head(
                "500 Internal Server Error",
                "text/html",
                &format!("content-length: {}\r\n", page.len()),
            );
            tcp.write_all(format!("{h}{page}").as_bytes())
                .await
                .unwrap();
        }
        Script::JsonRpc500 => {
            let h = head(
                "500 Internal Server Error",
                "application/json",
                &format!("content-length: {}\r\n", RPC_ERROR.len()),
            );
            tcp.write_all(format!("{h}{RPC_ERROR}").as_bytes())
                .await
                .unwrap();
        }
        Script::HalfBody { reset } => {
            let h = head("200 OK", "application/json", "content-length: 100\r\n");
            tcp.write_all(h.as_bytes()).await.unwrap();
            tcp.write_all(HALF).await.unwrap();
            go.notified().await;
            if reset {
                reset_on_drop(&tcp);
            } else {
                tcp.shutdown().await.unwrap();
            }
        }
        Script::SseReset => {
            let h = head(
                "200 OK",
                "text/event-stream",
                "transfer-encoding: chunked\r\n",
            );
            tcp.write_all(h.as_bytes()).await.unwrap();
            let chunk = |b: &[u8]| {
                let mut c = format!("{:x}\r\n", b.len()).into_bytes();
                c.extend_from_slice(b);
                c.extend_from_slice(b"\r\n");
                c
            };
            tcp.write_all(&chunk(&sse_event("\"s\"", 1, "working")))
                .await
                .unwrap();
            tcp.write_all(&chunk(b"data: {\"jsonrpc\":\"2.0\",\"id\":\"s\",\"res"))
                .await
                .unwrap();
            go.notified().await;
            reset_on_drop(&tcp);
        }
    }
    drop(tcp); // a reset with linger 0, else a close
}

/// A zero linger time makes the close a TCP reset (and never blocks, the reason the
/// method is deprecated).
#[allow(deprecated)]
fn reset_on_drop(tcp: &TcpStream) {
    tcp.set_linger(Some(Duration::ZERO)).unwrap();
}

/// The access-log line of the one request made to `partner`.
async fn access_line(partner: &str) -> serde_json::Value {
    within(10, async {
        loop {
            if let Some(l) = capture()
                .access_lines()
                .into_iter()
                .find(|l| l["partner"] == partner)
            {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// A raw Partner and a gateway with a Partner `(name, prefix, script)` for each script.
async fn faulty(partners: &[(&str, &str, &str)]) -> (Pki, RawPartner, TestGateway) {
    let pki = Pki::new();
    let raw = RawPartner::start().await;
    let blocks: String = partners
        .iter()
        .map(|(name, prefix, script)| partner_block(name, prefix, &raw.url(script), ""))
        .collect();
    let gw = start_gateway(&pki.config("", &blocks)).await;
    (pki, raw, gw)
}

fn labels(partner: &str, rest: &str) -> String {
    format!("{{partner=\"{partner}\",{rest}}}")
}

/// Item 1: an HTML 500 becomes a JSON-RPC 502 `upstream_bad_response`, counted as an
/// upstream error; a Partner's own JSON-RPC error at 500 passes unchanged.
#[tokio::test]
async fn an_html_error_page_becomes_a_jsonrpc_error() {
    let _ = capture();
    let (pki, _raw, gw) = faulty(&[
        ("logged-html", "/h", "html"),
        ("logged-jsonrpc", "/j", "jsonrpc"),
    ])
    .await;
    let a = pki.leader(LEADER_A, false);
    let r = within(
        10,
        a.post(gw.addr, "/h/rpc", &rpc_start("\"h1\"", LEADER_A, "t1")),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error(), (-32603, "upstream_bad_response".into()));
    let v = r.json();
    assert_eq!(v["id"], "h1", "the id is echoed");
    assert_eq!(v["error"]["data"]["upstreamStatus"], 500);
    assert_eq!(v["error"]["data"]["partner"], "logged-html");
    assert!(!r.text().contains("DOCTYPE"), "the page is discarded");

    let r = within(
        10,
        a.post(gw.addr, "/j/rpc", &rpc_start("\"j1\"", LEADER_A, "t2")),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 500);
    assert_eq!(
        r.body,
        RPC_ERROR.as_bytes(),
        "a JSON-RPC error is relayed as it is"
    );

    let line = access_line("logged-html").await;
    assert_eq!(
        (&line["status"], &line["code"], &line["reason"]),
        (
            &502.into(),
            &(-32603).into(),
            &"upstream_bad_response".into()
        ),
        "{line}"
    );
    let line = access_line("logged-jsonrpc").await;
    assert_eq!((&line["status"], &line["code"]), (&500.into(), &0.into()));

    let m = metric(
        &gw,
        &format!(
            "aipgw_requests_total{}",
            labels("logged-html", r#"method="rpc",status="502",code="-32603""#)
        ),
        1.0,
    )
    .await;
    let upstream = |p: &str, reason: &str| {
        m.get(&format!(
            "aipgw_upstream_errors_total{}",
            labels(p, &format!("reason=\"{reason}\""))
        ))
        .copied()
    };
    assert_eq!(upstream("logged-html", "upstream_bad_response"), Some(1.0));
    assert_eq!(upstream("logged-jsonrpc", "upstream_bad_response"), None);
    let key = format!(
        "aipgw_requests_total{}",
        labels("logged-html", r#"method="rpc",status="500",code="0""#)
    );
    assert_eq!(
        m.get(&key),
        None,
        "the page's 500 is not counted as relayed"
    );
}

/// Item 2: a body cut by a reset and by a clean close: the Leader gets the head, the
/// bytes sent and a cut; the log and metrics record the reason, an upstream error and
/// the bytes relayed.
#[tokio::test]
async fn a_body_cut_short_is_recorded_as_a_failure() {
    let _ = capture();
    let (pki, raw, gw) = faulty(&[
        ("logged-reset", "/r", "reset"),
        ("logged-close", "/c", "close"),
    ])
    .await;
    for (partner, prefix, reason, h2) in [
        ("logged-reset", "/r", "upstream_reset", false),
        ("logged-close", "/c", "upstream_closed_early", true),
    ] {
        let a = pki.leader(LEADER_A, h2);
        let path = format!("{prefix}/rpc");
        // Not a `start`: its answer would be read whole to settle the task claim.
        let body = Bytes::from(rpc_start("\"c\"", LEADER_A, "t").replace("\"start\"", "\"get\""));
        let (resp, _conn) = within(10, a.send(gw.addr, &path, body, &[])).await.unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while got.len() < HALF.len() {
            let f = within(10, body.frame()).await.unwrap().unwrap();
            got.extend_from_slice(&f.into_data().unwrap());
        }
        assert_eq!(got, HALF);
        raw.go.notify_one();
        let end = within(10, body.frame()).await;
        assert!(
            matches!(end, Some(Err(_))),
            "{partner}: the Leader's body must be cut, not ended: {end:?}"
        );

        let line = access_line(partner).await;
        assert_eq!(line["status"], 200, "{line}");
        assert_eq!(line["code"], -32603, "{line}");
        assert_eq!(line["reason"], reason, "{line}");
        assert_eq!(line["bytes_out"], HALF.len(), "{line}");

        let m = metric(
            &gw,
            &format!(
                "aipgw_upstream_errors_total{}",
                labels(partner, &format!("reason=\"{reason}\""))
            ),
            1.0,
        )
        .await;
        let ok = format!(
            "aipgw_requests_total{}",
            labels(partner, r#"method="rpc",status="200",code="0""#)
        );
        assert_eq!(m.get(&ok), None, "{partner}: not counted as a success");
        let failed = format!(
            "aipgw_requests_total{}",
            labels(partner, r#"method="rpc",status="200",code="-32603""#)
        );
        assert_eq!(m.get(&failed), Some(&1.0), "{partner}");
    }
}

/// Item 3: an event stream reset mid-event: the Leader gets the final error event; the
/// log, the upstream error count and the stream outcome record it.
#[tokio::test]
async fn a_reset_stream_is_logged_and_counted() {
    let _ = capture();
    let (pki, raw, gw) = faulty(&[("logged-sse", "/s", "sse")]).await;
    let a = pki.leader(LEADER_A, false);
    let mut stream = a
        .open_stream(
            gw.addr,
            "/s/stream",
            &stream_body("\"s\"", LEADER_A, "task-reset", "start", None),
            &[],
        )
        .await;
    assert_eq!(stream.status, 200);
    let first = within(10, stream.next_event()).await.unwrap();
    assert_eq!(first.seq(), Some(1));
    raw.go.notify_one();
    let last = within(10, stream.next_event()).await.unwrap();
    assert_eq!(last.json["error"]["code"], -32603, "{}", last.json);
    assert_eq!(last.json["error"]["data"]["reason"], "upstream_reset");
    assert_eq!(last.json["error"]["data"]["lastEventSeq"], 1);
    assert!(within(10, stream.next_event()).await.is_none());

    let line = access_line("logged-sse").await;
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["code"], -32603, "{line}");
    assert_eq!(line["reason"], "upstream_reset", "{line}");
    assert_eq!(line["events"], 1, "{line}");

    // Counted once, by the stream's recorder (its task ends just after the record).
    let key = format!(
        "aipgw_upstream_errors_total{}",
        labels("logged-sse", r#"reason="upstream_reset""#)
    );
    metric(&gw, &key, 1.0).await;
    let m = metric(
        &gw,
        &format!(
            "aipgw_streams_ended_total{}",
            labels("logged-sse", r#"outcome="upstream_reset""#)
        ),
        1.0,
    )
    .await;
    assert_eq!(m.get(&key), Some(&1.0), "once, not per follower");
    let failed = format!(
        "aipgw_requests_total{}",
        labels(
            "logged-sse",
            r#"method="stream",status="200",code="-32603""#
        )
    );
    assert_eq!(m.get(&failed), Some(&1.0));
}
