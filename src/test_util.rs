//! The gateway's internals that its own benches, integration tests and fuzz targets
//! drive directly (`test-util` feature, turned on for them by the crate's dev-dependency
//! on itself; the fuzz targets ask for it). Not an API: nothing here is
//! promised to stay.

pub use crate::a2a::push::find as a2a_push_urls;
pub use crate::allocator::{
    flush_thread_cache, set_freed_page_decay, stats as heap_stats, HeapStats,
};
pub use crate::answer::{vet, AnswerLimits};
pub use crate::metrics::{Metrics, PartnerMetrics, RequestLabels, RouteLabels};
pub use crate::policy::tasks::{check_task, MemoryTaskOwners, TaskOwners};
pub use crate::ratelimit::{GovernorLimiter, Limiter};
pub use crate::relay_body::is_event_stream;
pub use crate::server::h1::pieces::requests_in_pieces as leader_requests_in_pieces;
pub use crate::sse::count::EventCounter;
pub use crate::sse::event::both_reads as event_reads;
pub use crate::sse::memory::{MemoryStore, ReplayLimits};
pub use crate::sse::relay::{follow, record_upstream, StreamSettings};
pub use crate::sse::replay::{Entry, ReplayStore, StreamEnd, StreamKey, StreamMeta, StreamRecord};
pub use crate::sse::splitter::{fields, Splitter};
pub use crate::tls::pem::{load_certs, load_key};
pub use crate::trace::parse_traceparent;
pub use crate::upstream::wire::read_in_pieces as partner_response_in_pieces;

/// Where the first whole HTTP/1.1 message in `buf` ends (its head and a `content-length`
/// body), or `None` while it is incomplete: for tests that speak raw HTTP/1.1 as a client
/// or as a scripted Partner.
pub fn http1_message_end(buf: &[u8]) -> Option<usize> {
    let i = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().expect("a content-length"));
    (buf.len() >= i + 4 + len).then_some(i + 4 + len)
}
