//! Issue 28, holes 1 to 3: a task belongs to the Leader whose start the Partner accepted,
//! whatever happens around that start: the Leader leaves before the answer, the gateway's
//! own response timeout fires, a refused start overlaps an accepted one (on one instance or
//! across two sharing Redis), or a `stream` start is answered with plain JSON. Each test
//! fails on the code before the fix; each waits on a signal (a request reaching the
//! Partner, a connection gauge, a settled-claim counter), never on a fixed sleep.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use crate::cluster::{RedisServer, Two, FAST};
use crate::support::*;

/// How the scripted Partner answers one request.
struct Answer {
    status: u16,
    content_type: &'static str,
    body: String,
}

impl Answer {
    fn result() -> Answer {
        Answer {
            status: 200,
            content_type: "application/json",
            body: r#"{"jsonrpc":"2.0","id":"p","result":{"state":"accepted"}}"#.into(),
        }
    }

    fn rpc_error() -> Answer {
        Answer {
            status: 200,
            content_type: "application/json",
            body: r#"{"jsonrpc":"2.0","id":"p","error":{"code":-32003,"message":"refused"}}"#
                .into(),
        }
    }
}

/// A Partner that answers every command at once with a result, except a `start`: each
/// start is reported to the test (its JSON-RPC id) and answered only when the test says
/// how ([`Scripted::answer`]).
struct Scripted {
    addr: SocketAddr,
    arrived: tokio::sync::Mutex<mpsc::UnboundedReceiver<String>>,
    waiting: Arc<Mutex<HashMap<String, oneshot::Sender<Answer>>>>,
    /// The commands that reached it, in order (`command taskId`).
    seen: Arc<Mutex<Vec<String>>>,
}

impl Scripted {
    async fn start() -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let waiting: Arc<Mutex<HashMap<String, oneshot::Sender<Answer>>>> = Arc::default();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let (w, s) = (waiting.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (tx, w, s) = (tx.clone(), w.clone(), s.clone());
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (tx, w, s) = (tx.clone(), w.clone(), s.clone());
                    async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        let m = &v["params"]["message"];
                        let command = m["command"].as_str().unwrap_or("").to_owned();
                        s.lock()
                            .unwrap()
                            .push(format!("{command} {}", m["taskId"].as_str().unwrap_or("")));
                        let answer = if command == "start" {
                            let id = v["id"].as_str().unwrap().to_owned();
                            let (atx, arx) = oneshot::channel();
                            w.lock().unwrap().insert(id.clone(), atx);
                            let _ = tx.send(id);
                            arx.await.unwrap_or_else(|_| Answer::result())
                        } else {
                            Answer::result()
                        };
                        let mut r = Response::new(Full::new(Bytes::from(answer.body)));
                        *r.status_mut() = StatusCode::from_u16(answer.status).unwrap();
                        r.headers_mut()
                            .insert("content-type", answer.content_type.parse().unwrap());
                        Ok::<_, Infallible>(r)
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Scripted {
            addr,
            arrived: tokio::sync::Mutex::new(rx),
            waiting,
            seen,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits for the next start to reach it; its JSON-RPC id.
    async fn next_start(&self) -> String {
        within(10, self.arrived.lock().await.recv())
            .await
            .expect("partner stopped")
    }

    /// Answers the start with this id.
    fn answer(&self, id: &str, answer: Answer) {
        let tx = self
            .waiting
            .lock()
            .unwrap()
            .remove(id)
            .expect("a start waits");
        let _ = tx.send(answer);
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// A command on `task` from `sender` (`rpc`, or `method` at the bare Partner prefix).
fn command(method: &str, id: &str, sender: &str, task: &str, cmd: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"{method}","id":"{id}","params":{{"message":{{"type":"message","id":"m-{id}","senderRole":"leader","senderId":"{sender}","command":"{cmd}","taskId":"{task}","sessionId":"s1"}}}}}}"#
    )
}

/// A Leader's request left hanging on an HTTP/2 connection of its own; dropping the
/// handle closes the connection, as a Leader whose process went away.
struct Hanging {
    conn: tokio::task::JoinHandle<()>,
    request: tokio::task::JoinHandle<Result<Response<Incoming>, hyper::Error>>,
}

impl Drop for Hanging {
    fn drop(&mut self) {
        self.request.abort();
        self.conn.abort();
    }
}

async fn send_and_hang(leader: &Leader, addr: SocketAddr, path: &str, body: String) -> Hanging {
    let tls = leader.connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::post(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let request = tokio::spawn(async move { send.send_request(req).await });
    Hanging { conn, request }
}

/// One gateway in front of a [`Scripted`] Partner `p` at `/p` (`partner_extra` added to
/// its block; `response_timeout` replacing the test config's), and the Leaders A (over
/// HTTP/2 when `a_h2`) and B. Keep the `Pki` bound: it holds the certificates.
async fn setup(
    a_h2: bool,
    partner_extra: &str,
    response_timeout: Option<&str>,
) -> (Pki, Scripted, TestGateway, Leader, Leader) {
    let pki = Pki::new();
    let partner = Scripted::start().await;
    let mut config = pki.config("", &partner_block("p", "/p", &partner.url(), partner_extra));
    if let Some(t) = response_timeout {
        config = config.replace(
            "response_timeout = \"5s\"",
            &format!("response_timeout = \"{t}\""),
        );
    }
    let gw = start_gateway(&config).await;
    let a = pki.leader(LEADER_A, a_h2);
    let b = pki.leader(LEADER_B, false);
    (pki, partner, gw, a, b)
}

/// A's `start` of `task` reaches the Partner, and A leaves before the answer (its
/// connection closed, and the gateway has seen it go); the start's id at the Partner.
async fn start_and_leave(gw: &TestGateway, partner: &Scripted, a: &Leader, task: &str) -> String {
    let body = command("rpc", "a1", LEADER_A, task, "start");
    let hanging = send_and_hang(a, gw.addr, "/p/rpc", body).await;
    let id = partner.next_start().await;
    drop(hanging);
    metric(gw, "aipgw_open_connections", 0.0).await; // the gateway saw A leave
    id
}

fn claims(outcome: &str) -> String {
    format!("aipgw_task_claims_total{{outcome=\"{outcome}\"}}")
}

/// Hole 1: A's start reaches the Partner, A leaves before the answer, the Partner accepts.
/// The task stays A's: B's `get` and `start` are refused before and after the answer, and
/// A, back on a new connection, is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_stays_claimed_when_its_leader_leaves() {
    let (_pki, partner, gw, a, b) = setup(true, "", None).await;
    let id = start_and_leave(&gw, &partner, &a, "victim-task").await;
    let get = command("rpc", "b1", LEADER_B, "victim-task", "get");
    let r = b.post(gw.addr, "/p/rpc", &get).await.unwrap();
    assert_eq!(
        r.error(),
        (-32009, "not_task_owner".into()),
        "while pending"
    );
    partner.answer(&id, Answer::result());
    metric(&gw, &claims("accepted"), 1.0).await; // read although A left
    let r = b.post(gw.addr, "/p/rpc", &get).await.unwrap();
    assert_eq!(
        r.error(),
        (-32009, "not_task_owner".into()),
        "after the answer"
    );
    let start = command("rpc", "b2", LEADER_B, "victim-task", "start");
    let r = b.post(gw.addr, "/p/rpc", &start).await.unwrap();
    assert_eq!(
        r.error(),
        (-32009, "not_task_owner".into()),
        "B cannot take it"
    );
    let r = a
        .post(
            gw.addr,
            "/p/rpc",
            &command("rpc", "a2", LEADER_A, "victim-task", "get"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        partner.seen(),
        ["start victim-task", "get victim-task"],
        "nothing of B's reached the Partner"
    );
}

/// Hole 1, the gateway's own timeout: A gets 504, the Partner accepts later; no answer
/// could be read in time, so the claim is kept (the Partner may have accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_timed_out_stays_claimed() {
    let (_pki, partner, gw, a, b) = setup(false, "", Some("300ms")).await;
    let start = command("rpc", "a1", LEADER_A, "late-task", "start");
    let (r, id) = tokio::join!(a.post(gw.addr, "/p/rpc", &start), partner.next_start());
    let r = r.unwrap();
    assert_eq!(
        (r.status.as_u16(), r.error().1),
        (504, "upstream_timeout".into())
    );
    metric(&gw, &claims("unanswered"), 1.0).await;
    let r = b
        .post(
            gw.addr,
            "/p/rpc",
            &command("rpc", "b1", LEADER_B, "late-task", "cancel"),
        )
        .await
        .unwrap();
    assert_eq!(r.error(), (-32009, "not_task_owner".into()));
    partner.answer(&id, Answer::result()); // too late for the gateway, but accepted
    let r = b
        .post(
            gw.addr,
            "/p/rpc",
            &command("rpc", "b2", LEADER_B, "late-task", "start"),
        )
        .await
        .unwrap();
    assert_eq!(r.error(), (-32009, "not_task_owner".into()));
}

/// Hole 1, the other way: a start refused after its Leader left still releases its
/// claim, because the answer is read all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_refused_after_its_leader_left_claims_nothing() {
    let (_pki, partner, gw, a, b) = setup(true, "", None).await;
    let id = start_and_leave(&gw, &partner, &a, "shared").await;
    partner.answer(&id, Answer::rpc_error());
    metric(&gw, &claims("refused"), 1.0).await;
    let start = command("rpc", "b1", LEADER_B, "shared", "start");
    let (r, ()) = tokio::join!(b.post(gw.addr, "/p/rpc", &start), async {
        let id = partner.next_start().await;
        partner.answer(&id, Answer::result());
    });
    assert_eq!(r.unwrap().status, 200, "B may start a task nobody holds");
}

/// Hole 2, one instance: two starts of A's overlap; the second is accepted, the first
/// refused after it. The refusal cannot undo the acceptance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_start_cannot_release_an_accepted_one() {
    let (_pki, partner, gw, a, b) = setup(false, "", None).await;
    let first = command("rpc", "a1", LEADER_A, "twice", "start");
    let second = command("rpc", "a2", LEADER_A, "twice", "start");
    let (gw_addr, a2) = (gw.addr, a.clone());
    let first = tokio::spawn(async move { a2.post(gw_addr, "/p/rpc", &first).await });
    assert_eq!(partner.next_start().await, "a1");
    let (r, ()) = tokio::join!(a.post(gw.addr, "/p/rpc", &second), async {
        assert_eq!(partner.next_start().await, "a2");
        partner.answer("a2", Answer::result());
    });
    assert_eq!(r.unwrap().status, 200);
    partner.answer("a1", Answer::rpc_error());
    let r = first.await.unwrap().unwrap();
    assert_eq!(r.json()["error"]["code"], -32003, "{}", r.text());
    metric(&gw, &claims("refused"), 1.0).await;
    let r = b
        .post(
            gw.addr,
            "/p/rpc",
            &command("rpc", "b1", LEADER_B, "twice", "get"),
        )
        .await
        .unwrap();
    assert_eq!(r.error(), (-32009, "not_task_owner".into()));
}

/// Hole 2, two instances on one Redis: A's task started through X; A's `notification/start`
/// of it through Y is refused by the Partner. Y may release only a claim that request
/// created, so B is still refused through Y.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_start_elsewhere_keeps_the_shared_claim() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let partner = Scripted::start().await;
    let url = partner.url();
    let (pki, partner, x, y, a) = Two::around(&redis, partner, &url, FAST, "")
        .await
        .into_parts();
    let b = pki.leader(LEADER_B, false);
    let start = command("rpc", "a1", LEADER_A, "shared", "start");
    let (r, ()) = tokio::join!(a.post(x.addr, "/p/rpc", &start), async {
        let id = partner.next_start().await;
        partner.answer(&id, Answer::result());
    });
    assert_eq!(r.unwrap().status, 200);
    metric(&x, &claims("accepted"), 1.0).await;
    let again = command("notification/start", "a2", LEADER_A, "shared", "start");
    let (r, ()) = tokio::join!(a.post(y.addr, "/p", &again), async {
        let id = partner.next_start().await;
        partner.answer(&id, Answer::rpc_error());
    });
    assert_eq!(r.unwrap().json()["error"]["code"], -32003);
    metric(&y, &claims("refused"), 1.0).await;
    // The settlement in Redis, if any, was sent before the counter moved; Redis answers
    // in order, so a command sent now sees it.
    for (i, cmd) in ["get", "start"].iter().enumerate() {
        let body = command("rpc", &format!("b{i}"), LEADER_B, "shared", cmd);
        let r = b.post(y.addr, "/p/rpc", &body).await.unwrap();
        assert_eq!(r.error(), (-32009, "not_task_owner".into()), "{cmd} via Y");
    }
}

/// Hole 3: a `stream` start answered with 200 `application/json` and a JSON-RPC result
/// is accepted like any start: the task is A's, and B's `cancel` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_start_answered_with_a_result_claims_its_task() {
    let (_pki, partner, gw, a, b) = setup(false, "", None).await;
    let start = command("stream", "a1", LEADER_A, "json-stream", "start");
    let (r, ()) = tokio::join!(a.post(gw.addr, "/p/stream", &start), async {
        let id = partner.next_start().await;
        partner.answer(&id, Answer::result());
    });
    let r = r.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["result"]["state"], "accepted");
    let r = b
        .post(
            gw.addr,
            "/p/rpc",
            &command("rpc", "b1", LEADER_B, "json-stream", "cancel"),
        )
        .await
        .unwrap();
    assert_eq!(r.error(), (-32009, "not_task_owner".into()));
    assert_eq!(partner.seen(), ["start json-stream"]);
}

/// A start whose Leader left is still work at the Partner: it keeps its Partner
/// in-flight permit until its answer is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_leader_left_holds_its_permit() {
    let (_pki, partner, gw, a, b) = setup(true, "[partner.limits]\nmax_in_flight = 1", None).await;
    let id = start_and_leave(&gw, &partner, &a, "busy").await;
    let get = command("rpc", "b1", LEADER_B, "other", "get");
    let r = b.post(gw.addr, "/p/rpc", &get).await.unwrap();
    assert_eq!(
        (r.status.as_u16(), r.error().1),
        (429, "partner_in_flight".into()),
        "the start is still at the Partner"
    );
    partner.answer(&id, Answer::result());
    metric(&gw, &claims("accepted"), 1.0).await;
    // The permit goes back as the start's task ends, just after the claim was settled.
    within(10, async {
        while b.post(gw.addr, "/p/rpc", &get).await.unwrap().status != 200 {
            tokio::task::yield_now().await;
        }
    })
    .await;
}
