//! The body of a request's answer, as the access log (`access_log::Logged`) carries it.
//!
//! The usual answer is a Partner's body relayed as it streams ([`Relayed`]): that one is
//! held by its own type, where boxing it as a [`ResponseBody`] was one allocation per
//! request. Every other body (the gateway's own answers, streams, judged answers) comes
//! boxed as before.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};

use crate::body::{BoxError, ResponseBody};
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
    relayed(resp, idle, sse, held).map(ReplyBody::Partner)
}

/// See the module documentation.
// Unboxed on purpose: a box is the allocation this type saves. It is moved a few times
// per request (into the access log's body, then into hyper), not copied at every step.
#[allow(clippy::large_enum_variant)]
pub(crate) enum ReplyBody {
    /// A Partner's body relayed, holding the Partner's in-flight permit.
    Partner(Relayed<PartnerBody, InFlightPermit>),
    /// Any other body.
    Boxed(ResponseBody),
}

impl From<ResponseBody> for ReplyBody {
    fn from(body: ResponseBody) -> ReplyBody {
        ReplyBody::Boxed(body)
    }
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ReplyBody::Partner(b) => Pin::new(b).poll_frame(cx),
            ReplyBody::Boxed(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReplyBody::Partner(b) => b.is_end_stream(),
            ReplyBody::Boxed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReplyBody::Partner(b) => b.size_hint(),
            ReplyBody::Boxed(b) => b.size_hint(),
        }
    }
}
