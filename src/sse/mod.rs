//! Server-sent events: splitting a Partner's stream into events, reading their
//! `eventSeq`, buffering them for replay, and relaying them to Leaders.

pub mod count;
pub mod event;
pub mod memory;
pub mod relay;
pub mod replay;
mod slots;
pub mod splitter;
