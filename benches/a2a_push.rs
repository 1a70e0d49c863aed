//! The push-URL check's cost on an A2A Partner's request path (`a2a::push::find`), against
//! one plain parse of the same bytes:
//!
//! - `ignored_any`: a serde_json syntax pass (what any second parse costs at least);
//! - `find_without_config`: a `SendMessage` with no push config: the byte search alone;
//! - `find_with_config`: the same with `configuration.taskPushNotificationConfig`: the
//!   search, then the borrowed parse of the fields that may hold a URL.
#![allow(missing_docs)]

use std::hint::black_box;

use aipgw::test_util::a2a_push_urls;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde::de::IgnoredAny;

/// An A2A 1.0 `SendMessage` of about `size` bytes (the text part padded), with a push
/// config or without.
fn send_message(size: usize, push: bool) -> Vec<u8> {
    let head = r#"{"jsonrpc":"2.0","id":"req-0001","method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"9229e770-767c-417b-a0b0-f0741243c589","contextId":"c0a1","parts":[{"text":""#;
    let config = if push {
        r#","configuration":{"returnImmediately":true,"taskPushNotificationConfig":{"url":"https://hooks.example.com/a2a/notify","token":"tok-1"}}"#
    } else {
        r#","configuration":{"returnImmediately":true,"acceptedOutputModes":["text/plain"]}"#
    };
    let tail = format!(r#""}}]}}{config}}}}}"#);
    let pad = size.saturating_sub(head.len() + tail.len());
    let text: String = "Plan a three day cultural trip. "
        .chars()
        .cycle()
        .take(pad)
        .collect();
    format!("{head}{text}{tail}").into_bytes()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("a2a_push");
    for (name, size) in [("400B", 400), ("1.5KB", 1536), ("64KB", 65536)] {
        let plain = send_message(size, false);
        let with = send_message(size, true);
        assert!(a2a_push_urls(&plain).is_none());
        assert!(matches!(a2a_push_urls(&with), Some(Ok(v)) if v.len() == 1));
        serde_json::from_slice::<IgnoredAny>(&with).unwrap();
        g.throughput(Throughput::Bytes(plain.len() as u64));
        g.bench_with_input(BenchmarkId::new("ignored_any", name), &plain, |b, body| {
            b.iter(|| serde_json::from_slice::<IgnoredAny>(black_box(body)).unwrap())
        });
        g.bench_with_input(
            BenchmarkId::new("find_without_config", name),
            &plain,
            |b, body| b.iter(|| a2a_push_urls(black_box(body)).is_none()),
        );
        g.bench_with_input(
            BenchmarkId::new("find_with_config", name),
            &with,
            |b, body| b.iter(|| a2a_push_urls(black_box(body)).is_some()),
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
