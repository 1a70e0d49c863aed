//! Issue 37 item 3, systemd socket activation: the real binary started as systemd starts
//! it for `aipgw.socket` (listening sockets at descriptors 3 and 4, `LISTEN_PID` its own
//! pid, `LISTEN_FDS`, `LISTEN_FDNAMES`) serves Leaders and the admin listener on those
//! sockets instead of binding its own; a passed socket whose address is not the config's,
//! or that is not a listening TCP socket, is refused at start.

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;

use crate::support::*;
use crate::upgrade::{free_port, log_line, ready, Proc};

/// `aipgw run --config <config>` started as systemd starts a socket-activated service:
/// `fds` at descriptors 3, 4, ..., `LISTEN_FDS` their count, `LISTEN_FDNAMES` `names`,
/// and `LISTEN_PID` the gateway's own pid (a shell sets it to its pid, then `exec`s the
/// gateway, which keeps that pid).
fn activated(
    config: &std::path::Path,
    fds: &[std::os::fd::BorrowedFd<'_>],
    names: &str,
) -> (Proc, std::sync::mpsc::Receiver<String>) {
    // Copies above any descriptor the child is given, so that placing one at 3 cannot
    // overwrite another before it is placed (close-on-exec: gone once the shell starts).
    let high: Vec<OwnedFd> = fds
        .iter()
        .map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, 100).unwrap())
        .collect();
    let raw: Vec<i32> = high.iter().map(|f| f.as_raw_fd()).collect();
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", r#"export LISTEN_PID=$$; exec "$0" "$@""#])
        .arg(env!("CARGO_BIN_EXE_aipgw"))
        .args(["run", "--config", config.to_str().unwrap()])
        .env("LISTEN_FDS", fds.len().to_string())
        .env("LISTEN_FDNAMES", names)
        .env_remove("LISTEN_PID");
    #[expect(
        unsafe_code,
        reason = "pre_exec runs between fork and exec; dup2 is async-signal-safe and the descriptors it makes are the child's"
    )]
    // SAFETY: between fork and exec only dup2 runs (no allocation, no lock); the
    // descriptors at 3.. are the child's own, forgotten so that they are not closed here.
    unsafe {
        cmd.pre_exec(move || {
            for (i, fd) in raw.iter().enumerate() {
                let src = std::os::fd::BorrowedFd::borrow_raw(*fd);
                let mut at = OwnedFd::from_raw_fd(3 + i as i32);
                let placed = rustix::io::dup2(src, &mut at);
                std::mem::forget(at);
                placed?;
            }
            Ok(())
        });
    }
    let started = Proc::spawn(&mut cmd);
    drop(high);
    started
}

fn config_text(pki: &Pki, partner: &TestPartner, bind: SocketAddr, admin: SocketAddr) -> String {
    let rest = format!(
        "[admin]\nbind = \"{admin}\"\n[reload]\nwatch = false\n{}",
        partner_block("p", "/p", &partner.url(), "")
    );
    pki.config("", &rest)
        .replace("bind = \"127.0.0.1:0\"", &format!("bind = \"{bind}\""))
}

/// Both listeners passed (named, in the other order than by place): the gateway serves a
/// Leader's request over mTLS and `/readyz` on them. The old binary ignored
/// `LISTEN_FDS`, tried to bind the same addresses itself and failed (in use).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_on_the_sockets_systemd_passed() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (addr, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    let config = pki.write(
        "gateway.toml",
        &config_text(&pki, &partner, addr, admin_addr),
    );

    let (gw, log) = activated(
        &config,
        &[admin.as_fd(), listener.as_fd()],
        "admin:listener",
    );
    // The gateway's copies are the only ones left: it is what accepts.
    drop((listener, admin));
    let said = log_line(log, "aipgw listening").await;
    let from_systemd = |field: &str| {
        said.iter()
            .any(|l| l.contains("socket activation") && l.contains(field))
    };
    assert!(
        from_systemd("listener.bind") && from_systemd("admin.bind"),
        "{said:#?}"
    );
    ready(admin_addr).await;
    let leader = pki.leader(LEADER_A, false);
    let reply = leader
        .post(addr, "/p/rpc", &rpc_start("1", LEADER_A, "t-1"))
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(partner.seen().len(), 1);
    drop(gw);
}

/// A passed socket that is not the config's `listener.bind`, or not a listening TCP
/// socket, stops the start with a message saying so. The old binary bound
/// `listener.bind` itself and served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_not_the_configs_is_refused_at_start() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other_addr = other.local_addr().unwrap();
    let (bind, admin) = (free_port(), free_port());
    let config = pki.write("gateway.toml", &config_text(&pki, &partner, bind, admin));

    // The message names both addresses; the exit code is a config error's.
    let (gw, log) = activated(&config, &[other.as_fd()], "listener");
    let line = format!("listens on {other_addr}, listener.bind is {bind}");
    let waited =
        tokio::task::spawn_blocking(move || log.iter().find(|l| l.contains(&line)).is_some());
    assert!(
        within(30, waited).await.unwrap(),
        "no message naming both addresses"
    );
    assert_eq!(gw.exited().await, Some(64));

    // A UDP socket is not a listening stream socket.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let (gw, log) = activated(&config, &[udp.as_fd()], "listener");
    log_line(log, "not a stream socket").await;
    assert_eq!(gw.exited().await, Some(1));
}
