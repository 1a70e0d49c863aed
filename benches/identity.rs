//! AIC extraction from certificates (once per connection), the AIC check code, and the
//! whole per-connection verdict including WebPKI chain verification, for scale.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;

use aipgw::devcerts::{CertSpec, DevCa};
use aipgw::identity::{self, cert::aic_from_certificate, Aic};
use criterion::{criterion_group, criterion_main, Criterion};
use rustls::pki_types::UnixTime;

const AIC: &str = "10001000011K912345E789ABCDEF2353";

fn bench(c: &mut Criterion) {
    let ca = DevCa::new("bench CA").unwrap();
    let v1 = ca.issue(&CertSpec::leader_v1(AIC, "acps.pub")).unwrap();
    let v2 = ca.issue(&CertSpec::leader_v2(AIC)).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    )
    .build()
    .unwrap();

    let mut g = c.benchmark_group("identity");
    g.bench_function("aic_parse", |b| {
        b.iter(|| Aic::parse(black_box(AIC)).unwrap())
    });
    g.bench_function("parse_dotted_aic", |b| {
        b.iter(|| Aic::parse(black_box("1.2.156.3088.1.1.34c2.478bdf.3gf546.0ju4")).unwrap())
    });
    g.bench_function("aic_from_cert_v1", |b| {
        b.iter(|| aic_from_certificate(black_box(&v1.cert_der), "acps.pub").unwrap())
    });
    g.bench_function("aic_from_cert_v2", |b| {
        b.iter(|| aic_from_certificate(black_box(&v2.cert_der), "acps.pub").unwrap())
    });
    let chain = [v2.cert_der.clone()];
    let rules = identity::AicRules {
        suffix: "acps.pub".into(),
        dotted: Default::default(),
    };
    g.bench_function("authenticate_with_chain_check", |b| {
        b.iter(|| {
            identity::authenticate(
                Some(black_box(&chain)),
                Some(verifier.as_ref()),
                &rules,
                UnixTime::now(),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
