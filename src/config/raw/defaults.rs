//! The defaults that a field of a section without a `Default` of its own names (the
//! sections with required keys: `[listener]`, `[[partner]]` and its parts). Every other
//! section's defaults are its `Default`.

use std::time::Duration;

pub(super) fn d24h() -> Duration {
    Duration::from_secs(24 * 3600)
}

pub(super) fn d1s() -> Duration {
    Duration::from_secs(1)
}

pub(super) fn d5s() -> Duration {
    Duration::from_secs(5)
}

pub(super) fn default_handshakes_per_ip() -> usize {
    64
}

pub(super) fn d10s() -> Duration {
    Duration::from_secs(10)
}

pub(super) fn d60s() -> Duration {
    Duration::from_secs(60)
}

pub(super) fn d5m() -> Duration {
    Duration::from_secs(300)
}

pub(super) fn default_bytes_per_stream() -> usize {
    64 * 1024 * 1024
}

pub(super) fn default_max_connections() -> usize {
    10_000
}

pub(super) fn default_suffix() -> String {
    "acps.pub".to_owned()
}

pub(super) fn default_verdict_cache() -> usize {
    10_000
}

pub(super) fn default_error_body() -> usize {
    64 * 1024
}

pub(super) fn default_max_keys() -> usize {
    100_000
}

pub(super) fn d20s() -> Duration {
    Duration::from_secs(20)
}

pub(super) fn default_connections_per_ip() -> usize {
    256
}

pub(super) fn d30s() -> Duration {
    Duration::from_secs(30)
}

pub(super) fn d90s() -> Duration {
    Duration::from_secs(90)
}

pub(super) fn default_max_event() -> usize {
    16 * 1024 * 1024
}

pub(super) fn default_max_streams() -> usize {
    10_000
}

pub(super) fn default_max_head_bytes() -> usize {
    64 * 1024
}

pub(super) fn default_max_headers() -> usize {
    100
}

pub(super) fn default_h2_streams() -> u32 {
    200
}

pub(super) fn default_tls_session_cache() -> usize {
    256
}

pub(super) fn default_pool_idle() -> usize {
    64
}

/// `upstream.max_connections`: with the default `listener.max_connections` (10,000) and
/// the reserve, 14,160 open files, whatever the number of Partners.
pub(super) fn default_upstream_connections() -> usize {
    4096
}

pub(super) fn d500ms() -> Duration {
    Duration::from_millis(500)
}
