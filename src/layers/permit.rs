//! `Permit`: a Partner in-flight permit (`[[partner]] max_in_flight`), held as long as the
//! work at the Partner: the response body, or the recorder of a Partner event stream.

use super::check::{Check, CheckLayer, Checked, Refuse};
use super::exchange::{missing_step, Exchange};
use crate::error::GatewayError;

/// The step (see the module documentation).
pub enum PermitStep {}

/// The `Permit` layer.
pub type PermitLayer = CheckLayer<PermitStep>;
/// The `Permit` service.
pub type Permit<S> = Checked<PermitStep, S>;

impl<B> Check<B> for PermitStep {
    fn check(x: &mut Exchange<B>) -> Result<(), Refuse> {
        let route = x.route.as_ref().ok_or_else(missing_step)?;
        let permit = route
            .partner
            .in_flight
            .try_acquire()
            .ok_or_else(|| GatewayError::busy("partner_in_flight"))?;
        x.permit = Some(permit);
        Ok(())
    }
}
