//! What travels through the request path: the [`Exchange`] (the request and what each
//! step has learned of it), and what comes back out, a [`Reply`] or a [`Refusal`].
//!
//! Steps pass facts on in the exchange's own fields rather than in `http::Extensions`:
//! the first extension would cost three allocations per request (the map, its table, the
//! boxed value). What a later step relies on travels in the exchange's type
//! (`super::facts`); what is optional by nature (a `start`'s claim, a question for
//! Redis) in [`State`].

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HeaderValue;
use http::Response;

use super::facts::{Arrived, Learn, Text};
use super::state_box::{Reused, Spare};
use crate::access_log::RequestLog;
use crate::body::ResponseBody;
use crate::error::GatewayError;
use crate::gateway::Snapshot;
use crate::identity::verdict::unix_now;
use crate::identity::{ConnAuth, ConnIdentity};
use crate::jsonrpc::RpcId;
use crate::policy::tasks::PendingClaim;
use crate::reply_body::ReplyBody;

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
    /// The key exchange group and cipher suite the handshake settled on (access log).
    pub(crate) tls: crate::tls::provider::Negotiated,
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
            tls: Default::default(),
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
        session: &rustls::CommonState,
        server_name: Option<&str>,
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
            &snap.tls.trust.load(),
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
        ConnInfo {
            tls: crate::tls::provider::negotiated(session),
            ..ConnInfo::new(peer, identity, server_name.map(str::to_owned))
        }
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
/// `ReadBody`, then the whole body as one `Bytes`. `F` is what the steps so far
/// established (`super::facts`): a step that needs a fact takes only an exchange that
/// has it.
///
/// Everything but the body sits in one boxed [`State`] (reached through `Deref`): each
/// step takes the exchange by value, and moving a pointer through a dozen steps costs
/// less than copying some 900 bytes at each (measured in benches/README.md, "Request
/// path as layers"). The box is reused from request to request (`super::state_box`).
pub(crate) struct Exchange<B, F = Arrived> {
    /// The body.
    pub(crate) body: B,
    /// What the steps so far established.
    pub(crate) facts: F,
    /// What the steps know of the request.
    pub(crate) state: Reused<State>,
}

/// What `Policy` leaves for `Owners` (cluster mode), with the task it is about.
#[derive(Debug, Clone)]
pub(crate) enum OwnerLookup {
    /// A new claim here: take it in Redis too.
    Claim(Text),
    /// No owner known here: ask Redis.
    Check(Text),
    /// An A2A context (its store key) with no owner known here: ask Redis; without one
    /// there, refused only with `refuse_unknown`.
    Context {
        /// The context's store key (`policy::a2a::context_key`).
        key: Text,
        /// Refuse a context no one owns.
        refuse_unknown: bool,
    },
}

/// What the steps know of a request, besides its body and the facts in its type.
pub(crate) struct State {
    /// Method, URI, version and headers, as received.
    pub(crate) head: http::request::Parts,
    /// The connection it came on.
    pub(crate) conn: Arc<ConnInfo>,
    /// The gateway's settings as of this request's arrival.
    pub(crate) snap: Arc<Snapshot>,
    /// The access log line, filled along the way.
    pub(crate) log: RequestLog,
    /// The JSON-RPC id to echo: `null` until the body is read (`Envelope`).
    pub(crate) id: RpcId,
    /// A `start`'s provisional task claim (`Policy`).
    pub(crate) claim: Option<PendingClaim>,
    /// What `Owners` must ask Redis (cluster mode; `Policy`).
    pub(crate) owner_lookup: Option<OwnerLookup>,
    /// Strict quotas `StrictQuota` checks in Redis (cluster mode; `Quota`).
    pub(crate) strict: Vec<crate::ratelimit::StrictCheck>,
    /// What the routed Partner speaks (`Route`): its callers' errors are in its terms.
    pub(crate) protocol: Option<crate::config::PartnerProtocol>,
}

impl<B, F> std::ops::Deref for Exchange<B, F> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl<B, F> std::ops::DerefMut for Exchange<B, F> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl<B> Exchange<B> {
    /// A request as it arrives.
    pub(crate) fn new(
        request: http::Request<B>,
        conn: Arc<ConnInfo>,
        snap: Arc<Snapshot>,
    ) -> Exchange<B> {
        let (head, body) = request.into_parts();
        Exchange {
            body,
            facts: Arrived,
            state: Reused::new(State::new(head, conn, snap)),
        }
    }
}

impl<B, F> Exchange<B, F> {
    /// The exchange with what a step found added to its facts.
    pub(crate) fn learn<T>(self, found: T) -> Exchange<B, F::Next>
    where
        F: Learn<T>,
    {
        Exchange {
            body: self.body,
            facts: self.facts.learn(found),
            state: self.state,
        }
    }

    /// The facts taken out (by the last step), the rest left.
    pub(crate) fn take_facts(self) -> (Exchange<B>, F) {
        let x = Exchange {
            body: self.body,
            facts: Arrived,
            state: self.state,
        };
        (x, self.facts)
    }

    /// This request refused with `error`, echoing its id.
    pub(crate) fn refuse(self, error: GatewayError) -> Refusal {
        Refusal {
            error,
            state: self.state,
        }
    }

    /// This request answered with `response`.
    pub(crate) fn reply(self, response: Response<ResponseBody>) -> Reply {
        self.reply_with(response.map(http_body_util::Either::Right))
    }

    /// [`Self::reply`] with a body not boxed (a Partner's, relayed).
    pub(crate) fn reply_with(self, response: Response<ReplyBody>) -> Reply {
        Reply {
            response,
            state: self.state,
        }
    }

    /// The same exchange with another body; the old one is returned beside it.
    pub(crate) fn replace_body<C>(self, body: C) -> (Exchange<C, F>, B) {
        let x = Exchange {
            body,
            facts: self.facts,
            state: self.state,
        };
        (x, self.body)
    }
}

thread_local! {
    static SPARE_STATE: std::cell::Cell<Option<Box<Option<State>>>> =
        const { std::cell::Cell::new(None) };
}

impl Spare for State {
    fn slot() -> &'static std::thread::LocalKey<std::cell::Cell<Option<Box<Option<State>>>>> {
        &SPARE_STATE
    }
}

impl State {
    /// Nothing known yet but the request's head and where it came from.
    pub(crate) fn new(
        head: http::request::Parts,
        conn: Arc<ConnInfo>,
        snap: Arc<Snapshot>,
    ) -> State {
        State {
            head,
            conn,
            snap,
            log: RequestLog::default(),
            id: RpcId::null(),
            claim: None,
            owner_lookup: None,
            strict: Vec::new(),
            protocol: None,
        }
    }

    /// What the Partner the request is for speaks: as `Route` found it, else (a refusal
    /// before the route, such as a missing certificate) looked up now, AIP without one.
    pub(crate) fn protocol(&self) -> crate::config::PartnerProtocol {
        self.protocol.unwrap_or_else(|| {
            let host = crate::routing::request_host(
                &self.head.uri,
                &self.head.headers,
                self.conn.sni.as_deref(),
            );
            let (router, path) = (&self.snap.router, self.head.uri.path());
            router
                .route(host.as_deref(), path)
                // An agent card's path (below an A2A Partner's prefix) is its Partner's too.
                .or_else(|| {
                    let (prefix, _) = crate::a2a::card::well_known(path)?;
                    router.route(host.as_deref(), prefix)
                })
                .map(|r| r.partner.config.protocol)
                .unwrap_or_default()
        })
    }

    /// The request's declared `Content-Length`.
    pub(crate) fn content_length(&self) -> Option<u64> {
        crate::body::declared_length(&self.head.headers)
    }
}

/// A request answered (by the Partner, or by the gateway from its replay buffer).
pub(crate) struct Reply {
    /// The answer, its body still streaming.
    pub(crate) response: Response<ReplyBody>,
    /// What the steps knew of the request (its access log line among it).
    pub(crate) state: Reused<State>,
}

/// A request refused: the error, and what the steps knew of the request (the id to echo,
/// the access log line). Turned into a response in one place, `Respond`. Small, so the
/// futures that may hold one stay small.
pub(crate) struct Refusal {
    /// What went wrong.
    pub(crate) error: GatewayError,
    /// What the steps knew of the request.
    pub(crate) state: Reused<State>,
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
pub(crate) type Handled = Result<Reply, Refusal>;
