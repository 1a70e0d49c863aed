//! A demo Partner: a plain-HTTP AIP Partner implementing the task state machine.
//!
//! - `rpc` (`/rpc`, and `/acps-aip-v1/rpc` as v1 reference Partners expose it): `start`
//!   answers at once with a product and `awaiting-completion`; `get`, `continue`,
//!   `cancel`, `complete` follow the spec's transition table (a command that does not
//!   apply to the current state is ignored and the task returned as it is).
//! - `stream`: `start` answers with SSE events: `working`, product chunks,
//!   `awaiting-completion`, with increasing `eventSeq`; the stream stays open until the
//!   Leader completes or cancels the task over `rpc`, then sends that terminal state and
//!   closes. It does not implement `re-stream` (it answers -32004), so the gateway's own
//!   replay can be shown.
//! - `notification/*`: -32003; `group`: -32007; `GET /health`.
//!
//! For demos and tests only: tasks live in memory, capped at `max_tasks`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::body::{BoxError, ResponseBody};

/// Demo Partner settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Product chunks per stream.
    pub stream_chunks: usize,
    /// Pause between stream events.
    pub event_interval: Duration,
    /// Most tasks kept; new ones are refused beyond it.
    pub max_tasks: usize,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            stream_chunks: 3,
            event_interval: Duration::from_millis(200),
            max_tasks: 10_000,
        }
    }
}

#[derive(Debug, Clone)]
struct Task {
    id: String,
    session_id: String,
    state: &'static str,
    changed_at: String,
    products: Vec<Value>,
}

/// Which AIP generation a request spoke; the answer speaks the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gen {
    /// v01.00: `params.message`, Task results, `status-update` events.
    V1,
    /// v02.01: `params.command` (a TaskCommand), TaskResult results, `task-status-update`.
    V2,
}

impl Gen {
    fn status_event(self) -> &'static str {
        match self {
            Gen::V1 => "status-update",
            Gen::V2 => "task-status-update",
        }
    }
}

impl Task {
    fn to_json(&self, generation: Gen) -> Value {
        let status = json!({"state": self.state, "stateChangedAt": self.changed_at});
        match generation {
            Gen::V1 => json!({
                "type": "task",
                "id": self.id,
                "status": status,
                "products": self.products,
                "sessionId": self.session_id,
            }),
            Gen::V2 => json!({
                "type": "task-result",
                "id": format!("result-{}-{}", self.id, self.changed_at),
                "sentAt": now(),
                "taskId": self.id,
                "status": status,
                "products": self.products,
                "senderRole": "partner",
                "senderId": crate::devcerts::DEV_PARTNER_AIC,
                "sessionId": self.session_id,
            }),
        }
    }

    fn set(&mut self, state: &'static str) {
        self.state = state;
        self.changed_at = now();
    }
}

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The demo Partner's state.
pub struct DemoPartner {
    opts: DemoOptions,
    tasks: Mutex<HashMap<String, Task>>,
    /// Open streams waiting for their task's terminal state.
    watchers: Mutex<HashMap<String, tokio::sync::watch::Sender<&'static str>>>,
}

fn rpc_result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn rpc_error(id: &Value, code: i32, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn json_response(v: &Value) -> Response<ResponseBody> {
    let mut r = Response::new(
        Full::new(Bytes::from(v.to_string()))
            .map_err(|n| match n {})
            .boxed_unsync(),
    );
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn text_of(message: &Value) -> String {
    message["dataItems"]
        .as_array()
        .and_then(|items| items.iter().find_map(|i| i["text"].as_str()))
        .unwrap_or("(no text)")
        .to_owned()
}

impl DemoPartner {
    /// A new demo Partner.
    pub fn new(opts: DemoOptions) -> Arc<DemoPartner> {
        Arc::new(DemoPartner {
            opts,
            tasks: Mutex::new(HashMap::new()),
            watchers: Mutex::new(HashMap::new()),
        })
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Task>> {
        crate::sync::lock(&self.tasks)
    }

    /// Applies one `rpc` message (v1) or TaskCommand (v2) to the task table.
    fn rpc(&self, id: &Value, message: &Value, caller: &str, generation: Gen) -> Value {
        let Some(task_id) = message["taskId"].as_str() else {
            return rpc_error(id, -32602, "the command's taskId is required");
        };
        let mut tasks = self.tasks();
        let command = message["command"].as_str().unwrap_or("");
        if command == "start" {
            if let Some(t) = tasks.get(task_id) {
                return rpc_result(id, t.to_json(generation)); // start of a known task is ignored
            }
            if tasks.len() >= self.opts.max_tasks {
                return rpc_error(id, -32603, "demo Partner task limit reached");
            }
            let text = text_of(message);
            let task = Task {
                id: task_id.to_owned(),
                session_id: message["sessionId"].as_str().unwrap_or("").to_owned(),
                state: "awaiting-completion",
                changed_at: now(),
                products: vec![product(1, &text, caller)],
            };
            let out = task.to_json(generation);
            tasks.insert(task_id.to_owned(), task);
            return rpc_result(id, out);
        }
        let Some(task) = tasks.get_mut(task_id) else {
            return rpc_error(id, -32001, "Task not found");
        };
        match (command, task.state) {
            ("get", _) => {}
            ("continue", "awaiting-input" | "awaiting-completion") => {
                let n = task.products.len() + 1;
                task.products.push(product(n, &text_of(message), caller));
                task.set("awaiting-completion");
            }
            ("cancel", "accepted" | "working" | "awaiting-input" | "awaiting-completion") => {
                task.set("canceled")
            }
            ("complete", "awaiting-completion") => task.set("completed"),
            ("continue" | "cancel" | "complete", _) => {} // ignored in this state
            _ => return rpc_error(id, -32004, "Unsupported operation"),
        }
        if let Some(w) = crate::sync::lock(&self.watchers).get(task_id) {
            let _ = w.send(task.state);
        }
        rpc_result(id, task.to_json(generation))
    }

    fn stream(
        self: &Arc<Self>,
        id: Value,
        message: &Value,
        caller: &str,
        generation: Gen,
    ) -> Response<ResponseBody> {
        let command = message["command"].as_str().unwrap_or("");
        if command != "start" {
            return json_response(&rpc_error(
                &id,
                -32004,
                "Unsupported operation: this Partner does not implement re-stream",
            ));
        }
        let Some(task_id) = message["taskId"].as_str().map(str::to_owned) else {
            return json_response(&rpc_error(&id, -32602, "params.message.taskId is required"));
        };
        let session_id = message["sessionId"].as_str().unwrap_or("").to_owned();
        let text = text_of(message);
        let caller = caller.to_owned();
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let me = self.clone();
        tokio::spawn(async move {
            let _ = me
                .produce(tx, id, task_id, session_id, text, caller, generation)
                .await;
        });
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, BoxError>(Frame::data(b)), rx))
        });
        let mut r = Response::new(StreamBody::new(frames.boxed()).boxed_unsync());
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/event-stream"),
        );
        h.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-cache"),
        );
        r
    }

    /// The events of one stream: `working`, the product chunks, `awaiting-completion`;
    /// then, once the Leader completes or cancels the task over `rpc`, that terminal state.
    #[expect(
        clippy::too_many_arguments,
        reason = "the demo Partner's stream, one argument per thing it reports"
    )]
    async fn produce(
        self: Arc<Self>,
        tx: tokio::sync::mpsc::Sender<Bytes>,
        id: Value,
        task_id: String,
        session_id: String,
        text: String,
        caller: String,
        generation: Gen,
    ) -> Result<(), tokio::sync::mpsc::error::SendError<Bytes>> {
        let chunks = self.opts.stream_chunks;
        let mut state_rx = {
            let mut w = crate::sync::lock(&self.watchers);
            if w.len() >= self.opts.max_tasks {
                w.retain(|_, s| s.receiver_count() > 0);
            }
            let (tx, rx) = tokio::sync::watch::channel("working");
            w.insert(task_id.clone(), tx);
            rx
        };
        let event = |seq: usize, data: Value| {
            let event = rpc_result(&id, json!({"eventSeq": seq, "eventData": data}));
            Bytes::from(format!("data: {event}\n\n"))
        };
        let status = |state: &str| {
            json!({"type": generation.status_event(), "taskId": task_id, "sessionId": session_id,
                   "status": {"state": state, "stateChangedAt": now()}})
        };
        tx.send(event(1, status("working"))).await?;
        for part in 1..=chunks {
            tokio::time::sleep(self.opts.event_interval).await;
            let chunk = json!({"type": "product-chunk", "taskId": task_id, "sessionId": session_id,
                "product": {"id": "product-1", "dataItems": [{"type": "text",
                    "text": format!("part {part}/{chunks} for {caller}: {text}")}]},
                "append": part > 1, "lastChunk": part == chunks});
            tx.send(event(part + 1, chunk)).await?;
        }
        tokio::time::sleep(self.opts.event_interval).await;
        self.finish_stream(&task_id, &session_id, &text, &caller);
        tx.send(event(chunks + 2, status("awaiting-completion")))
            .await?;
        // The stream stays open until the task reaches a terminal state.
        let Ok(state) = state_rx
            .wait_for(|s| matches!(*s, "completed" | "canceled"))
            .await
            .map(|s| *s)
        else {
            return Ok(());
        };
        tx.send(event(chunks + 3, status(state))).await?;
        crate::sync::lock(&self.watchers).remove(&task_id);
        Ok(())
    }

    fn finish_stream(&self, task_id: &str, session_id: &str, text: &str, caller: &str) {
        let mut tasks = self.tasks();
        if tasks.len() < self.opts.max_tasks || tasks.contains_key(task_id) {
            tasks.insert(
                task_id.to_owned(),
                Task {
                    id: task_id.to_owned(),
                    session_id: session_id.to_owned(),
                    state: "awaiting-completion",
                    changed_at: now(),
                    products: vec![product(1, text, caller)],
                },
            );
        }
    }

    /// Handles one HTTP request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ResponseBody> {
        let path = req.uri().path().to_owned();
        if req.method() == http::Method::GET && path == "/health" {
            return json_response(&json!({"status": "ok"}));
        }
        let caller = req
            .headers()
            .get(crate::headers::CLIENT_AIC_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("an unknown caller")
            .to_owned();
        let Ok(body) = crate::body::read_bounded(req.into_body(), None, 1 << 20).await else {
            return json_response(&rpc_error(
                &Value::Null,
                -32600,
                "body unreadable or over 1 MiB",
            ));
        };
        let Ok(v) = serde_json::from_slice::<Value>(&body) else {
            return json_response(&rpc_error(&Value::Null, -32700, "Parse error"));
        };
        let id = v["id"].clone();
        // v02.01 carries `rpc`'s TaskCommand in `params.command`, and `stream`'s in
        // `params.message` with `type: "task-command"`.
        let (message, generation) = match &v["params"]["command"] {
            Value::Object(_) => (&v["params"]["command"], Gen::V2),
            _ => {
                let m = &v["params"]["message"];
                let generation = match m["type"].as_str() {
                    Some("task-command") => Gen::V2,
                    _ => Gen::V1,
                };
                (m, generation)
            }
        };
        match path.as_str() {
            "/rpc" | "/acps-aip-v1/rpc" => {
                json_response(&self.rpc(&id, message, &caller, generation))
            }
            "/stream" => self.stream(id, message, &caller, generation),
            p if p.starts_with("/notification/") => {
                json_response(&rpc_error(&id, -32003, "Push notification not supported"))
            }
            "/group/rpc" => json_response(&rpc_error(&id, -32007, "Group mode not supported")),
            _ => {
                let mut r = json_response(&rpc_error(&id, -32601, "Method not found"));
                *r.status_mut() = StatusCode::NOT_FOUND;
                r
            }
        }
    }
}

fn product(n: usize, text: &str, caller: &str) -> Value {
    json!({"id": format!("product-{n}"), "name": "demo answer",
           "dataItems": [{"type": "text", "text": format!("demo Partner answering {caller}: {text}")}]})
}

/// Serves the demo Partner on a bound listener until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    partner: Arc<DemoPartner>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => r?,
            _ = &mut shutdown => return Ok(()),
        };
        let partner = partner.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let p = partner.clone();
                async move { Ok::<_, Infallible>(p.handle(req).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(command: &str, task: &str) -> Value {
        json!({"command": command, "taskId": task, "sessionId": "s",
               "dataItems": [{"type": "text", "text": "hi"}]})
    }

    fn state(v: &Value) -> &str {
        v["result"]["status"]["state"].as_str().unwrap_or("")
    }

    #[test]
    fn task_state_machine() {
        let p = DemoPartner::new(DemoOptions::default());
        let id = json!(1);
        assert_eq!(
            state(&p.rpc(&id, &msg("start", "t"), "A", Gen::V1)),
            "awaiting-completion"
        );
        assert_eq!(
            state(&p.rpc(&id, &msg("get", "t"), "A", Gen::V1)),
            "awaiting-completion"
        );
        let v = p.rpc(&id, &msg("continue", "t"), "A", Gen::V1);
        assert_eq!(v["result"]["products"].as_array().unwrap().len(), 2);
        assert_eq!(
            state(&p.rpc(&id, &msg("complete", "t"), "A", Gen::V1)),
            "completed"
        );
        // Terminal: cancel and continue are ignored.
        assert_eq!(
            state(&p.rpc(&id, &msg("cancel", "t"), "A", Gen::V1)),
            "completed"
        );
        assert_eq!(
            state(&p.rpc(&id, &msg("continue", "t"), "A", Gen::V1)),
            "completed"
        );
        assert_eq!(
            p.rpc(&id, &msg("get", "nope"), "A", Gen::V1)["error"]["code"],
            -32001
        );
        p.rpc(&id, &msg("start", "u"), "A", Gen::V1);
        assert_eq!(
            state(&p.rpc(&id, &msg("cancel", "u"), "A", Gen::V1)),
            "canceled"
        );
        assert_eq!(
            state(&p.rpc(&id, &msg("complete", "u"), "A", Gen::V1)),
            "canceled"
        );
    }

    #[test]
    fn task_cap() {
        let p = DemoPartner::new(DemoOptions {
            max_tasks: 1,
            ..DemoOptions::default()
        });
        p.rpc(&json!(1), &msg("start", "a"), "A", Gen::V1);
        assert_eq!(
            p.rpc(&json!(1), &msg("start", "b"), "A", Gen::V1)["error"]["code"],
            -32603
        );
    }

    #[test]
    fn v2_commands_get_task_results() {
        let p = DemoPartner::new(DemoOptions::default());
        let v = p.rpc(&json!("x"), &msg("start", "t2"), "A", Gen::V2);
        let r = &v["result"];
        assert_eq!(r["type"], "task-result");
        assert_eq!(r["taskId"], "t2");
        assert_eq!(r["senderRole"], "partner");
        assert_eq!(state(&v), "awaiting-completion");
        assert_eq!(Gen::V2.status_event(), "task-status-update");
    }
}
