//! The reload ratio of issue 38 (10,000 Partners against 1,000) on a shared machine:
//! both fleets reloaded in turns, 40 rounds, each reload timed in the thread's CPU time,
//! and the least of each (the run least disturbed by other work on the machine) and the
//! median printed.
//! Criterion's means (`benches/reload.rs`) move by 10-20% when other builds share the
//! cores; this figure moved by 1-2% between runs at a load average of 8.
//!
//!     cargo bench --bench reload_ratio
#![allow(missing_docs)]
#[path = "support/fleet.rs"]
mod support;
use std::time::Duration;
use support::{certs, fleet, thread_cpu as cpu};
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
fn main() {
    let dir = tempfile::tempdir().unwrap();
    certs(dir.path());
    let mut gw = vec![];
    for n in [1000, 10000] {
        let path = fleet(dir.path(), n);
        let g = aipgw::Gateway::new(aipgw::config::Config::load(&path).unwrap()).unwrap();
        gw.push((n, path, g));
    }
    // As many reloads of each size (the least of more samples would be lower by itself),
    // in turns, so that whatever else runs on the machine falls on both alike.
    // `COLD=1`: before each reload, 64 MiB written through (not timed), so that neither
    // size finds the other's (or its own last) data in the caches: a reload as it comes in
    // production, a minute of traffic after the one before. Without it, each size is timed
    // right after the other.
    let cold = std::env::var_os("COLD").is_some();
    let mut flush = vec![0u8; 64 << 20];
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for round in 0..40u8 {
        for (k, (_, path, g)) in gw.iter().enumerate() {
            if cold {
                flush.iter_mut().for_each(|b| *b = b.wrapping_add(round));
                std::hint::black_box(&flush);
            }
            let t = cpu();
            aipgw::reload::reload_now(g, path).unwrap();
            times[k].push(cpu() - t);
        }
    }
    let [small, large] = times.map(|mut t| {
        t.sort();
        (t[0], t[t.len() / 2])
    });
    println!(
        "least: 1,000 Partners {:?}, 10,000 {:?}: {:.2}x; median: {:?}, {:?}: {:.2}x",
        small.0,
        large.0,
        large.0.as_secs_f64() / small.0.as_secs_f64(),
        small.1,
        large.1,
        large.1.as_secs_f64() / small.1.as_secs_f64()
    );
}
