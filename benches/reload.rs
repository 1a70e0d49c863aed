//! Reload of a fleet (issue 38): what a SIGHUP does (`aipgw::reload::reload_now`: the
//! config read and validated, the open-file check, a new snapshot built beside the old
//! one, what carries over found by key, the old one let go) for 1,000 and 10,000
//! Partners on one origin. The two figures' ratio is what matters: linear is 10x.
#![allow(missing_docs)]

// The gateway binary's allocator: a reload's cost is mostly allocation, and glibc's
// malloc spends its time consolidating a heap this size.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::time::Duration;

#[path = "support/fleet.rs"]
mod support;
use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use support::{certs, fleet, thread_cpu};

/// The bench thread's CPU time (a reload runs on the calling thread, the old snapshot's
/// frees included). On a shared machine, wall time counts other processes' turns on the
/// core and moves the 1,000-Partner figure by tens of percent between runs; CPU time
/// does not, so the ratio compares the work done.
struct ThreadCpu;

impl Measurement for ThreadCpu {
    type Intermediate = Duration;
    type Value = Duration;
    fn start(&self) -> Duration {
        thread_cpu()
    }
    fn end(&self, started: Duration) -> Duration {
        thread_cpu().saturating_sub(started)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, d: &Duration) -> f64 {
        d.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &Millis
    }
}

/// Figures in milliseconds of CPU time.
struct Millis;

impl ValueFormatter for Millis {
    fn scale_values(&self, _typical: f64, values: &mut [f64]) -> &'static str {
        values.iter_mut().for_each(|v| *v /= 1e6);
        "ms (cpu)"
    }
    fn scale_throughputs(
        &self,
        _typical: f64,
        _t: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        values.iter_mut().for_each(|v| *v /= 1e6);
        "ms (cpu)"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn reload(c: &mut Criterion<ThreadCpu>) {
    let dir = tempfile::tempdir().unwrap();
    certs(dir.path());
    let mut group = c.benchmark_group("reload");
    // Ten samples over 15 s of CPU time: enough iterations that the 1,000-Partner figure
    // (a few milliseconds) does not move the ratio by itself.
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(15));
    for n in [1_000, 10_000] {
        let path = fleet(dir.path(), n);
        let config = aipgw::config::Config::load(&path).unwrap();
        let gateway = aipgw::Gateway::new(config).unwrap();
        group.bench_with_input(BenchmarkId::from_parameter(n), &path, |b, path| {
            b.iter(|| aipgw::reload::reload_now(&gateway, path).unwrap())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = reload
}
criterion_main!(benches);
