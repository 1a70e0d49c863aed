//! The body of a request's answer, as the access log (`access_log::Logged`) carries it.
//!
//! The usual answer is a Partner's body relayed as it streams ([`Relayed`]): that one is
//! held by its own type, where boxing it as a [`ResponseBody`] was one allocation per
//! request. Every other body (the gateway's own answers, streams, judged answers) comes
//! boxed as before.

use std::time::Duration;

use http::Response;
use http_body_util::Either;

use crate::body::ResponseBody;
use crate::ratelimit::concurrency::InFlightPermit;
use crate::relay_body::{relayed, Relayed, SseTail};
use crate::upstream::PartnerBody;

/// `relay_body::relay_response` for a Partner's answer holding its in-flight permit (the
/// usual `rpc`): its body by its own type, not boxed.
pub(crate) fn relay_partner(
    resp: Response<PartnerBody>,
    idle: Duration,
    sse: impl FnOnce() -> SseTail,
    held: InFlightPermit,
) -> Response<ReplyBody> {
    relayed(resp, idle, sse, held).map(Either::Left)
}

/// See the module documentation: the left a Partner's body relayed, holding the Partner's
/// in-flight permit (unboxed on purpose: a box is the allocation this type saves; it is
/// moved a few times per request, into the access log's body, then into hyper), the right
/// any other body.
pub(crate) type ReplyBody = Either<Relayed<PartnerBody, InFlightPermit>, ResponseBody>;
