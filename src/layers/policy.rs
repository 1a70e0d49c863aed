//! `Policy`: who may call what. `params.message.senderId` (or `params.command.senderId`),
//! in every method that carries one, must be the caller's own AIC (and a `group`
//! invitation's leader too), then the sender role, the Partner's access
//! rules, and task ownership: a `start` claims its task provisionally (kept only if the
//! Partner accepts it), other commands must come from the task's owner. In cluster mode
//! what needs Redis (a new claim, an owner not known here) is left to `Owners`.

use bytes::Bytes;

use super::check::{Check, Refuse};
use super::exchange::{Exchange, OwnerLookup};
use super::facts::{Call, Parsed, Text};
use crate::error::GatewayError;
use crate::identity::Aic;
use crate::jsonrpc::envelope::EnvelopeError;
use crate::jsonrpc::Method;
use crate::policy::tasks::{check_task, is_start};

/// The step (see the module documentation).
pub(crate) enum PolicyStep {}

impl Check<Bytes, Parsed> for PolicyStep {
    type Found = ();
    fn check(x: &mut Exchange<Bytes, Parsed>) -> Result<(), Refuse> {
        Ok(check(x)?)
    }
}

fn check(x: &mut Exchange<Bytes, Parsed>) -> Result<(), GatewayError> {
    let Parsed {
        caller,
        route,
        call,
    } = &x.facts;
    let x_body = &x.body;
    let x = &mut *x.state;
    let call = match call {
        Call::Aip(call) => call,
        Call::A2a(call) => return super::a2a_policy::check(caller, route, call, x_body, x),
    };
    let body = &x_body[..];
    fn text<'a>(t: &'a Option<Text>, body: &'a [u8]) -> Option<&'a str> {
        t.as_ref().map(|t| t.get(body))
    }
    let cfg = &x.snap.config;
    let partner = &route.partner.config;
    if let Some(sender) = text(&call.sender_id, body) {
        check_sender(sender, &caller.aic)?;
    }
    if let Some(leader) = text(&call.group_leader, body) {
        check_group_leader(leader, &caller.aic)?;
    }
    cfg.policy.check_role(text(&call.sender_role, body))?;
    partner
        .access
        .check_peer(caller, call.method, &partner.name)?;
    let task = text(&call.task_id, body);
    let clustered = x.snap.cluster.is_some();
    // Cluster mode: an owner this instance does not know may be known to Redis; the
    // `Owners` step asks before the unknown-task rule applies.
    let ask = clustered
        && call.method != Method::Group
        && !is_start(call.method, call.command)
        && task.is_some_and(|t| x.snap.tasks.owner(&partner.name, t).is_none());
    if let (true, Some(t)) = (ask, &call.task_id) {
        x.owner_lookup = Some(OwnerLookup::Check(t.clone()));
        return Ok(());
    }
    // A `start`'s claim is provisional until the Partner accepts it.
    x.claim = check_task(
        &x.snap.tasks,
        cfg.tasks.unknown,
        &partner.name,
        &caller.aic,
        call.method,
        call.command,
        task,
        text(&call.session_id, body),
    )?;
    let metrics = x.claim.is_some().then(|| x.snap.metrics.clone());
    if let (Some(claim), Some(metrics)) = (x.claim.as_mut(), metrics) {
        claim.count_in(metrics);
    }
    if let (true, Some(_), Some(t)) = (clustered, &x.claim, &call.task_id) {
        // New here: claimed in Redis too before it is forwarded (a claim is of a task).
        x.owner_lookup = Some(OwnerLookup::Claim(t.clone()));
    }
    Ok(())
}

/// `senderId` must name the caller's certificate AIC. The usual exact match costs one
/// compare; another spelling (a dotted AIC in lowercase) is parsed and compared.
fn check_sender(sender: &str, caller: &Aic) -> Result<(), GatewayError> {
    if sender == caller.as_str() || Aic::parse(sender).is_ok_and(|a| a == *caller) {
        return Ok(());
    }
    Err(GatewayError::Forbidden {
        reason: "sender_mismatch",
        detail: format!("senderId {sender:?} is not the caller's certificate AIC {caller}"),
    })
}

/// A `group` invitation's `params.group.leader.aic` must be the caller's own AIC.
fn check_group_leader(leader: &str, caller: &Aic) -> Result<(), GatewayError> {
    match Aic::parse(leader) {
        Ok(a) if a == *caller => Ok(()),
        Ok(_) => Err(GatewayError::Forbidden {
            reason: "group_leader_mismatch",
            detail: format!(
                "params.group.leader.aic {leader:?} is not the caller's certificate AIC {caller}"
            ),
        }),
        Err(e) => Err(GatewayError::Envelope(EnvelopeError::InvalidParams {
            field: "params.group.leader.aic",
            message: format!("params.group.leader.aic {leader:?} is not an AIC: {e}"),
        })),
    }
}
