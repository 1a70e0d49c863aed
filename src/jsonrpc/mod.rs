//! JSON-RPC 2.0 as AIP uses it: the borrowed envelope parse, the method and command
//! vocabulary, and error bodies that echo the request id byte for byte; and as A2A
//! agents use it (`a2a`: the envelope of an A2A Partner's requests; `a2a_answer`: the
//! task and context an A2A answer names).

pub mod a2a;
pub mod a2a_answer;
pub mod envelope;
pub mod lenient;
pub mod reply;
pub mod vocab;

pub use envelope::{parse, Envelope, EnvelopeError, MessageFacts, Parsed};
pub use reply::{error_body, RpcId};
pub use vocab::{Command, Method};
