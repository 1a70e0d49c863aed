//! TLS: the listener side ([`server`]) and the Partner side ([`client`]), and PEM loading.
//! Must not: decide identities (that is `identity`) or look at requests.

pub mod client;
pub mod pem;
pub mod server;

pub use server::{build as build_server, ServerTls};
