//! The whole request path's allocation budget: `rpc` requests through a real gateway
//! (mutual TLS, HTTP/1.1 and HTTP/2, a Partner on loopback), allocations counted on the
//! gateway's own thread only: the gateway runs on a single-threaded runtime of its own,
//! the Leader and the Partner on others. The bare tokio + hyper + rustls proxy of the load
//! comparison (`benches/support/bare.rs`) is counted the same way, for reference
//! (`benches/README.md`, "Allocations per request").
//!
//! `ALLOC_SITES=1 cargo test --test request_alloc -- --nocapture` also prints where the
//! gateway's allocations come from (a backtrace each, grouped; `common/sites.rs`).
#![allow(missing_docs)]

#[path = "../benches/support/backend.rs"]
mod backend;
#[path = "../benches/support/bare.rs"]
mod bare;
#[path = "common/counting.rs"]
mod counting;
#[path = "../benches/support/loopback.rs"]
mod loopback;
#[path = "common/sites.rs"]
mod sites;

use loopback::{Leader, OwnThread, Pki};

#[global_allocator]
static GLOBAL: Sited = Sited;

/// The counting allocator, which also tells `sites` of each allocation (`ALLOC_SITES=1`).
struct Sited;

#[allow(unsafe_code)] // a global allocator needs `unsafe impl`
unsafe impl std::alloc::GlobalAlloc for Sited {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if sites::busy() {
            return unsafe { std::alloc::System.alloc(layout) };
        }
        sites::record();
        unsafe { counting::Counting.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { counting::Counting.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        if sites::busy() {
            return unsafe { std::alloc::System.realloc(ptr, layout, new) };
        }
        sites::record();
        unsafe { counting::Counting.realloc(ptr, layout, new) }
    }
}

/// The gateway's probe with `ALLOC_SITES=1`: the allocation count, and the sites of the
/// window between two calls printed.
fn count_and_sites() -> usize {
    let n = counting::allocations();
    sites::toggle("aipgw (HTTP/1.1, then HTTP/2)", REQUESTS);
    n
}

/// The budgets: what the path allocates today, with a little room. A change that adds
/// allocations per request fails here; one that removes some should lower these.
const BUDGET_HTTP1: f64 = 3.5;
const BUDGET_HTTP2: f64 = 10.5;

const REQUESTS: usize = 400;

/// Allocations per request on the server's thread over `REQUESTS` requests on one
/// keep-alive connection (after a warm-up on the same connection).
async fn per_request(server: &OwnThread, pki: &Pki, h2: bool) -> f64 {
    let mut leader = Leader::connect(pki, server.addr, h2).await;
    for _ in 0..50 {
        leader.rpc(loopback::rpc_body()).await;
    }
    let before = server.probe().await;
    for _ in 0..REQUESTS {
        leader.rpc(loopback::rpc_body()).await;
    }
    let after = server.probe().await;
    (after - before) as f64 / REQUESTS as f64
}

#[tokio::test]
async fn the_request_path_stays_within_its_allocation_budget() {
    let pki = Pki::new();
    let backend = loopback::start_backend();
    let probe = if sites::wanted() {
        count_and_sites
    } else {
        counting::allocations
    };
    let gateway = loopback::start_gateway(&pki, backend, probe);
    let bare = loopback::start_bare(&pki, backend, counting::allocations);
    let gw1 = per_request(&gateway, &pki, false).await;
    let gw2 = per_request(&gateway, &pki, true).await;
    let bare1 = per_request(&bare, &pki, false).await;
    let bare2 = per_request(&bare, &pki, true).await;
    eprintln!(
        "allocations per request: aipgw HTTP/1.1 {gw1:.1}, HTTP/2 {gw2:.1}; \
         bare proxy HTTP/1.1 {bare1:.1}, HTTP/2 {bare2:.1}"
    );
    assert!(
        gw1 <= BUDGET_HTTP1,
        "HTTP/1.1: {gw1:.1} allocations per request, budget {BUDGET_HTTP1}"
    );
    assert!(
        gw2 <= BUDGET_HTTP2,
        "HTTP/2: {gw2:.1} allocations per request, budget {BUDGET_HTTP2}"
    );
    // The harness counts: the bare proxy allocates per request too.
    assert!(bare1 > 1.0 && bare2 > 1.0, "{bare1} {bare2}");
}
