//! Issue 38, item 8: a full quota store evicts a caller whose window has passed before it
//! refuses a new one, over real sockets with distinct caller certificates.

use std::time::Duration;

use aipgw::identity::Aic;

use crate::support::*;

/// A third caller, of another entity than `LEADER_A` and `LEADER_B`.
fn leader_c() -> String {
    Aic::with_check_code("10001000021K9CCCCCCCCCCCCCCCCC")
        .unwrap()
        .to_string()
}

/// `aipgw_ratelimit_evictions_total` on the admin listener (0 while it is not there).
async fn evictions(gw: &TestGateway) -> f64 {
    let page = gw.admin_get("/metrics").await.1;
    parse_metrics(&page)
        .get("aipgw_ratelimit_evictions_total")
        .copied()
        .unwrap_or(0.0)
}

/// `max_keys = 2`, one request per 4 s each (burst 1), and no sweep during the test: with
/// A and B live a new caller C is refused (`rate_limit_capacity`, with the time until
/// the first window passes); once A's and B's windows have passed, C is admitted by
/// evicting one of them (counted), without waiting for a sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_caller_evicts_an_expired_one_and_is_refused_while_all_are_live() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let text = pki.config(
        "",
        &format!(
            "[ratelimit]\nrate = 0.25\nburst = 1\nmax_keys = 2\nsweep_interval = \"1h\"\n{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    );
    let gw = start_gateway(&text).await;
    let c_aic = leader_c();
    let (a, b, c) = (
        pki.leader(LEADER_A, false),
        pki.leader(LEADER_B, false),
        pki.leader(&c_aic, false),
    );
    for (leader, aic, task) in [(&a, LEADER_A, "ta"), (&b, LEADER_B, "tb")] {
        let r = leader
            .post(gw.addr, "/p/rpc", &rpc_start("1", aic, task))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Both keys are live (their windows end 4 s after their requests): C is refused.
    let r = c
        .post(gw.addr, "/p/rpc", &rpc_start("1", &c_aic, "tc"))
        .await
        .unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.error(), (-32029, "rate_limit_capacity".into()));
    let wait: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=4).contains(&wait), "retry-after {wait}");
    assert_eq!(evictions(&gw).await, 0.0);

    // Once A's and B's windows have passed, C gets in (polled: the signal is C's answer).
    let admitted = within(20, async {
        loop {
            let r = c
                .post(gw.addr, "/p/rpc", &rpc_start("2", &c_aic, "tc"))
                .await
                .unwrap();
            if r.status == 200 {
                return r;
            }
            assert_eq!(r.error(), (-32029, "rate_limit_capacity".into()));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(admitted.status, 200);
    assert_eq!(evictions(&gw).await, 1.0, "one expired caller made room");
    // C's own quota applies from its first request on: the next one is over its rate.
    let r = c
        .post(gw.addr, "/p/rpc", &rpc_start("3", &c_aic, "tc"))
        .await
        .unwrap();
    assert_eq!(r.error(), (-32029, "aic_rate".into()));
}
