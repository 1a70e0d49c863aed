//! A global allocator for test binaries of their own: it counts, per thread, the
//! allocations made and the heap bytes live, and hands the work to the system allocator.
//! Per thread, so the harness's own threads do not disturb what a test measures.
#![allow(unsafe_code)] // a counting global allocator needs `unsafe impl`
#![allow(dead_code)] // each test binary reads the count it needs

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub(crate) struct Counting;

thread_local! {
    // `const` thread-locals need no allocation of their own.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

/// Allocations made on this thread so far (a `realloc` counts as one).
pub(crate) fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

/// Heap bytes allocated and not yet freed on this thread.
pub(crate) fn live() -> isize {
    LIVE.with(Cell::get)
}

fn count(n: usize, bytes: isize) {
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + n));
    let _ = LIVE.try_with(|c| c.set(c.get() + bytes));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(1, layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(0, -(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        count(1, new as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new) }
    }
}
