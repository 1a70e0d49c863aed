//! `Authenticate`: the connection's identity verdict as of now (re-judged when the trust
//! settings or the clock moved: `identity::verdict`), then its certificate's OCSP answer
//! (`revocation::ocsp`: a standing `revoked` answer refuses), then the block list. No request
//! goes further without a verified AIC that is not blocked: `-32008` without a
//! certificate, `-32010` for a rejected or blocked one. A refusal reads the body (bounded
//! by `limits.max_body_bytes`) only to echo its id, and is counted against the Partner
//! the path names; the connection is marked, so the listener closes it after the answer
//! when it had no verified AIC at its handshake.

use super::check::{Check, Refuse};
use super::exchange::Exchange;
use super::facts::Arrived;
use crate::error::GatewayError;
use crate::identity::verdict::unix_now;
use crate::identity::ConnAuth;
use crate::revocation::ocsp::Gate;

/// The step (see the module documentation).
pub(crate) enum AuthenticateStep {}

impl<B> Check<B, Arrived> for AuthenticateStep {
    type Found = std::sync::Arc<crate::identity::PeerIdentity>;
    fn check(x: &mut Exchange<B>) -> Result<Self::Found, Refuse> {
        let now = unix_now();
        let (audit, peer) = (&x.snap.audit, x.conn.peer);
        let verdict = x
            .conn
            .identity
            .verdict_noting(&x.snap.tls.trust.load(), now, |a, b| {
                audit.verdict_changed(peer, a, b)
            });
        let error = match verdict {
            ConnAuth::Verified(caller) => {
                x.log.aic = Some(caller.aic);
                // A verified chain: its CRL Distribution Points may be followed.
                let presented = &x.snap.presented;
                if presented.enabled() {
                    x.conn
                        .identity
                        .once_per_verdict(|chain| presented.offer_chain(chain));
                }
                let ocsp = x
                    .snap
                    .ocsp
                    .gate(&x.conn.identity, x.snap.tls.trust.ca_certs(), now);
                match ocsp {
                    // A `hard` wait happens in `OcspWait`, once the id is known.
                    Gate::Pass | Gate::Wait => {
                        match x.snap.config.policy.check_blocked(&caller.aic) {
                            Ok(()) => return Ok(caller),
                            Err(e) => e,
                        }
                    }
                    Gate::Refuse(e) => GatewayError::InvalidCredential(e),
                }
            }
            ConnAuth::Missing => GatewayError::AuthenticationRequired,
            ConnAuth::Rejected(e) => GatewayError::InvalidCredential(e),
        };
        // The listener closes the connection after this answer if it had no verified AIC
        // at its handshake.
        x.conn
            .auth_refused
            .store(true, std::sync::atomic::Ordering::Relaxed);
        // Counted against the Partner the path names, without telling the caller
        // whether there is one.
        x.log.partner = super::route::lookup(x).map(|r| r.partner.label.clone());
        Err(Refuse::ReadingId {
            error,
            limit: x.snap.config.max_body_bytes,
            declared_only: false,
        })
    }
}
