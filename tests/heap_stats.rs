//! `aipgw_allocator_bytes` reads jemalloc's own figures when jemalloc is the allocator
//! (issue 13): live bytes follow what the program holds, and what it frees is no longer
//! counted as allocated.
#![allow(missing_docs)]

use aipgw::test_util::heap_stats;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const MIB: u64 = 1 << 20;

/// jemalloc's figures are the process's: the tests take turns, so one's allocations are not
/// read as the other's (the first test once failed while the second ran beside it).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn allocated_follows_what_is_held_and_freed() {
    let _alone = alone();
    // 16 MiB held, at least 15 MiB seen: what the test harness's other threads free
    // meanwhile (a finished test's thread, some 64 KiB) is the process's too.
    let before = heap_stats().expect("jemalloc's statistics are compiled in and readable");
    let held: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 256 * 1024]).collect();
    let during = heap_stats().expect("statistics");
    assert!(
        during.allocated >= before.allocated + 15 * MIB,
        "16 MiB held: {before:?} -> {during:?}"
    );
    assert!(during.resident >= during.active && during.active >= during.allocated);
    assert!(during.metadata > 0);
    drop(held);
    let after = heap_stats().expect("statistics");
    assert!(
        after.allocated + 15 * MIB <= during.allocated,
        "freed: {during:?} -> {after:?}"
    );
}

/// Issue 13: what a thread freed stays in its allocation cache (keeping its pages in use)
/// until the thread allocates again or flushes it; `flush_thread_cache` hands it back, and
/// `thread_caches` shows both.
#[test]
fn a_flushed_thread_cache_gives_back_what_it_held() {
    let _alone = alone();
    use aipgw::test_util::flush_thread_cache;
    std::thread::spawn(|| {
        // Many small objects of several sizes, freed: the thread's cache keeps some of each.
        let held: Vec<Vec<u8>> = (0..20_000).map(|i| vec![1u8; 16 + (i % 64) * 32]).collect();
        drop(held);
        let cached = heap_stats().expect("statistics").thread_caches;
        assert!(flush_thread_cache(), "jemalloc flushed the cache");
        let flushed = heap_stats().expect("statistics").thread_caches;
        assert!(
            flushed + 64 * 1024 <= cached,
            "cached {cached} B, after the flush {flushed} B"
        );
    })
    .join()
    .unwrap();
}

/// Issue 33: `runtime.freed_page_decay` decides how long freed pages stay resident. Set to
/// 0, what is freed goes back at once; at jemalloc's own 10 s, it stays (the pages a burst
/// of connections let go at their idle release were most of a held connection's RSS).
#[test]
fn freed_pages_go_back_as_the_decay_says() {
    let _alone = alone();
    use aipgw::test_util::set_freed_page_decay;
    use std::time::Duration;
    let freed = |decay: Duration| {
        assert!(set_freed_page_decay(decay), "jemalloc took the decay");
        // Large allocations (their own extents), touched, then freed.
        let held: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 256 * 1024]).collect();
        let during = heap_stats().expect("statistics").resident;
        drop(held);
        let after = heap_stats().expect("statistics").resident;
        during.saturating_sub(after)
    };
    let kept = freed(Duration::from_secs(10));
    let given_back = freed(Duration::ZERO);
    set_freed_page_decay(Duration::from_secs(10));
    assert!(kept < 4 * MIB, "at 10 s, {kept} B went back at once");
    assert!(
        given_back >= 12 * MIB,
        "at 0 s, only {given_back} B went back"
    );
}
