//! `Permit`: a Partner in-flight permit (`[[partner]] max_in_flight`), held as long as the
//! work at the Partner: the response body, or the recorder of a Partner event stream.

use super::check::{Check, Refuse};
use super::exchange::Exchange;
use super::facts::Parsed;
use crate::error::GatewayError;
use crate::ratelimit::concurrency::InFlightPermit;

/// The step (see the module documentation).
pub(crate) enum PermitStep {}

impl<B> Check<B, Parsed> for PermitStep {
    type Found = InFlightPermit;
    fn check(x: &mut Exchange<B, Parsed>) -> Result<InFlightPermit, Refuse> {
        let permit = x
            .facts
            .route
            .partner
            .in_flight
            .try_acquire()
            .ok_or_else(|| GatewayError::busy("partner_in_flight"))?;
        Ok(permit)
    }
}
