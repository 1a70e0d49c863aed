//! `Permit`: a Partner in-flight permit (`[[partner]] max_in_flight`), held as long as the
//! work at the Partner: the response body, or the recorder of a Partner event stream.

use std::task::{Context, Poll};

use tower::{Layer, Service};

use super::exchange::{missing_step, Exchange, Refusal, Reply};
use super::step::Step;
use crate::error::GatewayError;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct PermitLayer;

impl<S> Layer<S> for PermitLayer {
    type Service = Permit<S>;
    fn layer(&self, inner: S) -> Permit<S> {
        Permit { inner }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct Permit<S> {
    inner: S,
}

impl<S, B> Service<Exchange<B>> for Permit<S>
where
    S: Service<Exchange<B>, Response = Reply, Error = Refusal>,
{
    type Response = Reply;
    type Error = Refusal;
    type Future = Step<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut x: Exchange<B>) -> Self::Future {
        let Some(route) = &x.route else {
            return Step::refused(x.refuse(missing_step()));
        };
        match route.partner.in_flight.try_acquire() {
            Some(permit) => {
                x.permit = Some(permit);
                Step::Next {
                    next: self.inner.call(x),
                }
            }
            None => Step::refused(x.refuse(GatewayError::busy("partner_in_flight"))),
        }
    }
}
