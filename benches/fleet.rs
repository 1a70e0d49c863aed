//! Large fleets (issue 38): route lookup to the last of N Partners (1, 1,000, 10,000) and
//! the access decision with N allow + N deny patterns in the Partner's `[partner.access]`
//! (N = 10, 1,000, 100,000), the caller matching the last allow pattern and no deny one
//! (the allowed path, and the last entry for a scan in list order). Figures side by side
//! with the build before in benches/README.md ("Large fleets").
#![allow(missing_docs)]

use std::hint::black_box;

use aipgw::config::Config;
use aipgw::identity::Aic;
use aipgw::jsonrpc::Method;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

const HEAD: &str = r#"
[listener]
bind = "127.0.0.1:1"
cert = "DIR/gateway.pem"
key = "DIR/gateway.key"
client_ca = ["DIR/ca.pem"]
[admin]
bind = ""
"#;

/// A config of `n` Partners at `/aip/p<i>`.
fn partners(dir: &std::path::Path, n: usize) -> Config {
    let mut text = HEAD.replace("DIR", &dir.display().to_string());
    for i in 0..n {
        text += &format!(
            "[[partner]]\nname = \"p{i}\"\nprefix = \"/aip/p{i}\"\nupstreams = [\"http://127.0.0.1:9\"]\n"
        );
    }
    Config::parse(&text, dir).unwrap()
}

/// One Partner with `n` allow and `n` deny agent-serial prefixes (22 characters) of
/// identity providers `0001` and `0002`; the caller's AIC matches the last allow entry.
fn access(n: usize) -> (Config, Aic) {
    let list = |provider: &str| -> String {
        (0..n)
            .map(|i| format!("\"1{provider}000011K9{i:09}*\""))
            .collect::<Vec<_>>()
            .join(",")
    };
    let text = format!(
        "{}[[partner]]\nname = \"p\"\nprefix = \"/p\"\nupstreams = [\"http://127.0.0.1:9\"]\n\
         [partner.access]\nallow = [{}]\ndeny = [{}]\n",
        HEAD.replace("DIR", "/"),
        list("0001"),
        list("0002"),
    );
    let cfg = Config::parse(&text, std::path::Path::new("/")).unwrap();
    let aic = Aic::with_check_code(&format!("10001000011K9{:09}ABCDEFGH", n - 1)).unwrap();
    (cfg, aic)
}

fn route(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    aipgw::devcerts::write_dev_certs(dir.path()).unwrap();
    let mut g = c.benchmark_group("route_to_the_last_of");
    for n in [1usize, 1_000, 10_000] {
        let gateway = aipgw::Gateway::new(partners(dir.path(), n)).unwrap();
        let snap = gateway.snapshot();
        let path = format!("/aip/p{}/rpc", n - 1);
        assert!(snap.router.route(None, &path).is_some());
        g.bench_with_input(BenchmarkId::from_parameter(n), &path, |b, path| {
            b.iter(|| {
                snap.router
                    .route(black_box(None), black_box(path))
                    .is_some()
            })
        });
    }
    g.finish();
}

fn decide(c: &mut Criterion) {
    let mut g = c.benchmark_group("access_allow_and_deny_of");
    for n in [10usize, 1_000, 100_000] {
        let (cfg, aic) = access(n);
        let rules = &cfg.partners[0].access;
        rules.check(&aic, Method::Rpc, "p").unwrap();
        g.bench_with_input(BenchmarkId::from_parameter(n), &aic, |b, aic| {
            b.iter(|| rules.check(black_box(aic), Method::Rpc, "p").is_ok())
        });
    }
    g.finish();
}

criterion_group!(benches, route, decide);
criterion_main!(benches);
