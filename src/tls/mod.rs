//! TLS: the listener side ([`server`]: its settings; [`accept`] and [`stream`]: a Leader's
//! connection on rustls's unbuffered API) and the Partner side ([`client`]), and PEM loading.
//! Must not: decide identities (that is `identity`) or look at requests.

pub(crate) mod accept;
pub(crate) mod client;
pub(crate) mod live;
pub(crate) mod pem;
pub(crate) mod provider;
pub(crate) mod server;
pub(crate) mod stream;

pub(crate) use provider::provider;
pub(crate) use server::{build as build_server, ServerTls};
