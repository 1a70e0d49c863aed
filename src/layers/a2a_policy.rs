//! `Policy` for an A2A Partner's request: the Partner's access rule (A2A Partners have
//! no per-method rules), then ownership (`policy::a2a`): a call naming a task (its
//! `params.id`, `params.taskId` or `params.message.taskId`) or a context (a message's or
//! `ListTasks`' `contextId`) that another AIC owns is refused; `ListTasks` must name a
//! context of the caller's own. A task without a known owner follows
//! `policy.tasks.unknown`, as for AIP; a message to an unknown context may start it.
//! In cluster mode an owner not known here is asked of Redis (`Owners`).

use crate::config::UnknownTask;
use crate::error::GatewayError;
use crate::identity::PeerIdentity;
use crate::jsonrpc::a2a::A2aMethod;
use crate::layers::exchange::{OwnerLookup, State};
use crate::layers::facts::{A2aCall, Text};
use crate::policy::a2a::{context_key, list_unscoped, not_context_owner, unknown_context};
use crate::policy::tasks::{not_task_owner, unknown_task};
use crate::routing::Route;

/// Judges an A2A call (`body`: the request body the call's texts point into).
pub(crate) fn check(
    caller: &PeerIdentity,
    route: &Route,
    call: &A2aCall,
    body: &[u8],
    x: &mut State,
) -> Result<(), GatewayError> {
    let partner = &route.partner.config;
    partner
        .access
        .check_base(caller, call.verb.name(), &partner.name)?;
    let (owners, me) = (&x.snap.tasks, caller.aic);
    let unknown = x.snap.config.tasks.unknown;
    let clustered = x.snap.cluster.is_some();
    if let Some(t) = &call.task_id {
        let task = t.get(body);
        match owners.owner(&partner.name, task) {
            Some(owner) if owner != me => return Err(not_task_owner(task, &owner, &me)),
            Some(_) => {}
            None if clustered => x.owner_lookup = Some(OwnerLookup::Check(t.clone())),
            None if unknown == UnknownTask::Refuse => return Err(unknown_task(task)),
            None => {}
        }
    }
    let lists = call.verb.method == A2aMethod::ListTasks;
    let Some(c) = &call.context_id else {
        return if lists { Err(list_unscoped()) } else { Ok(()) };
    };
    let context = c.get(body);
    let key = context_key(context);
    // Only a list must name a known context: a message may start a new one.
    let refuse_unknown = lists && unknown == UnknownTask::Refuse;
    match owners.owner(&partner.name, &key) {
        Some(owner) if owner != me => Err(not_context_owner(context, &owner, &me)),
        Some(_) => Ok(()),
        None if clustered && x.owner_lookup.is_none() => {
            x.owner_lookup = Some(OwnerLookup::Context {
                key: Text::Owned(key.into()),
                refuse_unknown,
            });
            Ok(())
        }
        None if refuse_unknown => Err(unknown_context(context)),
        None => Ok(()),
    }
}
