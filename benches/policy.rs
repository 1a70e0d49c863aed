//! Per-request policy and limiter checks with 100,000 known AICs (issue 4's target:
//! at most 300 ns together, no allocation on the allowed path; tests/alloc.rs checks
//! the allocation count).
#![allow(missing_docs)]

use std::hint::black_box;

use aipgw::config::Config;
use aipgw::identity::Aic;
use aipgw::jsonrpc::{Command, Method};
use aipgw::test_util::{check_task, MemoryTaskOwners, TaskOwners};
use aipgw::test_util::{GovernorLimiter, Limiter};
use criterion::{criterion_group, criterion_main, Criterion};

/// Every check and quota on at once (shared with tests/alloc.rs).
const CONFIG: &str = include_str!("../tests/data/policy.toml");

/// The per-request snapshot load and verdict read (shared with tests/alloc.rs).
#[path = "../tests/common/per_request.rs"]
mod per_request;
use per_request::PerRequest;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let cfg = Config::parse(CONFIG, std::path::Path::new("/")).unwrap();
    let limiter = GovernorLimiter::new(&cfg.ratelimit.limiter).unwrap();
    let tasks: std::sync::Arc<dyn TaskOwners> = std::sync::Arc::new(MemoryTaskOwners::new(
        200_000,
        std::time::Duration::from_secs(3600),
    ));
    let aics: Vec<Aic> = (0..100_000u32)
        .map(|i| Aic::with_check_code(&format!("1000100001{i:020}")).unwrap())
        .collect();
    for (i, a) in aics.iter().enumerate() {
        limiter.check(a, Some("p")).unwrap();
        tasks.claim("p", &format!("task-{i}"), a, None).unwrap();
    }
    let partner = &cfg.partners[0];
    let per_request = PerRequest::new(&cfg);
    let mut g = c.benchmark_group("policy");
    let mut i = 0usize;
    g.bench_function("snapshot_load_and_verdict", |b| {
        b.iter(|| assert!(per_request.run()))
    });
    g.bench_function("access_and_limits_100k_aics", |b| {
        b.iter(|| {
            // Sequential through the AICs: the limiter's lookups still land anywhere in
            // its 100,000-key map, but the benchmark adds no cache miss of its own.
            i = (i + 1) % aics.len();
            assert!(per_request.run());
            let aic = &aics[i];
            cfg.policy.check_blocked(aic).unwrap();
            cfg.policy.check_role(black_box(Some("leader"))).unwrap();
            partner.access.check(aic, Method::Rpc, "p").unwrap();
            limiter.check(aic, Some("p")).unwrap();
        })
    });
    // The usual set-up: a per-AIC quota and a Partner total, no per-(AIC, Partner) quota.
    let typical_cfg = Config::parse(
        &CONFIG.replace("per_aic_rate = 1000000000\nper_aic_burst = 1000000\n", ""),
        std::path::Path::new("/"),
    )
    .unwrap();
    assert!(typical_cfg.partners[0].rates.per_aic.is_none());
    let typical = GovernorLimiter::new(&typical_cfg.ratelimit.limiter).unwrap();
    for a in &aics {
        typical.check(a, Some("p")).unwrap();
    }
    g.bench_function("access_and_limits_100k_aics_typical", |b| {
        b.iter(|| {
            i = (i + 1) % aics.len();
            assert!(per_request.run());
            let aic = &aics[i];
            typical_cfg.policy.check_blocked(aic).unwrap();
            typical_cfg
                .policy
                .check_role(black_box(Some("leader")))
                .unwrap();
            typical_cfg.partners[0]
                .access
                .check(aic, Method::Rpc, "p")
                .unwrap();
            typical.check(aic, Some("p")).unwrap();
        })
    });
    let names: Vec<String> = (0..aics.len()).map(|i| format!("task-{i}")).collect();
    g.bench_function("task_owner_check_100k_tasks", |b| {
        b.iter(|| {
            i = (i + 1) % aics.len();
            check_task(
                &tasks,
                cfg.tasks.unknown,
                "p",
                &aics[i],
                Method::Rpc,
                Some(Command::Get),
                Some(&names[i]),
                None,
            )
            .unwrap();
        })
    });
    g.finish();
}

/// The per-response check issue 14 added (a Partner answer is judged before it is relayed),
/// side by side with the content-type check every response already had.
fn response(c: &mut Criterion) {
    use bytes::Bytes;
    use futures_util::FutureExt;
    use http_body_util::Full;
    let mut g = c.benchmark_group("response");
    let answer = || {
        let mut r = http::Response::new(Full::new(Bytes::from_static(b"{}")));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    };
    let limits = aipgw::test_util::AnswerLimits {
        max_bytes: 65536,
        idle: std::time::Duration::from_secs(30),
    };
    let r = answer();
    g.bench_function("is_event_stream", |b| {
        b.iter(|| aipgw::test_util::is_event_stream(black_box(r.headers())))
    });
    g.bench_function("build_answer_only", |b| b.iter(|| black_box(answer())));
    g.bench_function("build_answer_and_vet_2xx_json", |b| {
        b.iter(|| {
            // The fast path never awaits.
            aipgw::test_util::vet(answer(), limits, "p")
                .now_or_never()
                .unwrap()
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench, response);
criterion_main!(benches);
