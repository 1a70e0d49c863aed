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
}

impl HeapStats {
    /// The figures under their metric label.
    pub(crate) fn labelled(&self) -> [(&'static str, u64); 5] {
        [
            ("allocated", self.allocated),
            ("active", self.active),
            ("resident", self.resident),
            ("metadata", self.metadata),
            ("retained", self.retained),
        ]
    }
}

/// The figures as of now (jemalloc caches them until its epoch advances, done here).
#[cfg(feature = "jemalloc")]
pub fn stats() -> Option<HeapStats> {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().ok()?;
    let s = HeapStats {
        allocated: stats::allocated::read().ok()? as u64,
        active: stats::active::read().ok()? as u64,
        resident: stats::resident::read().ok()? as u64,
        metadata: stats::metadata::read().ok()? as u64,
        retained: stats::retained::read().ok()? as u64,
    };
    // Nothing allocated: jemalloc is linked but another allocator serves the program.
    (s.allocated > 0).then_some(s)
}

/// Not a jemalloc build: no figures.
#[cfg(not(feature = "jemalloc"))]
pub fn stats() -> Option<HeapStats> {
    None
}
