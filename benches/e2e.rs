//! One AIP `rpc` end to end on loopback: a Leader connection with mutual TLS, the gateway
//! (envelope, identity, policy, quotas, metrics, access log), the static Partner; beside
//! the same request through the bare tokio + hyper + rustls proxy, in one group, so the
//! ratio comes from one run. Each server runs on a single-threaded runtime of its own
//! thread; the Leader on the bench's. `benches/README.md` has the figures.
#![allow(missing_docs)]

#[path = "support/backend.rs"]
mod backend;
#[path = "support/bare.rs"]
mod bare;
#[path = "support/loopback.rs"]
mod loopback;

use criterion::{criterion_group, criterion_main, Criterion};
use loopback::{Leader, Pki};

fn none() -> usize {
    0
}

fn e2e(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pki = Pki::new();
    let backend = loopback::start_backend();
    let gateway = loopback::start_gateway(&pki, backend, none);
    let bare = loopback::start_bare(&pki, backend, none);
    let body = loopback::rpc_body();
    let mut g = c.benchmark_group("e2e_rpc");
    for (h2, proto) in [(false, "http1"), (true, "http2")] {
        for (name, addr) in [("aipgw", gateway.addr), ("bare", bare.addr)] {
            let mut leader = rt.block_on(Leader::connect(&pki, addr, h2));
            g.bench_function(format!("{name}/{proto}"), |b| {
                b.iter(|| rt.block_on(leader.rpc(body.clone())));
            });
        }
    }
    g.finish();
}

criterion_group!(benches, e2e);
criterion_main!(benches);
