//! What an A2A agent's answer says about ownership: the task and context a `SendMessage`
//! result (or one event of a streamed answer) names, read by borrowing.
//!
//! v1.0 wraps each result in its kind (`{"task": {"id", "contextId"}}`, `{"message":
//! {"taskId", "contextId"}}`, `{"statusUpdate": ...}`, `{"artifactUpdate": ...}`); v0.3
//! puts the object itself there with a `kind` (`task`, `message`, `status-update`,
//! `artifact-update`).

use std::borrow::Cow;

use serde::Deserialize;

use super::lenient::{LooseObj, LooseStr};

/// The task and context an answer names (either may be missing: a `Message` answer
/// without a task names only its context).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AnswerIds<'a> {
    /// The task's id.
    pub task_id: Option<Cow<'a, str>>,
    /// Its context.
    pub context_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Response<'a> {
    #[serde(borrow, default)]
    result: LooseObj<Result<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Result<'a> {
    #[serde(borrow, default)]
    task: LooseObj<Ids<'a>>,
    #[serde(borrow, default)]
    message: LooseObj<Ids<'a>>,
    #[serde(borrow, default)]
    status_update: LooseObj<Ids<'a>>,
    #[serde(borrow, default)]
    artifact_update: LooseObj<Ids<'a>>,
    #[serde(borrow, default)]
    kind: LooseStr<'a>,
    #[serde(borrow, default)]
    id: LooseStr<'a>,
    #[serde(borrow, default)]
    task_id: LooseStr<'a>,
    #[serde(borrow, default)]
    context_id: LooseStr<'a>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Ids<'a> {
    #[serde(borrow, default)]
    id: LooseStr<'a>,
    #[serde(borrow, default)]
    task_id: LooseStr<'a>,
    #[serde(borrow, default)]
    context_id: LooseStr<'a>,
}

fn string(s: LooseStr<'_>) -> Option<Cow<'_, str>> {
    match s {
        LooseStr::Str(s) => Some(s),
        _ => None,
    }
}

impl<'a> Ids<'a> {
    /// A `Task` names itself `id`; every other object names its task `taskId`.
    fn of(self, is_task: bool) -> AnswerIds<'a> {
        AnswerIds {
            task_id: string(if is_task { self.id } else { self.task_id }),
            context_id: string(self.context_id),
        }
    }
}

/// The ids a JSON-RPC response (or one streamed event's data) names in its `result`;
/// `None` for an error, a body that is not JSON, or a result of another shape.
pub fn answer_ids(body: &[u8]) -> Option<AnswerIds<'_>> {
    let response: Response<'_> = serde_json::from_slice(body).ok()?;
    let LooseObj::Obj(r) = response.result else {
        return None;
    };
    let found = match (r.task, r.message, r.status_update, r.artifact_update) {
        (LooseObj::Obj(t), ..) => t.of(true),
        (_, LooseObj::Obj(m), ..) | (_, _, LooseObj::Obj(m), _) | (.., LooseObj::Obj(m)) => {
            m.of(false)
        }
        _ => {
            let ids = Ids {
                id: r.id,
                task_id: r.task_id,
                context_id: r.context_id,
            };
            match r.kind.as_str() {
                Some("task") => ids.of(true),
                Some("message" | "status-update" | "artifact-update") => ids.of(false),
                _ => return None,
            }
        }
    };
    (found.task_id.is_some() || found.context_id.is_some()).then_some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(body: &str) -> Option<(Option<String>, Option<String>)> {
        answer_ids(body.as_bytes()).map(|a| {
            (
                a.task_id.map(Cow::into_owned),
                a.context_id.map(Cow::into_owned),
            )
        })
    }

    fn both(t: &str, c: &str) -> Option<(Option<String>, Option<String>)> {
        Some((Some(t.into()), Some(c.into())))
    }

    #[test]
    fn every_result_kind_of_both_generations() {
        for (body, want) in [
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","contextId":"c","status":{"state":"TASK_STATE_WORKING"}}}}"#,
                both("t", "c"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"message":{"messageId":"m","taskId":"t","contextId":"c","role":"ROLE_AGENT"}}}"#,
                both("t", "c"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"message":{"messageId":"m","contextId":"c"}}}"#,
                Some((None, Some("c".into()))),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"statusUpdate":{"taskId":"t","contextId":"c","status":{}}}}"#,
                both("t", "c"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"artifactUpdate":{"taskId":"t","contextId":"c"}}}"#,
                both("t", "c"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"kind":"task","id":"t","contextId":"c","status":{"state":"working"}}}"#,
                both("t", "c"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"kind":"status-update","taskId":"t","contextId":"c","final":false}}"#,
                both("t", "c"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"kind":"message","messageId":"m","taskId":"t","contextId":"c"}}"#,
                both("t", "c"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Task not found"}}"#,
                None,
            ),
            (r#"{"jsonrpc":"2.0","id":1,"result":{"tasks":[]}}"#, None),
            (r#"{"jsonrpc":"2.0","id":1,"result":"x"}"#, None),
            ("not json", None),
        ] {
            assert_eq!(ids(body), want, "{body}");
        }
    }
}
