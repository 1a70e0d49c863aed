//! Ownership of A2A tasks and contexts, in the same task-owner store as AIP's (its
//! bounds, its expiry, its copy in Redis in cluster mode).
//!
//! An A2A agent assigns task ids, so nothing is claimed before the request is forwarded:
//! the agent's answer to a message (`SendMessage`'s `Task` or `Message` result, the first
//! event of a streamed answer that names its task) makes the caller the owner of the task
//! and of its context ([`Recorder`]). Every later call naming that task (`GetTask`,
//! `CancelTask`, `SubscribeToTask`, the push-config calls, a message's `taskId`) or that
//! context (a message's `contextId`, `ListTasks`' `contextId`) must come from the owner.
//!
//! A context is kept under the Partner's name like a task, its key prefixed with a NUL
//! (`"\0context:"`): a JSON string can carry one only escaped, and agents name tasks with
//! UUIDs, so no task id takes a context's key.

use std::sync::Arc;
use std::time::Duration;

use super::tasks::{Claimed, TaskOwners};
use crate::cluster::Cluster;
use crate::error::GatewayError;
use crate::identity::Aic;

/// The store key of an A2A context.
pub(crate) fn context_key(context: &str) -> String {
    format!("\0context:{context}")
}

/// The refusal of a message or list naming a context another AIC owns.
pub(crate) fn not_context_owner(context: &str, owner: &Aic, aic: &Aic) -> GatewayError {
    GatewayError::Forbidden {
        reason: "not_context_owner",
        detail: format!("context {context:?} belongs to {owner}, not {aic}"),
    }
}

/// The refusal of a `ListTasks` naming a context without a known owner
/// (`policy.tasks.unknown = "refuse"`).
pub(crate) fn unknown_context(context: &str) -> GatewayError {
    GatewayError::Forbidden {
        reason: "unknown_context",
        detail: format!("context {context:?} has no known owner"),
    }
}

/// The refusal of a `ListTasks` without a `contextId`: the agent's list spans every
/// caller's tasks, and the gateway does not rewrite answers.
pub(crate) fn list_unscoped() -> GatewayError {
    GatewayError::Forbidden {
        reason: "list_tasks_unscoped",
        detail: "ListTasks must name a contextId of the caller's own (params.contextId): \
                 the agent's list spans every caller's tasks"
            .into(),
    }
}

/// Records the owner of what an agent's answer names: made per request that sends a
/// message, used once its answer (or its stream's first naming event) is read.
pub(crate) struct Recorder {
    /// The store.
    pub(crate) owners: Arc<dyn TaskOwners>,
    /// Cluster mode: Redis gets the owner too.
    pub(crate) cluster: Option<Arc<Cluster>>,
    /// `policy.tasks.ttl`.
    pub(crate) ttl: Duration,
    /// The Partner's name.
    pub(crate) partner: Arc<str>,
    /// The caller.
    pub(crate) aic: Aic,
}

impl Recorder {
    /// Records the caller as the owner of the task and the context a JSON-RPC answer
    /// (or one event's data) names; whether it named any.
    pub(crate) fn record_answer(&self, json: &[u8]) -> bool {
        let Some(ids) = crate::jsonrpc::a2a_answer::answer_ids(json) else {
            return false;
        };
        if let Some(task) = ids.task_id.as_deref() {
            self.record(task);
        }
        if let Some(context) = ids.context_id.as_deref() {
            self.record(&context_key(context));
        }
        true
    }

    /// The caller owns `key` from now on, unless another AIC already does (then it
    /// stays theirs: a context two callers raced into is its first owner's).
    fn record(&self, key: &str) {
        let (owners, partner, aic) = (&self.owners, &*self.partner, &self.aic);
        match owners.claim(partner, key, aic, None) {
            Ok(Claimed::New | Claimed::Joined) => owners.settle(partner, key, aic, true),
            Ok(Claimed::Held) => {}
            Err(owner) => {
                tracing::warn!(
                    partner, key, %owner, caller = %aic,
                    "an A2A agent answered with a task or context another AIC owns: it stays theirs"
                );
                return;
            }
        }
        if let Some(cluster) = self.cluster.clone() {
            let (partner, key, aic, ttl) = (self.partner.clone(), key.to_owned(), *aic, self.ttl);
            tokio::spawn(async move {
                use crate::cluster::tasks;
                if let Ok(tasks::Claim::Ours { pending: true }) =
                    tasks::claim(&cluster, &partner, &key, &aic, ttl).await
                {
                    let _ = tasks::settle(&cluster, &partner, &key, &aic, true).await;
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tasks::MemoryTaskOwners;

    #[tokio::test]
    async fn an_answer_makes_its_caller_the_owner_of_its_task_and_context() {
        let owners: Arc<dyn TaskOwners> =
            Arc::new(MemoryTaskOwners::new(100, Duration::from_secs(60)));
        let a = Aic::parse("10001000011K912345E789ABCDEF2353").unwrap();
        let b = Aic::with_check_code(&format!("10001000011K9{:017}", 7)).unwrap();
        let recorder = |aic| Recorder {
            owners: owners.clone(),
            cluster: None,
            ttl: Duration::from_secs(60),
            partner: "agent".into(),
            aic,
        };
        let answer =
            br#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t-1","contextId":"c-1"}}}"#;
        assert!(recorder(a).record_answer(answer));
        assert_eq!(owners.owner("agent", "t-1"), Some(a));
        assert_eq!(owners.owner("agent", &context_key("c-1")), Some(a));
        // A task id that reads like a context key is still a task apart.
        assert_eq!(owners.owner("agent", "c-1"), None);
        // Another caller's answer naming the same context leaves it to its owner.
        let other = br#"{"jsonrpc":"2.0","id":2,"result":{"task":{"id":"t-2","contextId":"c-1"}}}"#;
        assert!(recorder(b).record_answer(other));
        assert_eq!(owners.owner("agent", &context_key("c-1")), Some(a));
        assert_eq!(owners.owner("agent", "t-2"), Some(b));
        let error = br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32001,"message":"x"}}"#;
        assert!(!recorder(b).record_answer(error));
    }
}
