//! What travels through the request path: the [`Exchange`] (the request and what each
//! step has learned of it), and what comes back out, a [`Reply`] or a [`Refusal`].
//!
//! Steps pass facts on in the exchange's own fields rather than in `http::Extensions`:
//! the first extension would cost three allocations per request (the map, its table, the
//! boxed value), and a field says in its type which step fills it.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderValue;
use http::Response;

use crate::access_log::RequestLog;
use crate::body::ResponseBody;
use crate::error::GatewayError;
use crate::gateway::Snapshot;
use crate::identity::verdict::unix_now;
use crate::identity::{ConnAuth, ConnIdentity, PeerIdentity};
use crate::jsonrpc::envelope::Shape;
use crate::jsonrpc::{Command, Method, RpcId};
use crate::policy::tasks::PendingClaim;
use crate::ratelimit::concurrency::InFlightPermit;
use crate::routing::Route;

/// What a request knows about its connection: made once per connection.
#[derive(Debug)]
pub struct ConnInfo {
    /// The client's address.
    pub peer: SocketAddr,
    /// The client's certificate chain and the verdict on it.
    pub identity: ConnIdentity,
    /// TLS SNI, when sent.
    pub sni: Option<String>,
    /// `x-forwarded-for` and `forwarded` for the Partner, made once per connection.
    pub(crate) forwarded: [HeaderValue; 2],
    /// Set by `Authenticate` when it refused a request for want of a verified AIC that
    /// is not blocked: the listener closes a connection that had no verified AIC at its
    /// handshake after that answer.
    pub(crate) auth_refused: std::sync::atomic::AtomicBool,
}

impl ConnInfo {
    /// A connection's facts, and the header values made from them.
    pub fn new(peer: SocketAddr, identity: ConnIdentity, sni: Option<String>) -> ConnInfo {
        ConnInfo {
            peer,
            identity,
            sni,
            forwarded: forwarded_values(peer),
            auth_refused: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl ConnInfo {
    /// The connection's identity, computed once after its TLS handshake (and again only
    /// when the trust settings change or the clock passes the chain's or CRLs' expiry),
    /// and counted in the identity metrics. For the gateway's listener and for a Partner
    /// embedding the request path behind its own rustls acceptor alike.
    pub fn accepted(
        peer: SocketAddr,
        session: &rustls::ServerConnection,
        snap: &Snapshot,
    ) -> ConnInfo {
        // A full strict handshake has just verified the chain with these very settings; a
        // resumed session restores the chain from the session cache unverified, so it is
        // verified here like any other.
        let verified_by_handshake = snap.tls.strict
            && matches!(
                session.handshake_kind(),
                Some(
                    rustls::HandshakeKind::Full | rustls::HandshakeKind::FullWithHelloRetryRequest
                )
            );
        let identity = ConnIdentity::new(
            session.peer_certificates(),
            &snap.tls.trust,
            verified_by_handshake,
            unix_now(),
        );
        let failure = match identity.last() {
            ConnAuth::Rejected(e) => {
                tracing::info!(%peer, reason = e.reason(), "client certificate rejected");
                Some(e.reason())
            }
            ConnAuth::Missing => Some("no_client_certificate"),
            ConnAuth::Verified(id) => {
                let labels = crate::metrics::IdentityLabels {
                    form: id.aic.form().label(),
                    check: id.check.label(),
                };
                snap.metrics.identities.get_or_create(&labels).inc();
                None
            }
        };
        if let Some(reason) = failure {
            let labels = crate::metrics::ReasonLabels { reason };
            snap.metrics.identity_failures.get_or_create(&labels).inc();
        }
        ConnInfo::new(peer, identity, session.server_name().map(str::to_owned))
    }
}

/// `x-forwarded-for` and `forwarded` (RFC 7239: an IPv6 address bracketed and quoted)
/// naming `peer`.
pub(crate) fn forwarded_values(peer: SocketAddr) -> [HeaderValue; 2] {
    let ip = peer.ip();
    let forwarded = match ip {
        std::net::IpAddr::V4(v4) => format!("for={v4};proto=https"),
        std::net::IpAddr::V6(v6) => format!("for=\"[{v6}]\";proto=https"),
    };
    let value = |s: &str| HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""));
    [value(&ip.to_string()), value(&forwarded)]
}

/// One request on its way through the steps. `B` is the body: the client's stream until
/// `ReadBody`, then the whole body as one `Bytes`.
///
/// Everything but the body sits in one boxed [`State`] (reached through `Deref`): each
/// step takes the exchange by value, and moving a pointer through a dozen steps costs
/// less than copying some 900 bytes at each (one allocation a request; measured in
/// benches/README.md, "Request path as layers").
pub struct Exchange<B> {
    /// The body.
    pub body: B,
    /// What the steps know of the request.
    pub state: Box<State>,
}

/// What `Policy` leaves for `Owners` (cluster mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerLookup {
    /// A new claim here: take it in Redis too.
    Claim,
    /// No owner known here: ask Redis.
    Check,
}

/// What the steps know of a request, besides its body.
pub struct State {
    /// Method, URI, version and headers, as received.
    pub head: http::request::Parts,
    /// The connection it came on.
    pub conn: Arc<ConnInfo>,
    /// The gateway's settings as of this request's arrival.
    pub snap: Arc<Snapshot>,
    /// The access log line, filled along the way.
    pub log: RequestLog,
    /// The JSON-RPC id to echo: `null` until the body is read (`Envelope`).
    pub id: RpcId,
    /// The verified caller (`Authenticate`).
    pub caller: Option<Arc<PeerIdentity>>,
    /// The Partner and the method its path names (`Route`).
    pub route: Option<Route>,
    /// What the envelope says (`Envelope`).
    pub call: Option<Call>,
    /// A `start`'s provisional task claim (`Policy`).
    pub claim: Option<PendingClaim>,
    /// What `Owners` must ask Redis (cluster mode; `Policy`).
    pub owner_lookup: Option<OwnerLookup>,
    /// Strict quotas `StrictQuota` checks in Redis (cluster mode; `Quota`).
    pub strict: Vec<crate::ratelimit::StrictCheck>,
    /// The Partner in-flight permit (`Permit`).
    pub permit: Option<InFlightPermit>,
}

impl<B> std::ops::Deref for Exchange<B> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl<B> std::ops::DerefMut for Exchange<B> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl<B> Exchange<B> {
    /// A request as it arrives.
    pub fn new(request: http::Request<B>, conn: Arc<ConnInfo>, snap: Arc<Snapshot>) -> Exchange<B> {
        let (head, body) = request.into_parts();
        Exchange {
            body,
            state: Box::new(State::new(head, conn, snap)),
        }
    }

    /// This request refused with `error`, echoing its id.
    pub fn refuse(self, error: GatewayError) -> Refusal {
        Refusal {
            error,
            state: self.state,
        }
    }

    /// This request answered with `response`.
    pub fn reply(self, response: Response<ResponseBody>) -> Reply {
        Reply {
            response,
            state: self.state,
        }
    }

    /// The same exchange with another body; the old one is returned beside it.
    pub fn replace_body<C>(self, body: C) -> (Exchange<C>, B) {
        let x = Exchange {
            body,
            state: self.state,
        };
        (x, self.body)
    }
}

impl State {
    /// Nothing known yet but the request's head and where it came from.
    pub fn new(head: http::request::Parts, conn: Arc<ConnInfo>, snap: Arc<Snapshot>) -> State {
        State {
            head,
            conn,
            snap,
            log: RequestLog::default(),
            id: RpcId::null(),
            caller: None,
            route: None,
            call: None,
            claim: None,
            owner_lookup: None,
            strict: Vec::new(),
            permit: None,
        }
    }

    /// The request's declared `Content-Length`.
    pub fn content_length(&self) -> Option<u64> {
        self.head
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
    }
}

/// What a step answers when an earlier step it needs is not in the stack: `-32603`
/// (`missing_step`), never a panic.
pub fn missing_step() -> GatewayError {
    GatewayError::Internal {
        reason: "missing_step",
    }
}

/// A request answered (by the Partner, or by the gateway from its replay buffer).
pub struct Reply {
    /// The answer, its body still streaming.
    pub response: Response<ResponseBody>,
    /// What the steps knew of the request (its access log line among it).
    pub state: Box<State>,
}

/// A request refused: the error, and what the steps knew of the request (the id to echo,
/// the access log line). Turned into a response in one place, `Respond`. Small, so the
/// futures that may hold one stay small.
pub struct Refusal {
    /// What went wrong.
    pub error: GatewayError,
    /// What the steps knew of the request.
    pub state: Box<State>,
}

impl std::fmt::Debug for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refusal")
            .field("error", &self.error)
            .field("id", &self.state.id)
            .finish()
    }
}

/// What every step's future yields.
pub type Outcome = Result<Reply, Refusal>;

/// A string of the request body: where it lies in the body (no copy), or its unescaped
/// copy when the JSON escaped it.
#[derive(Debug, Clone)]
pub enum Text {
    /// Bytes `start..end` of the body.
    At(u32, u32),
    /// An unescaped copy.
    Owned(Box<str>),
}

impl Text {
    /// `text` as found in `body` (borrowed from it, or unescaped).
    pub fn of(body: &[u8], text: &str) -> Text {
        let at = crate::body::position_in(body, text.as_bytes())
            .and_then(|r| Some((u32::try_from(r.start).ok()?, u32::try_from(r.end).ok()?)));
        match at {
            Some((start, end)) => Text::At(start, end),
            None => Text::Owned(text.into()),
        }
    }

    /// The text, read from the body it was found in.
    pub fn get<'a>(&'a self, body: &'a [u8]) -> &'a str {
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
pub struct Call {
    /// The JSON-RPC method.
    pub method: Method,
    /// v01.00 `params.message` or v02.01 `params.command`.
    pub shape: Option<Shape>,
    /// Whether the request carries a message (or command).
    pub has_message: bool,
    /// The command.
    pub command: Option<Command>,
    /// `taskId`.
    pub task_id: Option<Text>,
    /// `sessionId`.
    pub session_id: Option<Text>,
    /// `senderId`.
    pub sender_id: Option<Text>,
    /// `senderRole`.
    pub sender_role: Option<Text>,
    /// A `group` invitation's `params.group.leader.aic`.
    pub group_leader: Option<Text>,
    /// `lastEventSeq`.
    pub last_event_seq: Option<u64>,
}

impl Call {
    /// The facts of a validated envelope.
    pub fn of(body: &Bytes, e: &crate::jsonrpc::Envelope<'_>) -> Call {
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
