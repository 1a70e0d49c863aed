//! What each step establishes, handed to the next in the exchange's type: a step that
//! finds something (`Authenticate` the caller, `Route` the Partner, `Envelope` the call,
//! `Permit` the in-flight permit) turns `Exchange<B, F>` into `Exchange<B, F::Next>`, and
//! a step that needs a fact is implemented only for the facts that hold it. A stack
//! assembled in the wrong order does not compile; no step checks at run time whether an
//! earlier one ran.
//!
//! The order, with the step that adds each fact:
//!
//! ```text
//! Arrived --Authenticate--> Verified --Route--> Admitted --Envelope--> Parsed --Permit--> Permitted
//! ```

use std::sync::Arc;

use bytes::Bytes;

use crate::identity::PeerIdentity;
use crate::jsonrpc::envelope::Shape;
use crate::jsonrpc::{Command, Method};
use crate::ratelimit::concurrency::InFlightPermit;
use crate::routing::Route;

/// Nothing established yet (or what a last step left once it took the facts out).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Arrived;

/// `Authenticate`: a verified caller that is not blocked.
pub(crate) struct Verified {
    /// The caller.
    pub(crate) caller: Arc<PeerIdentity>,
}

/// `Route`: the Partner the host and path name (and the method the path names).
pub(crate) struct Admitted {
    /// The caller.
    pub(crate) caller: Arc<PeerIdentity>,
    /// The Partner.
    pub(crate) route: Route,
}

/// `Envelope`: what a valid envelope says.
pub(crate) struct Parsed {
    /// The caller.
    pub(crate) caller: Arc<PeerIdentity>,
    /// The Partner.
    pub(crate) route: Route,
    /// The call.
    pub(crate) call: Call,
}

/// `Permit`: the Partner in-flight permit, held until the answer ends.
pub(crate) struct Permitted {
    /// The caller.
    pub(crate) caller: Arc<PeerIdentity>,
    /// The Partner.
    pub(crate) route: Route,
    /// The call.
    pub(crate) call: Call,
    /// The permit.
    pub(crate) permit: InFlightPermit,
}

/// Facts that, with what a step found (`T`), become the next facts.
pub(crate) trait Learn<T> {
    /// The facts after the step.
    type Next;
    /// Adds `found`.
    fn learn(self, found: T) -> Self::Next;
}

/// A step that only judges finds nothing: the facts stay as they were.
impl<F> Learn<()> for F {
    type Next = F;
    fn learn(self, (): ()) -> F {
        self
    }
}

impl Learn<Arc<PeerIdentity>> for Arrived {
    type Next = Verified;
    fn learn(self, caller: Arc<PeerIdentity>) -> Verified {
        Verified { caller }
    }
}

impl Learn<Route> for Verified {
    type Next = Admitted;
    fn learn(self, route: Route) -> Admitted {
        Admitted {
            caller: self.caller,
            route,
        }
    }
}

impl Learn<Call> for Admitted {
    type Next = Parsed;
    fn learn(self, call: Call) -> Parsed {
        Parsed {
            caller: self.caller,
            route: self.route,
            call,
        }
    }
}

impl Learn<InFlightPermit> for Parsed {
    type Next = Permitted;
    fn learn(self, permit: InFlightPermit) -> Permitted {
        Permitted {
            caller: self.caller,
            route: self.route,
            call: self.call,
            permit,
        }
    }
}

/// A string of the request body: where it lies in the body (no copy), or its unescaped
/// copy when the JSON escaped it.
#[derive(Debug, Clone)]
pub(crate) enum Text {
    /// Bytes `start..end` of the body.
    At(u32, u32),
    /// An unescaped copy.
    Owned(Box<str>),
}

impl Text {
    /// `text` as found in `body` (borrowed from it, or unescaped).
    pub(crate) fn of(body: &[u8], text: &str) -> Text {
        let at = crate::body::position_in(body, text.as_bytes())
            .and_then(|r| Some((u32::try_from(r.start).ok()?, u32::try_from(r.end).ok()?)));
        match at {
            Some((start, end)) => Text::At(start, end),
            None => Text::Owned(text.into()),
        }
    }

    /// The text, read from the body it was found in.
    pub(crate) fn get<'a>(&'a self, body: &'a [u8]) -> &'a str {
        match self {
            Text::At(s, e) => body
                .get(*s as usize..*e as usize)
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or(""),
            Text::Owned(s) => s,
        }
    }
}

/// What a valid envelope says that later steps need, kept without borrowing the body.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// The JSON-RPC method.
    pub(crate) method: Method,
    /// v01.00 `params.message` or v02.01 `params.command`.
    pub(crate) shape: Option<Shape>,
    /// Whether the request carries a message (or command).
    pub(crate) has_message: bool,
    /// The command.
    pub(crate) command: Option<Command>,
    /// `taskId`.
    pub(crate) task_id: Option<Text>,
    /// `sessionId`.
    pub(crate) session_id: Option<Text>,
    /// `senderId`.
    pub(crate) sender_id: Option<Text>,
    /// `senderRole`.
    pub(crate) sender_role: Option<Text>,
    /// A `group` invitation's `params.group.leader.aic`.
    pub(crate) group_leader: Option<Text>,
    /// `lastEventSeq`.
    pub(crate) last_event_seq: Option<u64>,
}

impl Call {
    /// A call the AIP semantics do not apply to (an A2A Partner's): no message, no task.
    pub(crate) fn opaque() -> Call {
        Call {
            method: Method::Rpc,
            shape: None,
            has_message: false,
            command: None,
            task_id: None,
            session_id: None,
            sender_id: None,
            sender_role: None,
            group_leader: None,
            last_event_seq: None,
        }
    }

    /// The facts of a validated envelope.
    pub(crate) fn of(body: &Bytes, e: &crate::jsonrpc::Envelope<'_>) -> Call {
        let text = |s: &Option<std::borrow::Cow<'_, str>>| s.as_deref().map(|s| Text::of(body, s));
        let m = e.message.as_ref();
        Call {
            method: e.method,
            shape: e.shape,
            has_message: m.is_some(),
            command: m.and_then(|m| m.command),
            task_id: text(&e.task_id),
            session_id: m.and_then(|m| text(&m.session_id)),
            sender_id: m.and_then(|m| text(&m.sender_id)),
            sender_role: m.and_then(|m| text(&m.sender_role)),
            group_leader: text(&e.group_leader),
            last_event_seq: m.and_then(|m| m.last_event_seq),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_points_into_the_body_or_keeps_an_unescaped_copy() {
        let body = Bytes::from_static(br#"{"taskId":"t-1"}"#);
        let inside = std::str::from_utf8(&body[11..14]).unwrap();
        let t = Text::of(&body, inside);
        assert!(matches!(t, Text::At(11, 14)));
        assert_eq!(t.get(&body), "t-1");
        let unescaped = String::from("t\"1");
        let t = Text::of(&body, &unescaped);
        assert!(matches!(t, Text::Owned(_)));
        assert_eq!(t.get(&body), "t\"1");
    }
}
