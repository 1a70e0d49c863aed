//! The client against a scripted Partner speaking raw HTTP/1.1 on loopback.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;

/// What the Partner does with one request.
#[derive(Clone)]
enum Reply {
    /// Writes these bytes and keeps the connection.
    Send(&'static str),
    /// Writes these bytes and closes the connection.
    SendClose(&'static str),
    /// Writes these bytes after this many milliseconds (of tokio's clock).
    Late(u64, &'static str),
    /// Keeps the connection and never answers.
    Silent,
}

struct Partner {
    uri: Uri,
    accepted: Arc<AtomicUsize>,
    /// Each request's head and body as received.
    requests: Arc<Mutex<Vec<String>>>,
}

/// A Partner answering the n-th request (over all connections) with `replies[n]`.
async fn partner(replies: Vec<Reply>) -> Partner {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri: Uri = format!("http://{}", listener.local_addr().unwrap())
        .parse()
        .unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let (acc, reqs) = (accepted.clone(), requests.clone());
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            acc.fetch_add(1, Ordering::SeqCst);
            let (replies, next, reqs) = (replies.clone(), next.clone(), reqs.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request: its head, then content-length bytes.
                    let mut chunk = [0u8; 4096];
                    let end = loop {
                        if let Some(end) = crate::test_util::http1_message_end(&buf) {
                            break end;
                        }
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let request: Vec<u8> = buf.drain(..end).collect();
                    reqs.lock()
                        .unwrap()
                        .push(String::from_utf8(request).unwrap());
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    match replies.get(n).cloned() {
                        Some(Reply::Send(bytes)) => sock.write_all(bytes.as_bytes()).await.unwrap(),
                        Some(Reply::SendClose(bytes)) => {
                            sock.write_all(bytes.as_bytes()).await.unwrap();
                            return;
                        }
                        Some(Reply::Late(ms, bytes)) => {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            sock.write_all(bytes.as_bytes()).await.unwrap();
                        }
                        Some(Reply::Silent) => std::future::pending().await,
                        None => return,
                    }
                }
            });
        }
    });
    Partner {
        uri,
        accepted,
        requests,
    }
}

fn client(p: &Partner, max_idle: usize, idle_timeout: Duration) -> Arc<H1Client> {
    client_to(&p.uri, max_idle, idle_timeout)
}

fn client_to(uri: &Uri, max_idle: usize, idle_timeout: Duration) -> Arc<H1Client> {
    let tls = Arc::new(crate::upstream::plain_client_config().unwrap());
    let endpoint = Endpoint::new(uri, &tls, None).unwrap();
    Arc::new(H1Client::new(
        endpoint,
        Arc::new(Idle::new(1, max_idle, idle_timeout)),
        crate::upstream::budget::Budget::new(1000),
        Duration::from_secs(2),
        8192,
    ))
}

/// A deadline no test reaches.
fn far() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

fn post(p: &Partner, body: &'static str) -> Request<Full<Bytes>> {
    let uri: Uri = format!("{}rpc", p.uri).parse().unwrap();
    Request::post(uri)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// Sends a request and reads its whole body.
async fn call(c: &Arc<H1Client>, p: &Partner, body: &'static str) -> Result<(u16, String), String> {
    let resp = c
        .clone()
        .send(post(p, body), far())
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8(bytes.to_vec()).unwrap()))
}

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";

#[tokio::test]
async fn a_connection_carries_request_after_request() {
    let p = partner(vec![Reply::Send(OK); 3]).await;
    let c = client(&p, 8, Duration::from_secs(60));
    for _ in 0..3 {
        assert_eq!(call(&c, &p, "[1]").await.unwrap(), (200, "{}".into()));
    }
    assert_eq!(p.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(c.idle().len(), 1);
    let first = p.requests.lock().unwrap()[0].clone();
    assert!(
        first.starts_with("POST /rpc HTTP/1.1\r\nhost: 127.0.0.1:"),
        "{first}"
    );
    assert!(first.ends_with("content-type: application/json\r\ncontent-length: 3\r\n\r\n[1]"));
}

#[tokio::test]
async fn chunked_and_close_delimited_bodies_arrive_whole() {
    let p = partner(vec![
        Reply::Send("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n"),
        Reply::SendClose("HTTP/1.1 200 OK\r\n\r\nuntil the end"),
        Reply::Send(OK),
    ])
    .await;
    let c = client(&p, 8, Duration::from_secs(60));
    assert_eq!(call(&c, &p, "").await.unwrap(), (200, "abcde".into()));
    assert_eq!(
        call(&c, &p, "").await.unwrap(),
        (200, "until the end".into())
    );
    assert_eq!(
        c.idle().len(),
        0,
        "a close-delimited body's connection is not kept"
    );
    assert_eq!(call(&c, &p, "").await.unwrap(), (200, "{}".into()));
    assert_eq!(p.accepted.load(Ordering::SeqCst), 2);
}

/// A Partner that sends more than its response (here a whole second response) must not
/// have those bytes taken as the answer to the next request on the connection.
#[tokio::test]
async fn bytes_after_a_response_never_answer_the_next_request() {
    let p = partner(vec![
        Reply::Send("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nsmuggled"),
        Reply::Send("HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nhonest"),
    ])
    .await;
    let c = client(&p, 8, Duration::from_secs(60));
    assert_eq!(call(&c, &p, "").await.unwrap(), (200, "{}".into()));
    // The extra bytes may arrive with the response or just after it: either way the
    // connection is not reused.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(call(&c, &p, "").await.unwrap(), (200, "honest".into()));
    assert_eq!(p.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_connection_the_partner_closed_while_idle_is_not_used() {
    let p = partner(vec![Reply::SendClose(OK), Reply::SendClose(OK)]).await;
    let c = client(&p, 8, Duration::from_secs(60));
    assert_eq!(call(&c, &p, "").await.unwrap(), (200, "{}".into()));
    // The Partner closes after answering (without saying so): the close reaches the idle
    // connection, which the next request sees and leaves.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(call(&c, &p, "").await.unwrap(), (200, "{}".into()));
    assert_eq!(p.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn connection_close_and_early_drops_are_not_kept() {
    let p = partner(vec![
        Reply::Send("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"),
        Reply::Send("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345"),
        Reply::Send(OK),
    ])
    .await;
    let c = client(&p, 8, Duration::from_secs(60));
    assert_eq!(call(&c, &p, "").await.unwrap(), (200, "{}".into()));
    assert_eq!(c.idle().len(), 0);
    // Half a body, then the response is dropped: the connection goes with it.
    let resp = c.clone().send(post(&p, ""), far()).await.unwrap();
    let mut body = resp.into_body();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "12345"
    );
    drop(body);
    assert_eq!(c.idle().len(), 0);
    assert_eq!(call(&c, &p, "").await.unwrap(), (200, "{}".into()));
    assert_eq!(p.accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_body_cut_by_a_close_is_an_unexpected_eof() {
    let p = partner(vec![Reply::SendClose(
        "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345",
    )])
    .await;
    let c = client(&p, 8, Duration::from_secs(60));
    let resp = c.clone().send(post(&p, ""), far()).await.unwrap();
    let Err(err) = resp.into_body().collect().await else {
        panic!("the body was read whole")
    };
    let BodyError::Io(io) = &err else {
        panic!("{err}")
    };
    assert_eq!(io.kind(), io::ErrorKind::UnexpectedEof);
    assert_eq!(
        // As the relay gets it: boxed by the body it reads.
        crate::relay_body::RelayError::from_upstream(&*crate::body::BoxError::from(err)),
        crate::relay_body::RelayError::ClosedEarly
    );
}

#[tokio::test]
async fn failures_before_the_head_are_told_apart() {
    let p = partner(vec![
        Reply::SendClose(""),
        Reply::SendClose(
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n",
        ),
        Reply::Send(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n",
        ),
    ])
    .await;
    let c = client(&p, 8, Duration::from_secs(60));
    let e = c
        .clone()
        .send(post(&p, ""), far())
        .await
        .err()
        .expect("a failure");
    assert!(matches!(e, H1Error::ClosedBeforeHead), "{e}");
    let e = c
        .clone()
        .send(post(&p, ""), far())
        .await
        .err()
        .expect("a failure");
    assert!(matches!(e, H1Error::Wire(WireError::Framing(_))), "{e}");
    assert_eq!(call(&c, &p, "").await.unwrap(), (201, String::new()));
    assert_eq!(
        c.idle().len(),
        1,
        "an empty body's connection is kept at once"
    );

    let c = client_to(
        &Uri::from_static("http://127.0.0.1:1/"),
        8,
        Duration::from_secs(60),
    );
    let req = Request::post("http://127.0.0.1:1/rpc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let e = c.send(req, far()).await.err().expect("a failure");
    assert!(matches!(e, H1Error::Connect(ConnectError::Tcp(_))), "{e}");
}

#[tokio::test]
async fn idle_connections_are_bounded_in_number_and_time() {
    let p = partner(vec![Reply::Send(OK); 6]).await;
    let c = client(&p, 2, Duration::from_secs(60));
    // Three requests at once take three connections; two of them are kept.
    let (a, b, d) = tokio::join!(call(&c, &p, ""), call(&c, &p, ""), call(&c, &p, ""));
    for r in [a, b, d] {
        assert_eq!(r.unwrap(), (200, "{}".into()));
    }
    assert_eq!(p.accepted.load(Ordering::SeqCst), 3);
    assert_eq!(c.idle().len(), 2);
    assert_eq!(c.idle().sweep(), 2);

    let c = client(&p, 2, Duration::from_millis(200));
    assert_eq!(call(&c, &p, "").await.unwrap(), (200, "{}".into()));
    assert_eq!(c.idle().len(), 1);
    let now = tokio::time::Instant::now();
    let at = |ms| now + Duration::from_millis(ms);
    assert_eq!(c.idle().sweep_at(at(100)), 1, "within pool_idle_timeout");
    assert_eq!(c.idle().sweep_at(at(250)), 0, "past pool_idle_timeout");
    assert_eq!(call(&c, &p, "").await.unwrap(), (200, "{}".into()));
    assert_eq!(p.accepted.load(Ordering::SeqCst), 5);
}

/// Sends a request due in `ms` and reads its whole body; the error if it failed.
async fn call_due(c: &Arc<H1Client>, p: &Partner, ms: u64) -> Result<u16, H1Error> {
    let due = Instant::now() + Duration::from_millis(ms);
    let resp = c.clone().send(post(p, ""), due).await?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await.expect("the body");
    Ok(status)
}

/// How long since `t`, to the millisecond the timer wheel rounds up to.
fn ms_since(t: Instant) -> u128 {
    (Instant::now() - t).as_millis()
}

#[tokio::test(start_paused = true)]
async fn a_reused_connection_bounds_each_request_by_its_own_deadline() {
    let p = partner(vec![
        Reply::Send(OK),
        Reply::Silent,
        Reply::Send(OK),
        Reply::Late(400, OK),
        Reply::Silent,
    ])
    .await;
    let c = client(&p, 8, Duration::from_secs(600));
    // Due in 10 s, answered at once: the connection is kept with its timer at 10 s.
    assert_eq!(call_due(&c, &p, 10_000).await.unwrap(), 200);
    // The next on it is due in 150 ms and not answered: it fails then, not at 10 s.
    let t = Instant::now();
    let e = call_due(&c, &p, 150).await.expect_err("a timeout");
    assert!(matches!(e, H1Error::TimedOut), "{e}");
    assert_eq!(ms_since(t), 150);
    // A new connection: due in 100 ms, answered at once. Its deadline passes while it is
    // idle (the timer fires with no request on it).
    assert_eq!(call_due(&c, &p, 100).await.unwrap(), 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The next on it, due in 2 s and answered after 400 ms, is not cut by the old one.
    let t = Instant::now();
    assert_eq!(call_due(&c, &p, 2_000).await.unwrap(), 200);
    assert_eq!(ms_since(t), 400);
    // And a later, earlier deadline still fires on time.
    let t = Instant::now();
    let e = call_due(&c, &p, 250).await.expect_err("a timeout");
    assert!(matches!(e, H1Error::TimedOut), "{e}");
    assert_eq!(ms_since(t), 250);
    assert_eq!(
        p.accepted.load(Ordering::SeqCst),
        2,
        "each timer on a kept connection"
    );
}
