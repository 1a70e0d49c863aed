//! The allocator's own figures for `/metrics`: what the heap holds live beside what the
//! allocator keeps resident, so an operator can tell live state from memory not yet given
//! back (issue 13). Read from jemalloc when it is the process's allocator (the `aipgw`
//! binary's default); `None` otherwise (glibc or mimalloc builds, and programs that embed
//! the library with an allocator of their own, where jemalloc has allocated nothing).

/// jemalloc's totals, in bytes (see jemalloc's `stats.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes the program holds.
    pub allocated: u64,
    /// Bytes in the pages of those allocations.
    pub active: u64,
    /// Bytes resident in memory: active pages, metadata, and freed pages not yet returned.
    pub resident: u64,
    /// The allocator's own bookkeeping.
    pub metadata: u64,
    /// Address space kept for reuse without being resident.
    pub retained: u64,
    /// Freed memory the threads' caches hold for their next allocations (it keeps the
    /// pages under it in use until [`flush_thread_cache`] or the thread allocates more).
    pub thread_caches: u64,
}

impl HeapStats {
    /// The figures under their metric label.
    pub(crate) fn labelled(&self) -> [(&'static str, u64); 6] {
        [
            ("allocated", self.allocated),
            ("active", self.active),
            ("resident", self.resident),
            ("metadata", self.metadata),
            ("retained", self.retained),
            ("thread_caches", self.thread_caches),
        ]
    }
}

/// The figures as of now (jemalloc caches them until its epoch advances, done here).
#[cfg(feature = "jemalloc")]
#[expect(
    unsafe_code,
    reason = "one `mallctl` read the typed API has no name for"
)]
pub fn stats() -> Option<HeapStats> {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().ok()?;
    let s = HeapStats {
        allocated: stats::allocated::read().ok()? as u64,
        active: stats::active::read().ok()? as u64,
        resident: stats::resident::read().ok()? as u64,
        metadata: stats::metadata::read().ok()? as u64,
        retained: stats::retained::read().ok()? as u64,
        // All arenas merged (`MALLCTL_ARENAS_ALL`); the typed API has no name for it.
        // SAFETY: a NUL-terminated name whose value is a `size_t`.
        thread_caches: unsafe {
            tikv_jemalloc_ctl::raw::read::<usize>(b"stats.arenas.4096.tcache_bytes\0")
        }
        .ok()? as u64,
    };
    // Nothing allocated: jemalloc is linked but another allocator serves the program.
    (s.allocated > 0).then_some(s)
}

/// Not a jemalloc build: no figures.
#[cfg(not(feature = "jemalloc"))]
pub fn stats() -> Option<HeapStats> {
    None
}

/// Hands what this thread's allocation cache holds back to the allocator's shared bins.
///
/// jemalloc keeps freed small objects in a per-thread cache and trims it only as that
/// thread allocates again, so a thread that goes quiet after a burst (a worker once its
/// streams ended, the upkeep after a sweep) keeps its cache, and every cached object keeps
/// its whole slab in use: measured after 10,000 streams, 1.3 MiB cached held 3 MiB of pages
/// (issue 13). Called by each worker every `runtime.cache_flush_interval` and by the upkeep
/// after its sweeps. Cheap (the cache is emptied in batches); nothing in a build without
/// jemalloc, or where jemalloc is linked but not the allocator. Whether jemalloc did it.
#[cfg(feature = "jemalloc")]
#[expect(
    unsafe_code,
    reason = "`mallctl` with no value, which the ctl crate cannot make"
)]
pub fn flush_thread_cache() -> bool {
    // SAFETY: a NUL-terminated name; `thread.tcache.flush` reads and writes nothing, and
    // refuses any value pointer, so all four are null.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"thread.tcache.flush".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    rc == 0
}

/// Sets how long freed pages stay with the allocator (for reuse) before they go back to
/// the system: jemalloc's `dirty_decay_ms`, for every arena there is and every arena made
/// later. jemalloc's own default, 10 s, kept the pages a burst of connections let go at
/// their idle release resident for that long, and longer while the gateway was quiet
/// (decay runs as the allocator is used): after 1,000 connections opened and released,
/// 20.8 KiB of RSS per held connection for 7.8 KiB of live heap, 11.2 KiB with 1 s
/// (`benches/README.md`). Whether jemalloc took it (nothing in a build without it).
#[cfg(feature = "jemalloc")]
#[expect(
    unsafe_code,
    reason = "jemalloc's decay settings are written by name; the ctl crate has no typed API for them"
)]
pub fn set_freed_page_decay(after: std::time::Duration) -> bool {
    use tikv_jemalloc_ctl::raw;
    let ms = isize::try_from(after.as_millis()).unwrap_or(isize::MAX);
    // SAFETY: NUL-terminated names of `ssize_t` settings, written with an `isize`.
    let later = unsafe { raw::write(b"arenas.dirty_decay_ms\0", ms) }.is_ok();
    let arenas = tikv_jemalloc_ctl::arenas::narenas::read().unwrap_or(0);
    let mut now = true;
    for i in 0..arenas {
        let name = format!("arena.{i}.dirty_decay_ms\0");
        // SAFETY: as above. An arena index not yet made answers an error, left alone:
        // made later, it takes the default just set.
        if unsafe { raw::write(name.as_bytes(), ms) }.is_err() && i == 0 {
            now = false;
        }
    }
    later && now
}

/// Not a jemalloc build: nothing to set.
#[cfg(not(feature = "jemalloc"))]
pub fn set_freed_page_decay(_after: std::time::Duration) -> bool {
    false
}

/// Not a jemalloc build: nothing to flush.
#[cfg(not(feature = "jemalloc"))]
pub fn flush_thread_cache() -> bool {
    false
}
