//! One timer for the state that would otherwise shrink only when traffic touches it:
//! idle per-AIC limiter entries (every `ratelimit.sweep_interval`), and finished replay
//! records past `replay.retention`, expired task owners and idle Partner connections (per
//! origin) past `upstream.pool_idle_timeout` or closed by the Partner (every
//! `replay.sweep_interval`).
//! Without it, a gateway that goes quiet keeps whatever the last burst left behind. After
//! each sweep it hands its thread's allocation cache back (what it freed would stay
//! cached there otherwise); the per-core workers do the same on their own timer.

use std::sync::Arc;

use tokio::time::Instant;

use crate::gateway::Gateway;

/// Runs until dropped (`background::Background` stops it at shutdown). Intervals are read from the
/// snapshot current at each wake, so a reload applies from the next one.
pub(crate) async fn run(gateway: Arc<Gateway>) {
    let start = Instant::now();
    let (mut limits_at, mut replay_at) = (start, start);
    loop {
        let snap = gateway.snapshot();
        let next_limits = limits_at + snap.config.ratelimit.sweep_interval;
        let next_replay = replay_at + snap.config.replay_sweep_interval;
        drop(snap);
        tokio::time::sleep_until(next_limits.min(next_replay)).await;
        let now = Instant::now();
        let snap = gateway.snapshot();
        if now >= next_limits {
            snap.limiter.sweep();
            limits_at = now;
        }
        if now >= next_replay {
            snap.replay.sweep();
            snap.tasks.sweep();
            for origin in snap.origins.all() {
                origin.sweep();
            }
            replay_at = now;
        }
        drop(snap);
        // What a sweep freed sits in this thread's allocation cache until handed back.
        crate::allocator::flush_thread_cache();
    }
}
