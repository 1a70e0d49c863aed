//! The allowed path of the policy and limiter checks allocates nothing (issue 4's goal),
//! nor does the per-request snapshot load and verdict read (issue 8), counted by a global
//! allocator in this test binary of its own.
#![allow(missing_docs)]

use aipgw::config::Config;
use aipgw::identity::Aic;
use aipgw::jsonrpc::{Command, Method};
use aipgw::test_util::{check_task, MemoryTaskOwners, TaskOwners};
use aipgw::test_util::{GovernorLimiter, Limiter};

// Per thread: other threads (the test harness, the rate-limit clock's upkeep thread) may
// allocate at any time; what matters is the thread running the checks.
#[path = "common/counting.rs"]
mod counting;
use counting::allocations;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[path = "common/per_request.rs"]
mod per_request;
use per_request::PerRequest;

#[test]
fn allowed_path_does_not_allocate() {
    let text = include_str!("data/policy.toml"); // every check and quota on
    let cfg = Config::parse(text, std::path::Path::new("/")).unwrap();
    let limiter = GovernorLimiter::new(&cfg.ratelimit.limiter).unwrap();
    let tasks: std::sync::Arc<dyn TaskOwners> = std::sync::Arc::new(MemoryTaskOwners::new(
        1000,
        std::time::Duration::from_secs(60),
    ));
    let aic = Aic::parse("10001000011K912345E789ABCDEF2353").unwrap();
    let partner = &cfg.partners[0];
    let per_request = PerRequest::new(&cfg);
    let check = || {
        assert!(per_request.run());
        cfg.policy.check_blocked(&aic).unwrap();
        cfg.policy.check_role(Some("leader")).unwrap();
        partner.access.check(&aic, Method::Rpc, "p").unwrap();
        limiter.check(&aic, Some("p")).unwrap();
        check_task(
            &tasks,
            cfg.tasks.unknown,
            "p",
            &aic,
            Method::Rpc,
            Some(Command::Get),
            Some("task-1"),
            None,
        )
        .unwrap();
    };
    // The first request of an AIC and of a task stores them (allocating once).
    tasks.claim("p", "task-1", &aic, None).unwrap();
    check();
    let before = allocations();
    for _ in 0..10_000 {
        check();
    }
    let after = allocations();
    assert_eq!(after - before, 0, "the allowed path allocated");
    // The counter does see this thread's allocations.
    let v = std::hint::black_box(vec![1u8; 64]);
    assert_eq!(allocations(), after + 1);
    drop(v);
}
