//! Server-sent events: splitting a Partner's stream into events, reading their
//! `eventSeq`, buffering them for replay, and relaying them to Leaders.

pub(crate) mod count;
pub(crate) mod emit;
pub(crate) mod event;
pub(crate) mod follow;
pub(crate) mod handed;
pub(crate) mod memory;
pub(crate) mod relay;
pub(crate) mod replay;
mod scan;
mod slots;
pub(crate) mod source;
pub(crate) mod splitter;
