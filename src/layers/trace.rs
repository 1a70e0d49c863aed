//! `Trace`: the request id and W3C trace context, taken first so every outcome is logged
//! with them (`crate::trace` makes and continues them).
//!
//! Hand-written rather than tower-http's `SetRequestId`: the id goes into the access log
//! and the Partner's headers, not into request extensions (three allocations a request).

use super::check::{Check, Refuse};
use super::exchange::Exchange;
use crate::trace::TraceContext;

/// The step (see the module documentation).
pub(crate) enum TraceStep {}

impl<B, F> Check<B, F> for TraceStep {
    type Found = ();
    fn check(x: &mut Exchange<B, F>) -> Result<(), Refuse> {
        let mut trace = TraceContext::from_request(&x.head.headers);
        if let Some(tracer) = &x.snap.tracer {
            trace.start_spans(tracer);
        }
        x.log.trace = Some(trace);
        Ok(())
    }
}
