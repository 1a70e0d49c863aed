//! Envelope validation cost against plain serde_json parses of the same bytes.
//!
//! - `ignored_any`: syntax check only (the floor for any JSON reader);
//! - `plain_borrowed`: a borrowed struct `{jsonrpc: &str, method: &str, id: &RawValue,
//!   params: &RawValue}`, the baseline the issue names;
//! - `plain_borrowed_nested`: strict borrowed structs reading the same fields the gateway
//!   reads (`params.message` or `params.command`: command, taskId, sessionId, senderId,
//!   senderRole);
//! - `aipgw_parse_only`: `jsonrpc::parse` alone (fast path, no semantic checks);
//! - `aipgw_validate`: `jsonrpc::parse` + `Parsed::validate` (every envelope check);
//! - `value_tree`: `serde_json::Value`, for reference.
//!
//! Sizes ending in `_v2` are the same request in AIP v02.01's shape (`params.command`).
//!
//! `envelope_a2a`: an A2A `SendMessage` through `jsonrpc::a2a::parse` (every check of an
//! A2A Partner's request) against a plain borrowed parse of the same fields.
#![allow(missing_docs)]

use std::hint::black_box;

use aipgw::jsonrpc;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Deserialize)]
#[allow(dead_code)]
struct Plain<'a> {
    jsonrpc: &'a str,
    method: &'a str,
    #[serde(borrow)]
    id: &'a RawValue,
    #[serde(borrow)]
    params: &'a RawValue,
}

/// The same fields the gateway reads (envelope + `params.message`), as strict borrowed
/// structs: what a plain serde_json parse needs to do to read them at all.
#[derive(Deserialize)]
#[allow(dead_code)]
struct NestedEnv<'a> {
    jsonrpc: &'a str,
    method: &'a str,
    #[serde(borrow)]
    id: &'a RawValue,
    #[serde(borrow)]
    params: NestedParams<'a>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct NestedParams<'a> {
    #[serde(borrow)]
    message: Option<NestedMsg<'a>>,
    #[serde(borrow)]
    command: Option<NestedMsg<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct NestedMsg<'a> {
    command: Option<&'a str>,
    task_id: Option<&'a str>,
    session_id: Option<&'a str>,
    sender_id: Option<&'a str>,
    sender_role: Option<&'a str>,
}

/// An AIP `rpc` start message of about `size` bytes (the text item is padded).
fn message(size: usize) -> Vec<u8> {
    let head = r#"{"jsonrpc":"2.0","method":"rpc","id":"req-0001","params":{"message":{"type":"message","id":"msg-5678","sentAt":"2025-09-01T11:58:00+08:00","senderRole":"leader","senderId":"10001000011K912345E789ABCDEF2353","command":"start","commandParams":{"responseTimeout":30},"dataItems":[{"type":"text","text":""#;
    let tail = r#""}],"taskId":"task-1234","sessionId":"session-91011"}}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let text: String = "Plan a three day cultural trip. "
        .chars()
        .cycle()
        .take(pad)
        .collect();
    format!("{head}{text}{tail}").into_bytes()
}

/// The same request in AIP v02.01's shape: the TaskCommand in `params.command`.
fn command_v2(size: usize) -> Vec<u8> {
    let v1 = String::from_utf8(message(size)).unwrap_or_default();
    v1.replacen(
        "\"message\":{\"type\":\"message\"",
        "\"command\":{\"type\":\"task-command\"",
        1,
    )
    .into_bytes()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("envelope");
    for (name, size, make) in [
        ("400B", 400, message as fn(usize) -> Vec<u8>),
        ("1.5KB", 1536, message),
        ("64KB", 65536, message),
        ("400B_v2", 400, command_v2),
        ("1.5KB_v2", 1536, command_v2),
    ] {
        let body = make(size);
        assert!(jsonrpc::parse(&body).ok().unwrap().validate().is_ok());
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(BenchmarkId::new("ignored_any", name), &body, |b, body| {
            b.iter(|| serde_json::from_slice::<IgnoredAny>(black_box(body)).unwrap())
        });
        // The whole-body UTF-8 pass `jsonrpc::parse` now starts with (issue 8); the
        // surrogate scan after it only stops at backslashes, which these bodies lack.
        g.bench_with_input(BenchmarkId::new("utf8_check", name), &body, |b, body| {
            b.iter(|| std::str::from_utf8(black_box(body)).is_ok())
        });
        g.bench_with_input(BenchmarkId::new("utf8_simd", name), &body, |b, body| {
            b.iter(|| simdutf8::basic::from_utf8(black_box(body)).is_ok())
        });
        g.bench_with_input(
            BenchmarkId::new("plain_borrowed", name),
            &body,
            |b, body| {
                b.iter(|| {
                    let p: Plain<'_> = serde_json::from_slice(black_box(body)).unwrap();
                    black_box(p.method.len())
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("plain_borrowed_nested", name),
            &body,
            |b, body| {
                b.iter(|| {
                    let p: NestedEnv<'_> = serde_json::from_slice(black_box(body)).unwrap();
                    let m = p.params.message.or(p.params.command);
                    black_box(m.map(|m| m.command))
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("aipgw_parse_only", name),
            &body,
            |b, body| b.iter(|| black_box(jsonrpc::parse(black_box(body)).ok().unwrap().id())),
        );
        g.bench_with_input(
            BenchmarkId::new("aipgw_validate", name),
            &body,
            |b, body| {
                b.iter(|| {
                    let e = jsonrpc::parse(black_box(body))
                        .ok()
                        .unwrap()
                        .validate()
                        .unwrap();
                    black_box(e.method)
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("value_tree", name), &body, |b, body| {
            b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(body)).unwrap())
        });
    }
    g.finish();
}

/// An A2A `SendMessage` (v1.0) of about `size` bytes, its text part padded.
fn a2a_send(size: usize) -> Vec<u8> {
    let head = r#"{"jsonrpc":"2.0","id":"req-1","method":"SendMessage","params":{"message":{"messageId":"9f1c2a8e-1b7d-4e55-8f0e-2a4b6c8d0e1f","role":"ROLE_USER","taskId":"3f0b8c52-6a1e-4d7a-9c3b-5e2f1a0d4b6c","contextId":"c7d1e2f3-a4b5-4c6d-8e9f-0a1b2c3d4e5f","parts":[{"text":""#;
    let tail = r#""}]},"configuration":{"acceptedOutputModes":["text/plain"]}}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    format!("{head}{}{tail}", "x".repeat(pad)).into_bytes()
}

/// The fields the gateway reads of an A2A message, as strict borrowed structs.
#[derive(Deserialize)]
#[allow(dead_code)]
struct A2aEnv<'a> {
    jsonrpc: &'a str,
    method: &'a str,
    #[serde(borrow)]
    id: &'a RawValue,
    #[serde(borrow)]
    params: A2aParams<'a>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct A2aParams<'a> {
    #[serde(borrow)]
    message: Option<A2aMsg<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct A2aMsg<'a> {
    task_id: Option<&'a str>,
    context_id: Option<&'a str>,
    role: Option<&'a str>,
}

/// The A2A envelope (`jsonrpc::a2a::parse`: text, depth, every check) against a plain
/// borrowed parse of the same fields.
fn bench_a2a(c: &mut Criterion) {
    let mut g = c.benchmark_group("envelope_a2a");
    for (name, size) in [("400B", 400), ("1.5KB", 1536), ("64KB", 65536)] {
        let body = a2a_send(size);
        assert!(jsonrpc::a2a::parse(&body, 64).is_ok());
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(BenchmarkId::new("ignored_any", name), &body, |b, body| {
            b.iter(|| serde_json::from_slice::<IgnoredAny>(black_box(body)).unwrap())
        });
        g.bench_with_input(
            BenchmarkId::new("plain_borrowed_nested", name),
            &body,
            |b, body| {
                b.iter(|| {
                    let p: A2aEnv<'_> = serde_json::from_slice(black_box(body)).unwrap();
                    black_box(p.params.message.map(|m| m.task_id))
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("a2a_parse", name), &body, |b, body| {
            b.iter(|| {
                let e = jsonrpc::a2a::parse(black_box(body), 64).ok().unwrap();
                black_box(e.task_id.is_some())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench, bench_a2a);
criterion_main!(benches);
