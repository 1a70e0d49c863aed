//! JSON-RPC 2.0 as AIP uses it: the borrowed envelope parse, the method and command
//! vocabulary, and error bodies that echo the request id byte for byte.

pub mod a2a;
pub mod envelope;
pub mod lenient;
pub mod reply;
pub mod vocab;

pub use envelope::{parse, Envelope, EnvelopeError, MessageFacts, Parsed};
pub use reply::{error_body, RpcId};
pub use vocab::{Command, Method};
