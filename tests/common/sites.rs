//! Where a thread's allocations come from: with `ALLOC_SITES=1`, `tests/request_alloc.rs`
//! captures a backtrace for each allocation the gateway's thread makes in the measured
//! window and prints the sites, most frequent first. Off (the default), the allocator
//! pays one thread-local read per allocation.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    // Set while a capture runs: its own allocations are not sites.
    static BUSY: Cell<bool> = const { Cell::new(false) };
    static WINDOW: Cell<usize> = const { Cell::new(0) };
    static SITES: RefCell<Option<HashMap<String, usize>>> = const { RefCell::new(None) };
}

/// Whether `ALLOC_SITES` asks for the sites.
pub(crate) fn wanted() -> bool {
    std::env::var_os("ALLOC_SITES").is_some_and(|v| v != "0")
}

/// Whether a capture is running on this thread (its own allocations are not counted).
#[inline]
pub(crate) fn busy() -> bool {
    BUSY.try_with(Cell::get).unwrap_or(false)
}

/// Called by the allocator on every allocation.
#[inline]
pub(crate) fn record() {
    if !ON.try_with(Cell::get).unwrap_or(false) || BUSY.with(Cell::get) {
        return;
    }
    BUSY.with(|b| b.set(true));
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    let key = trim(&trace);
    SITES.with(|s| {
        *s.borrow_mut()
            .get_or_insert_with(HashMap::new)
            .entry(key)
            .or_default() += 1
    });
    BUSY.with(|b| b.set(false));
}

/// The frames that say where, one a line: the allocator's, std's and `bytes`'s own
/// dropped from the top, the next few kept, long generic names cut.
fn trim(trace: &str) -> String {
    let mut frames: Vec<(&str, &str)> = Vec::new();
    for line in trace.lines().map(str::trim) {
        match line.strip_prefix("at ") {
            Some(at) => {
                if let Some(last) = frames.last_mut() {
                    last.1 = at;
                }
            }
            None => frames.push((line.split_once(": ").map_or(line, |(_, n)| n), "")),
        }
    }
    let ours = |(name, at): &(&str, &str)| {
        let skip = [
            "std::backtrace",
            "request_alloc::",
            "<request_alloc::",
            "__rust",
            "alloc::",
            "<alloc::",
            "core::",
            "<core::",
            "std::",
            "<std::",
            "bytes::",
            "<bytes::",
            "<T as alloc",
        ];
        !(skip.iter().any(|s| name.starts_with(s))
            || at.contains("/rustc/")
            || at.contains("/library/"))
    };
    let mut out = String::new();
    for (name, at) in frames.iter().skip_while(|f| !ours(f)).take(8) {
        let name: String = name.chars().take(110).collect();
        let at = at.split("/src/").last().unwrap_or(at);
        out.push_str(&format!("    {name}  @ {at}\n"));
    }
    out
}

/// A probe for the measured thread: the first call turns capture on, the second turns it
/// off and prints what it saw per `requests`.
pub(crate) fn toggle(label: &str, requests: usize) {
    let on = ON.with(|o| {
        o.set(!o.get());
        o.get()
    });
    if on {
        return;
    }
    BUSY.with(|b| b.set(true));
    let sites = SITES.with(|s| s.borrow_mut().take()).unwrap_or_default();
    let mut sites: Vec<_> = sites.into_iter().collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.1));
    let total: usize = sites.iter().map(|s| s.1).sum();
    let window = WINDOW.with(|w| {
        w.set(w.get() + 1);
        w.get()
    });
    eprintln!(
        "=== {label}, window {window}: {:.2} allocations per request",
        total as f64 / requests as f64
    );
    for (stack, n) in sites {
        eprintln!(
            "--- {:.2} per request ({n})\n{stack}",
            n as f64 / requests as f64
        );
    }
    BUSY.with(|b| b.set(false));
}
