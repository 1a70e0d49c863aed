//! `Owners`: in cluster mode, task ownership that needs Redis. A `start` that claimed its
//! task here claims it in Redis before it is forwarded (another AIC's claim there wins:
//! -32009 `not_task_owner`); a command on a task this instance has no owner for asks
//! Redis for one (cached here when found), and only then does `policy.tasks.unknown`
//! apply. Redis down or slow (`cluster.command_timeout`): the instance's own owners
//! decide, as in local mode. In local mode, and for every request `Policy` settled, the
//! step is a pass-through: the next step's future, unboxed.

use std::sync::Arc;

use bytes::Bytes;

use super::ask::Ask;
use super::exchange::{Exchange, OwnerLookup, Refusal};
use super::facts::Parsed;
use crate::cluster::{tasks, Cluster};
use crate::policy::a2a::{not_context_owner, unknown_context};
use crate::policy::tasks::{not_task_owner, unknown_task, UnknownTask};

/// The step (see the module documentation).
pub(crate) enum OwnersStep {}

impl Ask<Parsed> for OwnersStep {
    type Plan = (OwnerLookup, Arc<Cluster>);

    fn plan(x: &mut Exchange<Bytes, Parsed>) -> Option<Self::Plan> {
        let lookup = x.owner_lookup.take();
        Some((lookup?, x.snap.cluster.clone()?))
    }

    fn ask(
        x: Exchange<Bytes, Parsed>,
        (lookup, cluster): Self::Plan,
    ) -> impl std::future::Future<Output = Result<Exchange<Bytes, Parsed>, Refusal>> + Send {
        ask(x, lookup, cluster)
    }
}

async fn ask(
    mut x: Exchange<Bytes, Parsed>,
    lookup: OwnerLookup,
    cluster: Arc<Cluster>,
) -> Result<Exchange<Bytes, Parsed>, Refusal> {
    let Parsed { caller, route, .. } = &x.facts;
    let aic = caller.aic;
    let partner = route.partner.config.name.clone();
    let task = match &lookup {
        OwnerLookup::Claim(t) | OwnerLookup::Check(t) => t.get(&x.body).to_owned(),
        OwnerLookup::Context { key, .. } => key.get(&x.body).to_owned(),
    };
    let tasks_policy = &x.snap.config.tasks;
    match lookup {
        OwnerLookup::Claim(_) => {
            match tasks::claim(&cluster, &partner, &task, &aic, tasks_policy.ttl).await {
                Ok(tasks::Claim::Ours { pending }) => {
                    // Only a claim this start created or joined in Redis is settled by its
                    // answer there; one already accepted is not this request's to undo.
                    if let (true, Some(claim)) = (pending, x.claim.as_mut()) {
                        let (c, p, t) = (cluster.clone(), partner.clone(), task.clone());
                        claim.also_on_settle(Box::new(move |accepted| {
                            tokio::spawn(async move {
                                let _ = tasks::settle(&c, &p, &t, &aic, accepted).await;
                            });
                        }));
                    }
                    Ok(x)
                }
                Ok(tasks::Claim::Theirs(owner)) => {
                    // Another instance's caller holds it: this claim goes, the owner is cached.
                    drop(x.claim.take());
                    x.snap.tasks.learn(&partner, &task, &owner);
                    Err(x.refuse(not_task_owner(&task, &owner, &aic)))
                }
                // Redis unreachable: the claim taken here stands (local mode's rule).
                Err(_) => Ok(x),
            }
        }
        OwnerLookup::Check(_) => {
            let unknown = tasks_policy.unknown;
            match tasks::owner(&cluster, &partner, &task).await {
                Ok(Some(owner)) => {
                    x.snap.tasks.learn(&partner, &task, &owner);
                    if owner == aic {
                        Ok(x)
                    } else {
                        Err(x.refuse(not_task_owner(&task, &owner, &aic)))
                    }
                }
                Ok(None) | Err(_) if unknown == UnknownTask::Refuse => {
                    Err(x.refuse(unknown_task(&task)))
                }
                Ok(None) | Err(_) => Ok(x),
            }
        }
        OwnerLookup::Context { refuse_unknown, .. } => {
            let context = task.strip_prefix("\0context:").unwrap_or(&task);
            match tasks::owner(&cluster, &partner, &task).await {
                Ok(Some(owner)) => {
                    x.snap.tasks.learn(&partner, &task, &owner);
                    if owner == aic {
                        Ok(x)
                    } else {
                        Err(x.refuse(not_context_owner(context, &owner, &aic)))
                    }
                }
                Ok(None) | Err(_) if refuse_unknown => Err(x.refuse(unknown_context(context))),
                Ok(None) | Err(_) => Ok(x),
            }
        }
    }
}
