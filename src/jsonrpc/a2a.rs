//! The JSON-RPC envelope of an A2A (Agent2Agent) request, parsed by borrowing from the
//! body: only what the gateway acts on (the method, the id, the task a call is about, the
//! message's `taskId`, `contextId` and `role`, `ListTasks`' `contextId`). Never the AIP
//! semantics: an A2A Partner's requests go through this parse alone, and the very bytes
//! parsed are forwarded.
//!
//! Both method generations are known: v1.0 (`SendMessage`, `GetTask`, ...) and v0.3
//! (`message/send`, `tasks/get`, ...). A method of neither is refused with -32601: the
//! gateway could not tell which task it is about, so it cannot keep its ownership promise
//! for it (A2A's own answer to an unknown method is the same code).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::envelope::text::{check_depth, check_text};
use super::envelope::{present, EnvelopeError, ParseFailure};
use super::lenient::{LooseObj, LooseStr};

/// What an A2A method does (both generations name each the same way here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum A2aMethod {
    /// `SendMessage` / `message/send`.
    SendMessage,
    /// `SendStreamingMessage` / `message/stream` (an SSE answer).
    SendStreamingMessage,
    /// `GetTask` / `tasks/get`.
    GetTask,
    /// `ListTasks` (v1.0 only).
    ListTasks,
    /// `CancelTask` / `tasks/cancel`.
    CancelTask,
    /// `SubscribeToTask` / `tasks/resubscribe` (an SSE answer).
    SubscribeToTask,
    /// `CreateTaskPushNotificationConfig` / `tasks/pushNotificationConfig/set`.
    CreatePushConfig,
    /// `GetTaskPushNotificationConfig` / `tasks/pushNotificationConfig/get`.
    GetPushConfig,
    /// `ListTaskPushNotificationConfigs` / `tasks/pushNotificationConfig/list`.
    ListPushConfigs,
    /// `DeleteTaskPushNotificationConfig` / `tasks/pushNotificationConfig/delete`.
    DeletePushConfig,
    /// `GetExtendedAgentCard` / `agent/getAuthenticatedExtendedCard`.
    GetExtendedCard,
}

/// Which generation of method names a request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Generation {
    /// A2A v1.0 (PascalCase names).
    V1,
    /// A2A v0.3 (`category/action` names).
    V03,
}

/// Every known name: (v1.0 name, v0.3 name, method).
const NAMES: [(&str, Option<&str>, A2aMethod); 11] = [
    ("SendMessage", Some("message/send"), A2aMethod::SendMessage),
    (
        "SendStreamingMessage",
        Some("message/stream"),
        A2aMethod::SendStreamingMessage,
    ),
    ("GetTask", Some("tasks/get"), A2aMethod::GetTask),
    ("ListTasks", None, A2aMethod::ListTasks),
    ("CancelTask", Some("tasks/cancel"), A2aMethod::CancelTask),
    (
        "SubscribeToTask",
        Some("tasks/resubscribe"),
        A2aMethod::SubscribeToTask,
    ),
    (
        "CreateTaskPushNotificationConfig",
        Some("tasks/pushNotificationConfig/set"),
        A2aMethod::CreatePushConfig,
    ),
    (
        "GetTaskPushNotificationConfig",
        Some("tasks/pushNotificationConfig/get"),
        A2aMethod::GetPushConfig,
    ),
    (
        "ListTaskPushNotificationConfigs",
        Some("tasks/pushNotificationConfig/list"),
        A2aMethod::ListPushConfigs,
    ),
    (
        "DeleteTaskPushNotificationConfig",
        Some("tasks/pushNotificationConfig/delete"),
        A2aMethod::DeletePushConfig,
    ),
    (
        "GetExtendedAgentCard",
        Some("agent/getAuthenticatedExtendedCard"),
        A2aMethod::GetExtendedCard,
    ),
];

/// A known method as the request named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct A2aVerb {
    /// What it does.
    pub method: A2aMethod,
    /// Which name it was called by.
    pub generation: Generation,
}

impl A2aVerb {
    /// Looks a wire name up, in both generations.
    pub fn from_name(name: &str) -> Option<A2aVerb> {
        NAMES.iter().find_map(|&(v1, v03, method)| {
            let generation = if v1 == name {
                Generation::V1
            } else if v03 == Some(name) {
                Generation::V03
            } else {
                return None;
            };
            Some(A2aVerb { method, generation })
        })
    }

    /// The wire name (also the method label of logs and metrics: A2A's own names).
    pub fn name(self) -> &'static str {
        let (v1, v03, _) = NAMES
            .iter()
            .find(|(_, _, m)| *m == self.method)
            .copied()
            .unwrap_or(NAMES[0]);
        match self.generation {
            Generation::V1 => v1,
            Generation::V03 => v03.unwrap_or(v1),
        }
    }

    /// Whether the answer is an event stream.
    pub fn streams(self) -> bool {
        matches!(
            self.method,
            A2aMethod::SendStreamingMessage | A2aMethod::SubscribeToTask
        )
    }

    /// Whether the call sends a message (which may start a task).
    pub fn sends(self) -> bool {
        matches!(
            self.method,
            A2aMethod::SendMessage | A2aMethod::SendStreamingMessage
        )
    }

    /// Where the task the call is about is named, when it names one in its params (a
    /// message names its task in `params.message.taskId`, read apart).
    fn task_field(self) -> Option<TaskField> {
        use A2aMethod::*;
        Some(match (self.method, self.generation) {
            (GetTask | CancelTask | SubscribeToTask, _) => TaskField::Id,
            (CreatePushConfig, _) => TaskField::TaskId,
            (GetPushConfig | ListPushConfigs | DeletePushConfig, Generation::V1) => {
                TaskField::TaskId
            }
            // v0.3's get/list/delete name the task `params.id`.
            (GetPushConfig | ListPushConfigs | DeletePushConfig, Generation::V03) => TaskField::Id,
            (SendMessage | SendStreamingMessage | ListTasks | GetExtendedCard, _) => return None,
        })
    }
}

/// Which params field names the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TaskField {
    /// `params.id`.
    Id,
    /// `params.taskId`.
    TaskId,
}

impl TaskField {
    fn name(self) -> &'static str {
        match self {
            TaskField::Id => "params.id",
            TaskField::TaskId => "params.taskId",
        }
    }
}

/// A message's `role`, as far as the gateway judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `ROLE_USER` (v1.0) or `user` (v0.3): what a client sends.
    User,
    /// `ROLE_AGENT` or `agent`: the agent's own voice, which no client may speak in.
    Agent,
    /// Anything else (left to the agent to judge).
    Other,
}

impl Role {
    fn of(text: &str) -> Role {
        match text {
            "ROLE_USER" | "user" => Role::User,
            "ROLE_AGENT" | "agent" => Role::Agent,
            _ => Role::Other,
        }
    }
}

/// A valid A2A request's facts, every string borrowed from the body when it can be.
#[derive(Debug)]
pub struct A2aEnvelope<'a> {
    /// The raw `id` text, to echo byte for byte.
    pub id: &'a RawValue,
    /// The method.
    pub verb: A2aVerb,
    /// The task the call is about: `params.id` or `params.taskId` for a task method,
    /// `params.message.taskId` for a message that continues a task.
    pub task_id: Option<Cow<'a, str>>,
    /// `params.message.contextId`, or `ListTasks`' `params.contextId`.
    pub context_id: Option<Cow<'a, str>>,
    /// `params.message.role`.
    pub role: Option<Role>,
}

#[derive(Deserialize)]
struct RawA2a<'a> {
    #[serde(borrow, default)]
    jsonrpc: LooseStr<'a>,
    #[serde(borrow, default)]
    method: LooseStr<'a>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: LooseObj<RawParams<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawParams<'a> {
    #[serde(borrow, default)]
    id: LooseStr<'a>,
    #[serde(borrow, default)]
    task_id: LooseStr<'a>,
    #[serde(borrow, default)]
    context_id: LooseStr<'a>,
    #[serde(borrow, default)]
    message: LooseObj<RawMessage<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawMessage<'a> {
    #[serde(borrow, default)]
    task_id: LooseStr<'a>,
    #[serde(borrow, default)]
    context_id: LooseStr<'a>,
    #[serde(borrow, default)]
    role: LooseStr<'a>,
}

/// Only the id, for an answer to a body the parse refused.
#[derive(Deserialize)]
struct IdOnly<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
}

fn invalid(reason: &'static str, message: impl Into<String>) -> EnvelopeError {
    EnvelopeError::Invalid {
        reason,
        message: message.into(),
    }
}

fn bad_param(field: &'static str, message: impl Into<String>) -> EnvelopeError {
    EnvelopeError::InvalidParams {
        field,
        message: message.into(),
    }
}

/// The id of a body that could not be parsed whole, when it can still be read.
fn id_alone(body: &[u8]) -> Option<&RawValue> {
    serde_json::from_slice::<IdOnly<'_>>(body).ok()?.id
}

/// Parses and checks an A2A request: UTF-8 text nested at most `max_depth` deep, one
/// object (A2A's JSON-RPC binding has no batches), `jsonrpc` `"2.0"`, an id (string,
/// number or null), a known method, and the fields the gateway acts on with their types.
/// A key the gateway reads may appear once only (a duplicate could be read one way here
/// and another by the agent). A refusal carries the id when it can be read.
pub fn parse(body: &[u8], max_depth: usize) -> Result<A2aEnvelope<'_>, ParseFailure<'_>> {
    let fail = |error| ParseFailure {
        id: id_alone(body),
        error,
    };
    let text = check_text(body)
        .and_then(|t| check_depth(body, max_depth).map(|()| t))
        .map_err(fail)?;
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first != Some(b'{') {
        let error = match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
            Err(e) => EnvelopeError::Parse(e.to_string()),
            Ok(_) if first == Some(b'[') => invalid("batch", "batch requests are not supported"),
            Ok(_) => invalid("not_object", "a request must be a JSON object"),
        };
        return Err(ParseFailure { id: None, error });
    }
    let raw = match serde_json::from_str::<RawA2a<'_>>(text) {
        Ok(raw) => raw,
        Err(e) if e.is_data() => return Err(fail(invalid("duplicate_key", e.to_string()))),
        Err(e) => {
            return Err(ParseFailure {
                id: None,
                error: EnvelopeError::Parse(e.to_string()),
            })
        }
    };
    let id = raw.id;
    validate(raw).map_err(|error| ParseFailure { id, error })
}

fn validate(raw: RawA2a<'_>) -> Result<A2aEnvelope<'_>, EnvelopeError> {
    if raw.jsonrpc.as_str() != Some("2.0") {
        return Err(invalid("jsonrpc_version", "\"jsonrpc\" must be \"2.0\""));
    }
    let id = raw
        .id
        .ok_or_else(|| invalid("id_missing", "\"id\" is required"))?;
    if !matches!(
        id.get().as_bytes().first(),
        Some(b'"' | b'-' | b'0'..=b'9' | b'n')
    ) {
        return Err(invalid(
            "id_type",
            "\"id\" must be a string, number or null",
        ));
    }
    let verb = match raw.method {
        LooseStr::Str(name) => A2aVerb::from_name(&name)
            .ok_or_else(|| EnvelopeError::MethodNotFound(name.into_owned()))?,
        _ => return Err(invalid("method_type", "\"method\" must be a string")),
    };
    let params = match raw.params {
        LooseObj::Obj(p) => p,
        // `GetExtendedAgentCard` takes no params (or an empty object).
        LooseObj::Absent if verb.method == A2aMethod::GetExtendedCard => RawParams::default(),
        LooseObj::Absent => return Err(bad_param("params", "params is required")),
        LooseObj::Other(kind) => {
            return Err(bad_param(
                "params",
                format!("params must be an object, not {}", kind.name()),
            ))
        }
    };
    let mut envelope = A2aEnvelope {
        id,
        verb,
        task_id: None,
        context_id: None,
        role: None,
    };
    if verb.sends() {
        let message = match params.message {
            LooseObj::Obj(m) => m,
            LooseObj::Absent => {
                return Err(bad_param("params.message", "params.message is required"))
            }
            LooseObj::Other(kind) => {
                return Err(bad_param(
                    "params.message",
                    format!("params.message must be an object, not {}", kind.name()),
                ))
            }
        };
        envelope.task_id = opt_string(message.task_id, "params.message.taskId")?;
        envelope.context_id = opt_string(message.context_id, "params.message.contextId")?;
        let role = opt_string(message.role, "params.message.role")?.map(|r| Role::of(&r));
        if role == Some(Role::Agent) {
            return Err(bad_param(
                "params.message.role",
                "a client's message speaks as the user, not as the agent",
            ));
        }
        envelope.role = role;
    } else if let Some(field) = verb.task_field() {
        let value = match field {
            TaskField::Id => params.id,
            TaskField::TaskId => params.task_id,
        };
        let task = opt_string(value, field.name())?
            .ok_or_else(|| bad_param(field.name(), format!("{} is required", field.name())))?;
        envelope.task_id = Some(task);
    } else if verb.method == A2aMethod::ListTasks {
        envelope.context_id = opt_string(params.context_id, "params.contextId")?;
    }
    Ok(envelope)
}

fn opt_string<'a>(
    value: LooseStr<'a>,
    field: &'static str,
) -> Result<Option<Cow<'a, str>>, EnvelopeError> {
    match value {
        LooseStr::Absent => Ok(None),
        LooseStr::Str(s) => Ok(Some(s)),
        LooseStr::Other(kind) => Err(bad_param(
            field,
            format!("{field} must be a string, not {}", kind.name()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: &str) -> A2aEnvelope<'_> {
        parse(body.as_bytes(), 64).unwrap_or_else(|f| panic!("{body}: {:?}", f.error))
    }

    fn err(body: &str) -> (Option<String>, EnvelopeError) {
        match parse(body.as_bytes(), 64) {
            Ok(e) => panic!("{body} passed: {e:?}"),
            Err(f) => (f.id.map(|i| i.get().to_owned()), f.error),
        }
    }

    #[test]
    fn both_generations_name_every_method() {
        for (v1, v03, method) in NAMES {
            let verb = A2aVerb::from_name(v1).unwrap();
            assert_eq!(
                (verb.method, verb.generation, verb.name()),
                (method, Generation::V1, v1)
            );
            if let Some(v03) = v03 {
                let verb = A2aVerb::from_name(v03).unwrap();
                assert_eq!(
                    (verb.method, verb.generation, verb.name()),
                    (method, Generation::V03, v03)
                );
            }
        }
        assert_eq!(A2aVerb::from_name("rpc"), None);
        assert_eq!(A2aVerb::from_name("tasks/list"), None);
        assert_eq!(A2aVerb::from_name("sendmessage"), None);
    }

    #[test]
    fn a_message_names_its_task_context_and_role() {
        let body = r#"{"jsonrpc":"2.0","id":"r-1","method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","taskId":"t-1","contextId":"c-1","parts":[{"text":"hi"}]}}}"#;
        let e = ok(body);
        assert_eq!(e.id.get(), r#""r-1""#);
        assert_eq!(e.verb.method, A2aMethod::SendMessage);
        assert_eq!(e.task_id.as_deref(), Some("t-1"));
        assert_eq!(e.context_id.as_deref(), Some("c-1"));
        assert_eq!(e.role, Some(Role::User));
        // Borrowed: no copy of a string without escapes.
        assert!(matches!(e.task_id, Some(Cow::Borrowed(_))));
        let v03 = r#"{"jsonrpc":"2.0","id":7,"method":"message/stream","params":{"message":{"kind":"message","messageId":"m","role":"user","parts":[]}}}"#;
        let e = ok(v03);
        assert_eq!(
            (e.verb.method, e.verb.generation),
            (A2aMethod::SendStreamingMessage, Generation::V03)
        );
        assert_eq!(
            (e.task_id, e.context_id, e.role),
            (None, None, Some(Role::User))
        );
    }

    #[test]
    fn each_task_method_names_its_task_where_its_generation_puts_it() {
        for (method, params) in [
            ("GetTask", r#"{"id":"T","historyLength":2}"#),
            ("tasks/get", r#"{"id":"T"}"#),
            ("CancelTask", r#"{"id":"T"}"#),
            ("tasks/cancel", r#"{"id":"T"}"#),
            ("SubscribeToTask", r#"{"id":"T"}"#),
            ("tasks/resubscribe", r#"{"id":"T"}"#),
            (
                "CreateTaskPushNotificationConfig",
                r#"{"taskId":"T","url":"https://x"}"#,
            ),
            (
                "tasks/pushNotificationConfig/set",
                r#"{"taskId":"T","pushNotificationConfig":{}}"#,
            ),
            (
                "GetTaskPushNotificationConfig",
                r#"{"taskId":"T","id":"cfg"}"#,
            ),
            (
                "tasks/pushNotificationConfig/get",
                r#"{"id":"T","pushNotificationConfigId":"cfg"}"#,
            ),
            ("ListTaskPushNotificationConfigs", r#"{"taskId":"T"}"#),
            ("tasks/pushNotificationConfig/list", r#"{"id":"T"}"#),
            (
                "DeleteTaskPushNotificationConfig",
                r#"{"taskId":"T","id":"cfg"}"#,
            ),
            (
                "tasks/pushNotificationConfig/delete",
                r#"{"id":"T","pushNotificationConfigId":"c"}"#,
            ),
        ] {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}}}"#);
            assert_eq!(ok(&body).task_id.as_deref(), Some("T"), "{method}");
        }
        // The task is required where the method is about one, and must be a string.
        let (id, e) = err(
            r#"{"jsonrpc":"2.0","id":"x","method":"GetTaskPushNotificationConfig","params":{"id":"cfg"}}"#,
        );
        assert_eq!(id.as_deref(), Some(r#""x""#));
        assert!(
            matches!(
                e,
                EnvelopeError::InvalidParams {
                    field: "params.taskId",
                    ..
                }
            ),
            "{e:?}"
        );
        let (_, e) = err(r#"{"jsonrpc":"2.0","id":"x","method":"GetTask","params":{"id":5}}"#);
        assert!(
            matches!(
                e,
                EnvelopeError::InvalidParams {
                    field: "params.id",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn list_tasks_and_the_extended_card() {
        let e = ok(
            r#"{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"contextId":"c","pageSize":5}}"#,
        );
        assert_eq!((e.task_id, e.context_id.as_deref()), (None, Some("c")));
        let e = ok(r#"{"jsonrpc":"2.0","id":1,"method":"GetExtendedAgentCard"}"#);
        assert_eq!(e.verb.method, A2aMethod::GetExtendedCard);
        let (_, e) = err(r#"{"jsonrpc":"2.0","id":1,"method":"GetTask"}"#);
        assert!(matches!(
            e,
            EnvelopeError::InvalidParams {
                field: "params",
                ..
            }
        ));
    }

    #[test]
    fn refusals_keep_the_id() {
        let (id, e) = err(r#"{"jsonrpc":"2.0","id":"u","method":"tasks/list","params":{}}"#);
        assert_eq!(
            (id.as_deref(), e),
            (
                Some(r#""u""#),
                EnvelopeError::MethodNotFound("tasks/list".into())
            )
        );
        // AIP's methods are unknown to an A2A agent.
        let (_, e) = err(r#"{"jsonrpc":"2.0","id":"u","method":"rpc","params":{}}"#);
        assert_eq!(e, EnvelopeError::MethodNotFound("rpc".into()));
        let (_, e) = err(r#"{"jsonrpc":"1.0","id":"u","method":"GetTask","params":{"id":"t"}}"#);
        assert!(matches!(
            e,
            EnvelopeError::Invalid {
                reason: "jsonrpc_version",
                ..
            }
        ));
        let (_, e) = err(r#"{"jsonrpc":"2.0","method":"GetTask","params":{"id":"t"}}"#);
        assert!(matches!(
            e,
            EnvelopeError::Invalid {
                reason: "id_missing",
                ..
            }
        ));
        let (_, e) = err(r#"{"jsonrpc":"2.0","id":{},"method":"GetTask","params":{"id":"t"}}"#);
        assert!(matches!(
            e,
            EnvelopeError::Invalid {
                reason: "id_type",
                ..
            }
        ));
        let (_, e) = err(r#"[{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"t"}}]"#);
        assert!(matches!(
            e,
            EnvelopeError::Invalid {
                reason: "batch",
                ..
            }
        ));
        let (_, e) = err(r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"t"}"#);
        assert!(matches!(e, EnvelopeError::Parse(_)));
        let (_, e) = err(r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}"#);
        assert!(matches!(
            e,
            EnvelopeError::InvalidParams {
                field: "params",
                ..
            }
        ));
    }

    /// A key the gateway acts on, sent twice, could be read one way here and another by
    /// the agent: refused (the id still echoed).
    #[test]
    fn a_duplicate_of_a_key_the_gateway_reads_is_refused() {
        for body in [
            r#"{"jsonrpc":"2.0","id":"d","method":"GetTask","params":{"id":"mine","id":"theirs"}}"#,
            r#"{"jsonrpc":"2.0","id":"d","method":"SendMessage","params":{"message":{"role":"ROLE_USER","taskId":"a","taskId":"b"}}}"#,
            r#"{"jsonrpc":"2.0","id":"d","method":"GetTask","method":"CancelTask","params":{"id":"t"}}"#,
        ] {
            let (id, e) = err(body);
            assert_eq!(id.as_deref(), Some(r#""d""#), "{body}");
            assert!(
                matches!(
                    e,
                    EnvelopeError::Invalid {
                        reason: "duplicate_key",
                        ..
                    }
                ),
                "{e:?}"
            );
        }
    }

    #[test]
    fn a_client_may_not_speak_as_the_agent() {
        for role in ["ROLE_AGENT", "agent"] {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{{"role":"{role}","parts":[]}}}}}}"#
            );
            let (_, e) = err(&body);
            assert!(
                matches!(
                    e,
                    EnvelopeError::InvalidParams {
                        field: "params.message.role",
                        ..
                    }
                ),
                "{e:?}"
            );
        }
        let (_, e) = err(r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{}}"#);
        assert!(matches!(
            e,
            EnvelopeError::InvalidParams {
                field: "params.message",
                ..
            }
        ));
    }

    #[test]
    fn text_and_depth_are_checked_as_for_aip() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{{"role":"user","metadata":{}1{}}}}}}}"#,
            "[".repeat(70),
            "]".repeat(70)
        );
        let (id, e) = err(&deep);
        assert_eq!(id.as_deref(), Some("1"));
        assert!(
            matches!(
                e,
                EnvelopeError::Invalid {
                    reason: "json_too_deep",
                    ..
                }
            ),
            "{e:?}"
        );
        let (_, e) = err(r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"\ud800"}}"#);
        assert!(matches!(e, EnvelopeError::Parse(_)), "{e:?}");
    }
}
