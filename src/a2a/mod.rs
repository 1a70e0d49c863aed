//! A2A (Agent2Agent) agents behind the gateway: what the gateway does itself for them.
//!
//! - [`card`]: the agent card served at `{prefix}/.well-known/agent-card.json` (and the
//!   legacy `agent.json`): fetched from the agent, cached within bounds, its endpoint URLs
//!   pointed at the gateway and mutual TLS declared as its security scheme.
//! - [`push`]: the push-notification URLs a caller hands an agent, checked against the
//!   Partner's policy before the request is forwarded (the agent would call them: SSRF).

pub(crate) mod card;
pub(crate) mod push;
