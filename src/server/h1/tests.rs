//! The connection over an in-memory stream, with the clock paused: pipelining,
//! `Expect: 100-continue`, `Connection: close` and HTTP/1.0, bodies left unread, a client
//! leaving, the header bound, the release of idle buffers; and, on the same inputs as
//! hyper's HTTP/1.1 server, the same decisions (the differential test).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;

const SETTINGS: Settings = Settings {
    header_read: Duration::from_secs(10),
    release_after: Duration::ZERO,
    write_stall: Duration::from_secs(30),
    limits: Limits {
        max_head_bytes: 16 * 1024,
        max_headers: 100,
    },
};

/// Reads the whole body and answers with what it read, `x-method` and `x-path`.
async fn echo<B>(req: Request<B>) -> Result<Response<Full<Bytes>>, Infallible>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        // A body that cannot be read: refused, as the request path refuses it.
        return Ok(Response::builder()
            .status(400)
            .body(Full::new(Bytes::new()))
            .unwrap());
    };
    Ok(Response::builder()
        .header("x-method", parts.method.as_str())
        .header("x-path", parts.uri.path())
        .body(Full::new(body))
        .unwrap())
}

/// Serves one connection with `settings` and [`echo`]; the client's end.
fn serve(settings: Settings) -> (DuplexStream, tokio::task::JoinHandle<Result<(), H1Error>>) {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let conn = Conn::new(server, service_fn(echo::<RequestBody>), settings, None);
    (client, tokio::spawn(conn))
}

/// Everything the server writes within `wait` (virtual time), and whether it closed.
async fn read_for(client: &mut DuplexStream, wait: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&out).into_owned(), true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), false),
        }
    }
}

/// The answers in `text`: (status, body) each, in order.
fn answers(text: &str) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("HTTP/1.") {
        rest = &rest[at..];
        let status: u16 = rest[9..12].parse().unwrap_or(0);
        let Some(end) = rest.find("\r\n\r\n") else {
            break;
        };
        let head = &rest[..end].to_ascii_lowercase();
        rest = &rest[end + 4..];
        if status == 100 {
            out.push((100, String::new()));
            continue;
        }
        let body = if let Some(cl) = head
            .split("\r\n")
            .find_map(|l| l.strip_prefix("content-length: "))
        {
            let n: usize = cl.parse().unwrap();
            let n = n.min(rest.len());
            let b = rest[..n].to_string();
            rest = &rest[n..];
            b
        } else if head.contains("transfer-encoding: chunked") {
            let mut b = String::new();
            while let Some(line_end) = rest.find("\r\n") {
                let size = usize::from_str_radix(&rest[..line_end], 16).unwrap_or(0);
                rest = &rest[line_end + 2..];
                if size == 0 {
                    rest = rest.get(2..).unwrap_or("");
                    break;
                }
                b.push_str(&rest[..size.min(rest.len())]);
                rest = rest.get(size + 2..).unwrap_or("");
            }
            b
        } else {
            std::mem::take(&mut rest).to_string()
        };
        out.push((status, body));
    }
    out
}

const POST: &str = "POST /p/rpc HTTP/1.1\r\nhost: gw\r\ncontent-length: 5\r\n\r\nhello";

#[tokio::test(start_paused = true)]
async fn pipelined_requests_are_answered_in_order() {
    let (mut client, _server) = serve(SETTINGS);
    let chunked = "POST /two HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nx-t: 1\r\n\r\n";
    let third = "GET /three HTTP/1.1\r\nhost: gw\r\n\r\n";
    client
        .write_all(format!("{POST}{chunked}{third}").as_bytes())
        .await
        .unwrap();
    let (text, closed) = read_for(&mut client, Duration::from_secs(1)).await;
    assert!(!closed, "{text}");
    assert_eq!(
        answers(&text),
        [
            (200, "hello".into()),
            (200, "abcde".into()),
            (200, String::new())
        ],
        "{text}"
    );
    let paths: Vec<_> = text
        .match_indices("x-path: ")
        .map(|(i, _)| &text[i + 8..i + 12])
        .collect();
    assert_eq!(paths, ["/p/r", "/two", "/thr"]);
}

#[tokio::test(start_paused = true)]
async fn expect_100_continue_is_answered_when_the_body_is_read() {
    let (mut client, _server) = serve(SETTINGS);
    client
        .write_all(
            b"POST / HTTP/1.1\r\nhost: gw\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    let (text, _) = read_for(&mut client, Duration::from_secs(1)).await;
    assert_eq!(text, "HTTP/1.1 100 Continue\r\n\r\n");
    client.write_all(b"hello").await.unwrap();
    let (text, _) = read_for(&mut client, Duration::from_secs(1)).await;
    assert_eq!(answers(&text), [(200, "hello".into())], "{text}");
}

#[tokio::test(start_paused = true)]
async fn connection_close_and_http10_end_the_connection_after_the_answer() {
    for (request, keeps) in [
        (
            "GET / HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n",
            false,
        ),
        ("GET / HTTP/1.0\r\n\r\n", false),
        ("GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n", true),
        ("GET / HTTP/1.1\r\nhost: gw\r\n\r\n", true),
    ] {
        let (mut client, server) = serve(SETTINGS);
        client.write_all(request.as_bytes()).await.unwrap();
        let (text, closed) = read_for(&mut client, Duration::from_secs(1)).await;
        assert_eq!(answers(&text).len(), 1, "{request:?}: {text}");
        assert_eq!(closed, !keeps, "{request:?}: {text}");
        assert_eq!(text.contains("connection: close"), !keeps, "{text}");
        if !keeps {
            assert!(server.await.unwrap().is_ok());
        }
    }
}

/// Answers without reading the body: a body already here is skipped and the connection
/// serves the next request; one still on its way closes the connection after the answer
/// (its bytes would otherwise be read as the next head).
#[tokio::test(start_paused = true)]
async fn a_body_left_unread_is_skipped_or_closes_the_connection() {
    let refuse = |_req: Request<RequestBody>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .status(403)
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
    };
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    tokio::spawn(Conn::new(server, service_fn(refuse), SETTINGS, None));
    client
        .write_all(format!("{POST}{POST}").as_bytes())
        .await
        .unwrap();
    let (text, closed) = read_for(&mut client, Duration::from_secs(1)).await;
    assert_eq!(answers(&text).len(), 2, "{text}");
    assert!(!closed);
    // Half of a body: the answer says close, and the rest is never read as a head.
    client
        .write_all(b"POST / HTTP/1.1\r\nhost: gw\r\ncontent-length: 100\r\n\r\nGET /smuggled")
        .await
        .unwrap();
    let (text, closed) = read_for(&mut client, Duration::from_secs(1)).await;
    assert_eq!(answers(&text).len(), 1, "{text}");
    assert!(text.contains("connection: close"), "{text}");
    assert!(closed);
}

/// A client that leaves while its request is in flight ends the request (its future is
/// dropped) and the connection.
#[tokio::test(start_paused = true)]
async fn a_client_leaving_mid_request_ends_it() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let seen = dropped.clone();
    let hang = move |_req: Request<RequestBody>| {
        let guard = crate::server::scopeguard({
            let seen = seen.clone();
            move || {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    };
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let task = tokio::spawn(Conn::new(server, service_fn(hang), SETTINGS, None));
    client.write_all(POST.as_bytes()).await.unwrap();
    tokio::task::yield_now().await;
    drop(client);
    let ended = tokio::time::timeout(Duration::from_secs(1), task).await;
    assert!(ended.is_ok(), "the connection outlived its client");
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
}

/// The header bound runs from a head's first byte: an idle connection is not closed by
/// it, a stalled head is, without an answer.
#[tokio::test(start_paused = true)]
async fn a_head_must_be_whole_within_the_header_bound_of_its_first_byte() {
    let settings = Settings {
        header_read: Duration::from_secs(2),
        ..SETTINGS
    };
    let (mut client, server) = serve(settings);
    // Idle for longer than the bound: still open, and serves.
    let (_, closed) = read_for(&mut client, Duration::from_secs(5)).await;
    assert!(!closed);
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: g")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let (text, closed) = read_for(&mut client, Duration::from_secs(5)).await;
    assert!(closed && text.is_empty(), "{text}");
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert!(matches!(server.await.unwrap(), Err(H1Error::HeadTimeout)));
}

/// A client that reads nothing of a large answer loses the connection after the write
/// bound (the answer's state with it); one that reads, however slowly, keeps it.
#[tokio::test(start_paused = true)]
async fn a_client_that_reads_nothing_loses_the_connection_after_the_write_bound() {
    let big = |_req: Request<RequestBody>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(vec![b'x'; 1 << 20]))))
    };
    let settings = Settings {
        write_stall: Duration::from_secs(3),
        ..SETTINGS
    };
    // A small pipe: the answer fills it at once.
    let (mut client, server) = tokio::io::duplex(4096);
    let task = tokio::spawn(Conn::new(server, service_fn(big), settings, None));
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("a client reading nothing held the connection")
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert!(
        matches!(&ended, Err(H1Error::Io(e)) if e.kind() == io::ErrorKind::TimedOut),
        "{ended:?}"
    );
    // Read slowly (a piece every 2 s, under the bound): the whole answer arrives.
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let task = tokio::spawn(Conn::new(server, service_fn(big), settings, None));
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut got = 0;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        match client.read(&mut buf).await.unwrap() {
            0 => break,
            n => got += n,
        }
    }
    assert!(got > 1 << 20, "{got}");
    assert!(task.await.unwrap().is_ok());
}

/// A refused head is answered with its status and a JSON-RPC error, then closed.
#[tokio::test(start_paused = true)]
async fn a_refused_head_is_answered_then_closed() {
    let (mut client, server) = serve(SETTINGS);
    client
        .write_all(b"POST / HTTP/1.1\r\nhost: gw\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n")
        .await
        .unwrap();
    let (text, closed) = read_for(&mut client, Duration::from_secs(1)).await;
    assert!(closed);
    assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
    assert!(text.contains(r#""code":-32600"#), "{text}");
    let e = server.await.unwrap().unwrap_err();
    assert_eq!(e.malformed(), Some(("bad_transfer_encoding", 400)));
}

/// Idle past the release delay, the connection keeps no buffer and no request state; the
/// next request takes them again and is served.
#[tokio::test(start_paused = true)]
async fn an_idle_connection_lets_its_buffers_go() {
    let settings = Settings {
        release_after: Duration::from_millis(100),
        ..SETTINGS
    };
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let gauge = Gauge::default();
    let conn = Conn::new(
        server,
        service_fn(echo::<RequestBody>),
        settings,
        Some(gauge.clone()),
    );
    let conn = Arc::new(Mutex::new(conn));
    let polled = conn.clone();
    tokio::spawn(std::future::poll_fn(move |cx| {
        let mut c = polled.lock().unwrap();
        Pin::new(&mut *c).poll(cx)
    }));
    for round in 0..3 {
        client.write_all(POST.as_bytes()).await.unwrap();
        let (text, _) = read_for(&mut client, Duration::from_millis(50)).await;
        assert_eq!(
            answers(&text),
            [(200, "hello".into())],
            "round {round}: {text}"
        );
        {
            let c = conn.lock().unwrap();
            assert!(c.read.capacity() > 0 && c.in_flight.is_some());
        }
        assert_eq!(gauge.get(), 0);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let c = conn.lock().unwrap();
        assert_eq!(gauge.get(), 1);
        assert_eq!(c.read.capacity(), 0);
        assert_eq!(c.write.capacity(), 0);
        assert!(c.in_flight.is_none() && c.headers.is_none() && c.shared.is_none());
    }
}

/// What a server made of one input: its answers (status and body each), and whether it
/// answered nothing and closed (`refused`) or answered nothing and waits.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// Answered 2xx to every request it read (the echoed bodies, in order).
    Served(Vec<String>),
    /// Answered 4xx/5xx (after any it served), or closed without an answer.
    Refused(Vec<String>),
    /// Answered nothing, waits for more.
    Waiting,
}

fn decision(text: &str, closed: bool) -> Decision {
    let answers = answers(text);
    let served: Vec<String> = answers
        .iter()
        .filter(|(s, _)| (200..300).contains(s))
        .map(|(_, b)| b.clone())
        .collect();
    if answers.iter().any(|(s, _)| *s >= 400) || (answers.is_empty() && closed) {
        return Decision::Refused(served);
    }
    if answers.is_empty() {
        return Decision::Waiting;
    }
    Decision::Served(served)
}

async fn ours(input: &[u8]) -> Decision {
    let (mut client, _server) = serve(SETTINGS);
    let _ = client.write_all(input).await;
    let (text, closed) = read_for(&mut client, Duration::from_secs(1)).await;
    decision(&text, closed)
}

async fn hypers(input: &[u8]) -> Decision {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(
        hyper_util::rt::TokioIo::new(server),
        service_fn(echo::<hyper::body::Incoming>),
    );
    tokio::spawn(conn);
    let _ = client.write_all(input).await;
    let (text, closed) = read_for(&mut client, Duration::from_secs(1)).await;
    decision(&text, closed)
}

/// Inputs both servers must decide alike, and those this server refuses where hyper
/// serves (each for a reason stated in `head`'s documentation).
const SAME: &[&str] = &[
    "POST /p/rpc HTTP/1.1\r\nhost: gw\r\ncontent-length: 5\r\n\r\nhello",
    "POST /p/rpc HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "POST /p/rpc HTTP/1.1\r\nhost: gw\r\ncontent-length: 2\r\n\r\nhelloGET / HTTP/1.1\r\nhost: gw\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: gw\r\ncontent-length: -1\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: gw\r\ncontent-length: 1x\r\n\r\nh",
    "POST / HTTP/1.1\r\nhost: gw\r\ncontent-length: 5, 5\r\n\r\nhello",
    "POST / HTTP/1.1\r\nhost: gw\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!",
    "POST / HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloX\r\n0\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: gw\r\nX-A: 1\r\n folded\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: gw\r\ncontent-length : 5\r\n\r\nhello",
    "POST / HTTP/1.1\r\nhost: gw\r\nx-a: a\0b\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: gw\r\n",
    "GET / HTTP/2.0\r\nhost: gw\r\n\r\n",
    "G T / HTTP/1.1\r\nhost: gw\r\n\r\n",
    "\r\n\r\nGET / HTTP/1.1\r\nhost: gw\r\n\r\n",
    "GET / HTTP/1.0\r\n\r\n",
    // A size, a space and more: hyper refuses it too (the merged decoder does since).
    "POST / HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n5 5\r\nhello\r\n0\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n5 ;a=b\r\nhello\r\n0\r\n\r\n",
    // Trailer lines that are not fields.
    "POST / HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\t\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\tx\r\n\r\n",
];

const STRICTER: &[&str] = &[
    // Two Content-Lengths that agree: hyper reads one length.
    "POST / HTTP/1.1\r\nhost: gw\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\nhello",
    // A coding before chunked: hyper hands the coded body on.
    "POST / HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    // Bare LFs: hyper (httparse) takes them for line ends.
    "POST / HTTP/1.1\nhost: gw\ncontent-length: 5\n\nhello",
    // No Host, two Hosts.
    "GET / HTTP/1.1\r\n\r\n",
    "GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
    // Transfer-Encoding with Content-Length.
    "POST / HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n",
    // An absolute-form target naming another host than Host.
    "GET http://b/ HTTP/1.1\r\nhost: a\r\n\r\n",
    // A control byte in a chunk extension (not a token or quoted string): hyper skips it.
    "POST / HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n5;a\x01\r\nhello\r\n0\r\n\r\n",
];

#[tokio::test(start_paused = true)]
async fn the_same_inputs_are_decided_as_hyper_decides_them() {
    for input in SAME {
        let (a, b) = (ours(input.as_bytes()).await, hypers(input.as_bytes()).await);
        assert_eq!(a, b, "{input:?}");
    }
    for input in STRICTER {
        let (a, b) = (ours(input.as_bytes()).await, hypers(input.as_bytes()).await);
        assert!(
            matches!(a, Decision::Refused(ref s) if s.is_empty()),
            "{input:?}: {a:?}"
        );
        assert!(matches!(b, Decision::Served(_)), "{input:?}: hyper {b:?}");
    }
}

/// A small deterministic generator (xorshift), so a failure names its case.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const PIECES: &[&str] = &[
    "\r\n",
    "\n",
    "\r",
    " ",
    "\t",
    ":",
    ",",
    "0",
    "5",
    "a",
    "chunked",
    "\0",
    "\x01",
    ";",
    "-",
    "content-length: 5\r\n",
    "transfer-encoding: chunked\r\n",
    "host: gw\r\n",
    "connection: close\r\n",
    "0\r\n\r\n",
    "5\r\nhello\r\n",
    "GET / HTTP/1.1\r\n",
];

/// The reasons this server refuses for where hyper serves (or waits): the `STRICTER`
/// inputs' reasons.
const STRICTER_REASONS: &[&str] = &[
    "bare_lf",
    "bad_host",
    "bad_content_length",
    "bad_transfer_encoding",
    "bad_chunk_extension",
    // hyper refuses a trailer line that is not a field at the empty line after it; this
    // server at the line's first byte (hyper waits meanwhile).
    "bad_trailer",
];

/// Mutations of valid requests, each decided by both servers: wherever hyper serves, this
/// server serves the same bodies or refuses for one of the reasons it is stricter for; it
/// never serves what hyper refuses, nor waits where hyper decides.
#[tokio::test(start_paused = true)]
async fn mutated_requests_are_never_read_differently_from_hyper() {
    let seeds = [
        SAME[0],
        SAME[1],
        SAME[2],
        "GET /a HTTP/1.1\r\nhost: gw\r\n\r\nGET /b HTTP/1.1\r\nhost: gw\r\n\r\n",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut same, mut stricter) = (0, 0);
    for case in 0..3000 {
        let mut input = seeds[rng.below(seeds.len())].as_bytes().to_vec();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(input.len() + 1);
            match rng.below(3) {
                0 => {
                    let piece = PIECES[rng.below(PIECES.len())].as_bytes();
                    input.splice(at..at, piece.iter().copied());
                }
                1 if at < input.len() => {
                    let n = (1 + rng.below(4)).min(input.len() - at);
                    input.drain(at..at + n);
                }
                _ if at < input.len() => input[at] = PIECES[rng.below(PIECES.len())].as_bytes()[0],
                _ => {}
            }
        }
        let (a, b) = (ours(&input).await, hypers(&input).await);
        let text = String::from_utf8_lossy(&input);
        if a == b {
            same += 1;
            continue;
        }
        // Stricter: what hyper served is refused here, after the same earlier answers;
        // the reason is one of those `head` states.
        // Why this server refused: the head's reason, or the chunked body's.
        let read = super::pieces::requests_in_pieces(&input, input.len());
        let last = read.lines().last().unwrap_or("");
        let reason = last.strip_prefix("bad body: ").or_else(|| {
            last.strip_prefix("refused ")
                .map(|r| r.get(4..).unwrap_or(""))
        });
        // Waiting for the rest of a head hyper refused from its first bad byte: its end
        // makes this server refuse it too, after the same answers.
        if let (Decision::Served(s) | Decision::Refused(s), Decision::Refused(t)) = (&a, &b) {
            if !matches!(a, Decision::Refused(_)) && s == t {
                let mut ended = input.clone();
                ended.extend_from_slice(b"\r\n\r\n");
                let again = ours(&ended).await;
                assert_eq!(again, b, "case {case}: {text:?} ended");
                same += 1;
                continue;
            }
        }
        if a == Decision::Waiting && matches!(b, Decision::Refused(ref t) if t.is_empty()) {
            let mut ended = input.clone();
            ended.extend_from_slice(b"\r\n\r\n");
            assert_eq!(ours(&ended).await, b, "case {case}: {text:?} ended");
            same += 1;
            continue;
        }
        match (&a, &b) {
            (
                Decision::Refused(ours_served),
                Decision::Served(theirs) | Decision::Refused(theirs),
            ) if theirs.starts_with(ours_served)
                && reason.is_some_and(|r| STRICTER_REASONS.contains(&r)) =>
            {
                stricter += 1;
            }
            // Stricter, where hyper waits for more of a message read its way (a body, or
            // trailers after a bare LF).
            (Decision::Refused(ours_served), Decision::Waiting)
                if ours_served.is_empty()
                    && reason.is_some_and(|r| STRICTER_REASONS.contains(&r)) =>
            {
                stricter += 1;
            }
            // hyper answers a head it refuses mid-way with what it served before; a
            // chunked body's bad framing after the answer: both end the connection.
            _ => panic!("case {case}: {text:?}\n ours {a:?}\nhyper {b:?} (reason {reason:?})"),
        }
    }
    // The cases were not all trivially alike.
    assert!(
        same > 1000 && stricter > 10,
        "same {same}, stricter {stricter}"
    );
}
