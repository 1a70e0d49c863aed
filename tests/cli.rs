//! The command line: exit codes and messages of `check`, `inspect-cert`, `run`, usage.
#![allow(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

use aipgw::devcerts::{CertSpec, DevCa};

fn aipgw(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_aipgw"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn demo_config_in(dir: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let certs = Path::new(env!("CARGO_MANIFEST_DIR")).join("certs");
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/aipgw.toml"))
            .unwrap()
            .replace("../certs", &certs.display().to_string());
    write(dir, "aipgw.toml", &edit(text))
}

#[test]
fn check_good_and_bad_configs() {
    let (code, out) = aipgw(&["check", "--config", "config/aipgw.toml"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let bad_key = demo_config_in(dir.path(), |t| {
        t.replace("[limits]", "[limits]\nmax_bodyy = 3")
    });
    let (code, out) = aipgw(&["check", "--config", bad_key.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("max_bodyy"), "{out}");

    let missing_cert = demo_config_in(dir.path(), |t| t.replace("gateway.pem", "nope.pem"));
    let (code, out) = aipgw(&["check", "--config", missing_cert.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("nope.pem"), "{out}");

    // `run` with a bad config is a usage error.
    let (code, out) = aipgw(&["run", "--config", bad_key.to_str().unwrap()]);
    assert_eq!(code, 64, "{out}");
}

#[test]
fn inspect_cert_reports_and_judges() {
    let (code, out) = aipgw(&[
        "inspect-cert",
        "certs/leader-v1.pem",
        "--config",
        "config/aipgw.toml",
    ]);
    assert_eq!(code, 0, "{out}");
    for want in [
        "10001000011K912345E789ABCDEF2353",
        "v1 profile",
        "check code correct",
        "sha256:",
        "issuer:",
        "valid:",
        "accepted by the configured CAs",
        "ACCEPTED",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let (code, out) = aipgw(&["inspect-cert", "certs/leader-v2.pem"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("v2.1 profile"), "{out}");

    // A dotted AIC through an intermediate (in the same file): with the config's salt
    // the check code is verified; without a config it cannot be.
    let (code, out) = aipgw(&[
        "inspect-cert",
        "certs/leader-dotted.pem",
        "--config",
        "config/aipgw.toml",
    ]);
    assert_eq!(code, 0, "{out}");
    for want in [
        "1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU4",
        "AIC form:    v2",
        "registrar:   1",
        "check code:  verified",
        "accepted by the configured CAs",
        "ACCEPTED",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let (code, out) = aipgw(&["inspect-cert", "certs/leader-dotted.pem"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("check code:  unverified"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let other = DevCa::new("another CA").unwrap();
    let bad = other
        .issue(&CertSpec::leader_v2("10001000011K912345E789ABCDEF2354"))
        .unwrap();
    let path = write(dir.path(), "bad.pem", &bad.cert_pem);
    let (code, out) = aipgw(&[
        "inspect-cert",
        path.to_str().unwrap(),
        "--config",
        "config/aipgw.toml",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("WRONG CHECK CODE"), "{out}");
    assert!(out.contains("unknown_issuer"), "{out}");
    assert!(out.contains("REJECTED"), "{out}");

    let (code, out) = aipgw(&["inspect-cert", "no/such/file.pem"]);
    assert_eq!(code, 64, "{out}");
}

#[test]
fn usage_errors_and_version() {
    assert_eq!(aipgw(&["frobnicate"]).0, 64);
    assert_eq!(aipgw(&["run"]).0, 64, "missing --config");
    let (code, out) = aipgw(&["--version"]);
    assert_eq!(code, 0);
    assert!(out.contains(env!("CARGO_PKG_VERSION")), "{out}");
}

/// The real binary: SIGHUP reloads the config; SIGTERM drains and exits 0.
#[cfg(unix)]
#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "drives a child process from a plain thread: the wall clock is the clock"
)]
fn sighup_reloads_and_sigterm_exits_zero() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (main, admin) = (free(), free());
    let dir = tempfile::tempdir().unwrap();
    let config = demo_config_in(dir.path(), |t| {
        t.replace("127.0.0.1:18443", &main.to_string())
            .replace("127.0.0.1:19901", &admin.to_string())
            + "\n[reload]\nwatch = false\n"
    });
    assert_eq!(aipgw(&["check", "--config", config.to_str().unwrap()]).0, 0);
    let mut child = Command::new(env!("CARGO_BIN_EXE_aipgw"))
        .args(["run", "--config", config.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let get = |path: &str| -> Option<String> {
        let mut s = TcpStream::connect(admin).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    };
    let wait_for = |child: &mut std::process::Child, what: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !what() {
            assert!(Instant::now() < deadline, "timed out");
            if let Ok(Some(status)) = child.try_wait() {
                panic!("aipgw exited early: {status}");
            }
            std::thread::yield_now();
        }
    };
    wait_for(&mut child, &|| {
        get("/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
    });
    let pid = child.id();
    let kill = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    };
    kill("-HUP");
    wait_for(&mut child, &|| {
        get("/metrics").is_some_and(|m| m.contains("aipgw_config_reloads_total{result=\"ok\"} 1"))
    });
    kill("-TERM");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// Fuzzing regression: `inspect-cert` reads any file, with no CA behind it, so a
/// certificate whose URI SAN has a multi-byte character where a scheme would end must be
/// reported, not crash the command (it panicked, exit 101).
#[test]
fn inspect_cert_survives_a_non_ascii_uri() {
    let (code, out) = aipgw(&[
        "inspect-cert",
        "tests/data/fuzz/cert-claims-non-ascii-uri.pem",
    ]);
    assert!(!out.contains("panicked"), "{out}");
    assert_ne!(code, 101, "{out}");
    assert!(out.contains("certificate:"), "{out}");
}

/// Issue 13: `run` raises the soft open-file limit to the hard one, and refuses to start
/// when `listener.max_connections` and the Partners cannot fit under it, naming the
/// setting (the demo config allows 10,000 connections; the hard limit here is 300).
#[test]
fn run_refuses_bounds_the_open_file_limit_cannot_hold() {
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -Sn 200 && ulimit -Hn 300 && exec \"$0\" run --config config/aipgw.toml")
        .arg(env!("CARGO_BIN_EXE_aipgw"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("soft_before=200"), "{text}");
    assert!(text.contains("soft=300"), "{text}");
    assert!(text.contains("open-file limit is 300"), "{text}");
    assert!(text.contains("listener.max_connections (10000)"), "{text}");
}

/// `sh -c` running the binary with `args` under an open-file limit of `n` (soft and
/// hard); the exit code and what it wrote.
fn aipgw_limited(n: u32, args: &str) -> (i32, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn {n} && ulimit -Hn {n} && exec \"$0\" {args}"
        ))
        .arg(env!("CARGO_BIN_EXE_aipgw"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Issue 38: `check` makes the open-file check `run` makes, and they agree: over the
/// limit both refuse with the same numbers, naming the settings that make the sum.
#[test]
fn check_and_run_agree_on_the_open_file_budget() {
    let config = "--config config/aipgw.toml";
    let (check, said) = aipgw_limited(3000, &format!("check {config}"));
    let (run, ran) = aipgw_limited(3000, &format!("run {config}"));
    assert_eq!((check, run), (1, 1), "check: {said}\nrun: {ran}");
    let refusal = "the open-file limit is 3000 (hard limit 3000), but listener.max_connections (10000) plus upstream.max_connections (4096) plus 64 reserved need 14160";
    assert!(said.contains(refusal), "{said}");
    assert!(ran.contains(refusal), "{ran}");
    assert!(!ran.contains("max_in_flight"), "{ran}");
    let (check, said) = aipgw_limited(20_000, &format!("check {config}"));
    assert_eq!(check, 0, "{said}");
    assert!(said.contains("14160 needed, limit 20000"), "{said}");
}

/// Issue 38: with the defaults, 10,000 Partners on one origin start on an open-file
/// limit of 20,000 (`check` says so and `run` serves), not 156 Partners at most.
#[cfg(unix)]
#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "drives a child process from a plain thread: the wall clock is the clock"
)]
fn ten_thousand_partners_start_on_twenty_thousand_files() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (main, admin) = (free(), free());
    let dir = tempfile::tempdir().unwrap();
    let config = demo_config_in(dir.path(), |t| {
        let mut t = t
            .replace("127.0.0.1:18443", &main.to_string())
            .replace("127.0.0.1:19901", &admin.to_string())
            + "\n[reload]\nwatch = false\n";
        for n in 0..10_000 {
            t.push_str(&format!(
                "[[partner]]\nname = \"p{n}\"\nprefix = \"/p{n}\"\nupstreams = [\"http://127.0.0.1:19021\"]\n"
            ));
        }
        t
    });
    let config = config.to_str().unwrap();
    let (code, out) = aipgw_limited(20_000, &format!("check --config {config}"));
    assert_eq!(code, 0, "{out}");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn 20000 && ulimit -Hn 20000 && exec \"$0\" run --config {config}"
        ))
        .arg(env!("CARGO_BIN_EXE_aipgw"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ready = || -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(admin) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let asked = write!(
            s,
            "GET /readyz HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n"
        );
        let mut out = String::new();
        asked.is_ok() && s.read_to_string(&mut out).is_ok() && out.starts_with("HTTP/1.1 200")
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("aipgw exited: {status}\n{err}");
        }
        assert!(Instant::now() < deadline, "not ready in time");
        std::thread::yield_now();
    }
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// `[tls]` group lists: an unknown name or an empty list is refused with the valid names;
/// a post-quantum-only listener is a good config, and `inspect-cert` says what it offers.
#[test]
fn check_refuses_bad_group_lists() {
    let dir = tempfile::tempdir().unwrap();
    for (tls, key) in [
        ("listener_groups = [\"X448\"]", "tls.listener_groups"),
        ("partner_groups = []", "tls.partner_groups"),
        ("listener_groups = []", "tls.listener_groups"),
    ] {
        let path = demo_config_in(dir.path(), |t| format!("{t}\n[tls]\n{tls}\n"));
        let (code, out) = aipgw(&["check", "--config", path.to_str().unwrap()]);
        assert_eq!(code, 1, "{tls}: {out}");
        for want in [key, "X25519MLKEM768", "X25519", "secp256r1"] {
            assert!(out.contains(want), "{tls}: {want}: {out}");
        }
    }
    let pq_only = demo_config_in(dir.path(), |t| {
        format!("{t}\n[tls]\nlistener_groups = [\"X25519MLKEM768\"]\n")
    });
    let (code, out) = aipgw(&["check", "--config", pq_only.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = aipgw(&[
        "inspect-cert",
        "certs/leader-v1.pem",
        "--config",
        pq_only.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("TLS groups:  X25519MLKEM768 (aws-lc-rs"),
        "{out}"
    );
    let (_, out) = aipgw(&["inspect-cert", "certs/leader-v1.pem"]);
    assert!(
        out.contains("TLS groups:  X25519MLKEM768, X25519, secp256r1, secp384r1"),
        "{out}"
    );
}
