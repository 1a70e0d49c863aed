//! `OcspWait`: under `revocation.ocsp = "hard"`, a request whose certificate has no
//! standing `good` answer waits for the query `Authenticate` queued, at most
//! `revocation.ocsp_timeout`, then goes on (`good`) or is refused with -32010 (`revoked`,
//! or `revocation_status_unknown` for no answer in time, a failed query or `unknown`).
//! It waits on the answers' notification, never on the network itself, after the body
//! is read so the refusal echoes the request's id. Otherwise (`off`, `soft`, a standing
//! `good` answer) the step is a pass-through: the next step's future, unboxed.

use std::sync::Arc;

use bytes::Bytes;

use super::ask::Ask;
use super::exchange::{Exchange, Refusal};
use crate::error::GatewayError;
use crate::identity::verdict::unix_now;
use crate::revocation::ocsp::wire::Subject;

/// The step (see the module documentation).
pub(crate) enum OcspWaitStep {}

impl<F: Send + Sync + 'static> Ask<F> for OcspWaitStep {
    type Plan = Arc<Subject>;

    fn plan(x: &mut Exchange<Bytes, F>) -> Option<Self::Plan> {
        x.snap.ocsp.awaited(&x.conn.identity, unix_now())
    }

    async fn ask(
        x: Exchange<Bytes, F>,
        subject: Self::Plan,
    ) -> Result<Exchange<Bytes, F>, Refusal> {
        let ocsp = x.snap.ocsp.clone();
        match ocsp.wait(&subject).await {
            Ok(()) => Ok(x),
            Err(e) => Err(x.refuse(GatewayError::InvalidCredential(e))),
        }
    }
}
