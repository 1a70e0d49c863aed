//! The current `Task` of a recorded A2A stream, folded from its events: the last `Task`
//! the record holds, with the status of each later status update and the artifacts of
//! each later artifact update (an update with `append: true` adds its parts to the
//! artifact of the same `artifactId`, any other replaces it or is added). Both
//! generations' shapes: v1.0's `StreamResponse` (`{"task": ..}`, `{"statusUpdate": ..}`,
//! `{"artifactUpdate": ..}`) and v0.3's objects told apart by `kind`.

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::jsonrpc::reply::RpcId;
use crate::sse::replay::Entry;
use crate::sse::splitter::fields;

/// One event's `result`, as the fold reads it.
enum Update {
    Task(Value),
    Status(Value),
    Artifact { artifact: Value, append: bool },
    Other,
}

fn update_of(result: Value) -> Update {
    let Value::Object(mut r) = result else {
        return Update::Other;
    };
    let (kind, obj) = if let Some(t) = r.remove("task") {
        ("task", t)
    } else if let Some(s) = r.remove("statusUpdate") {
        ("status-update", s)
    } else if let Some(a) = r.remove("artifactUpdate") {
        ("artifact-update", a)
    } else {
        let kind = match r.get("kind").and_then(Value::as_str) {
            Some("task") => "task",
            Some("status-update") => "status-update",
            Some("artifact-update") => "artifact-update",
            _ => return Update::Other,
        };
        (kind, Value::Object(r))
    };
    let mut obj = obj;
    match kind {
        "task" => Update::Task(obj),
        "status-update" => match obj.get_mut("status") {
            Some(s) => Update::Status(s.take()),
            None => Update::Other,
        },
        _ => Update::Artifact {
            append: obj.get("append").and_then(Value::as_bool).unwrap_or(false),
            artifact: obj.get_mut("artifact").map_or(Value::Null, Value::take),
        },
    }
}

/// Applies an artifact update to a task's `artifacts`.
fn add_artifact(task: &mut Map<String, Value>, artifact: Value, append: bool) {
    let id = artifact.get("artifactId").cloned();
    let list = task
        .entry("artifacts")
        .or_insert_with(|| Value::Array(Vec::new()));
    let Value::Array(list) = list else { return };
    let same = list
        .iter_mut()
        .find(|a| id.is_some() && a.get("artifactId") == id.as_ref());
    match (same, append) {
        (Some(old), true) => {
            let parts = artifact.get("parts").and_then(Value::as_array).cloned();
            if let (Some(Value::Array(old_parts)), Some(new)) = (old.get_mut("parts"), parts) {
                old_parts.extend(new);
            }
        }
        (Some(old), false) => *old = artifact,
        (None, _) => list.push(artifact),
    }
}

/// The current task as one SSE event (no `id:` line: it moves no client's resume point)
/// carrying the JSON-RPC `id`, in the shape of the generation the record's `Task` came
/// in; `None` when the record holds no `Task` (evicted, or never sent).
pub(crate) fn current_task(entries: &[Entry], id: &RpcId) -> Option<Bytes> {
    let mut task: Option<(Map<String, Value>, bool)> = None;
    for e in entries {
        let Some(data) = fields(&e.bytes).data else {
            continue;
        };
        let Ok(Value::Object(mut response)) = serde_json::from_slice::<Value>(&data) else {
            continue;
        };
        let Some(result) = response.remove("result") else {
            continue;
        };
        let wrapped = result.get("task").is_some();
        match (update_of(result), &mut task) {
            (Update::Task(Value::Object(t)), _) => task = Some((t, wrapped)),
            (Update::Status(s), Some((t, _))) => {
                t.insert("status".into(), s);
            }
            (Update::Artifact { artifact, append }, Some((t, _))) => {
                add_artifact(t, artifact, append)
            }
            _ => {}
        }
    }
    let (task, wrapped) = task?;
    let result = match wrapped {
        true => serde_json::json!({ "task": task }),
        false => Value::Object(task),
    };
    let result = serde_json::to_vec(&result).ok()?;
    let mut out = Vec::with_capacity(result.len() + id.as_bytes().len() + 40);
    out.extend_from_slice(br#"data: {"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(br#","result":"#);
    out.extend_from_slice(&result);
    out.extend_from_slice(b"}\n\n");
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, json: &str) -> Entry {
        Entry {
            seq,
            bytes: Bytes::from(format!("data: {json}\n\n")),
            id_start: 0,
            id_len: 0,
        }
    }

    fn result(event: &Bytes) -> Value {
        let data = fields(event).data.unwrap();
        serde_json::from_slice::<Value>(&data).unwrap()["result"].take()
    }

    #[test]
    fn a_v1_task_takes_the_later_status_and_artifacts() {
        let entries = [
            entry(
                1,
                r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","contextId":"c","status":{"state":"TASK_STATE_SUBMITTED"}}}}"#,
            ),
            entry(
                2,
                r#"{"jsonrpc":"2.0","id":1,"result":{"artifactUpdate":{"taskId":"t","artifact":{"artifactId":"a","parts":[{"text":"x"}]}}}}"#,
            ),
            entry(
                3,
                r#"{"jsonrpc":"2.0","id":1,"result":{"artifactUpdate":{"taskId":"t","append":true,"artifact":{"artifactId":"a","parts":[{"text":"y"}]}}}}"#,
            ),
            entry(
                4,
                r#"{"jsonrpc":"2.0","id":1,"result":{"statusUpdate":{"taskId":"t","status":{"state":"TASK_STATE_WORKING"}}}}"#,
            ),
        ];
        let ev = current_task(&entries, &RpcId::null()).unwrap();
        assert!(!ev.starts_with(b"id:"), "no id line");
        let t = &result(&ev)["task"];
        assert_eq!(t["id"], "t");
        assert_eq!(t["status"]["state"], "TASK_STATE_WORKING");
        assert_eq!(
            t["artifacts"],
            serde_json::json!([{"artifactId":"a","parts":[{"text":"x"},{"text":"y"}]}])
        );
    }

    #[test]
    fn a_v03_task_keeps_its_shape_and_without_a_task_there_is_none() {
        let task = r#"{"jsonrpc":"2.0","id":1,"result":{"kind":"task","id":"t","status":{"state":"submitted"}}}"#;
        let done = r#"{"jsonrpc":"2.0","id":1,"result":{"kind":"status-update","taskId":"t","status":{"state":"completed"},"final":true}}"#;
        let ev = current_task(&[entry(1, task), entry(2, done)], &RpcId::null()).unwrap();
        let t = result(&ev);
        assert_eq!(
            (t["kind"].as_str(), t["status"]["state"].as_str()),
            (Some("task"), Some("completed"))
        );
        assert!(current_task(&[entry(2, done)], &RpcId::null()).is_none());
    }
}
