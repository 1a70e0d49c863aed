//! Issue 37 item 3, `Type=notify`: the real binary told where systemd listens
//! (`NOTIFY_SOCKET`, a datagram socket the test binds) says `READY=1` once it serves,
//! `RELOADING=1` with `MONOTONIC_USEC` then `READY=1` around a SIGHUP reload, `MAINPID=`
//! of the process that took the sockets over (from the old one first, then from the new
//! one, and nothing more from the old one), and `STOPPING=1` when SIGTERM starts a drain.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use crate::support::*;
use crate::upgrade::{free_port, log_line, ready, Proc};

/// The socket systemd would listen on.
struct Notify {
    socket: UnixDatagram,
    path: std::path::PathBuf,
}

impl Notify {
    fn bind(dir: &std::path::Path) -> Notify {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        Notify { socket, path }
    }

    /// The next datagram (30 s at most), as text.
    async fn next(&self) -> String {
        let socket = self.socket.try_clone().unwrap();
        let got = tokio::task::spawn_blocking(move || {
            socket
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            let mut buf = vec![0u8; 4096];
            let n = socket.recv(&mut buf).expect("a datagram within 30 s");
            String::from_utf8(buf[..n].to_vec()).unwrap()
        });
        got.await.unwrap()
    }

    /// The datagrams already there.
    fn pending(&self) -> Vec<String> {
        self.socket.set_nonblocking(true).unwrap();
        let mut out = Vec::new();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = self.socket.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        self.socket.set_nonblocking(false).unwrap();
        out
    }
}

/// `KEY`'s value in a notification, if it has the key.
fn field<'a>(msg: &'a str, key: &str) -> Option<&'a str> {
    msg.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

fn signal(pid: u32, sig: &str) {
    let sent = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_hears_ready_reloading_the_new_main_pid_and_stopping() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let (addr, admin) = (free_port(), free_port());
    let socket = pki.dir.path().join("aipgw.sock");
    let listener = format!(
        "drain_timeout = \"1s\"\nhandover_socket = \"{}\"\n",
        socket.display()
    );
    let rest = format!(
        "[admin]\nbind = \"{admin}\"\n[reload]\nwatch = false\n{}",
        partner_block("p", "/p", &partner.url(), "")
    );
    let text = pki
        .config(&listener, &rest)
        .replace("bind = \"127.0.0.1:0\"", &format!("bind = \"{addr}\""));
    let config = pki.write("gateway.toml", &text);
    let notify = Notify::bind(pki.dir.path());
    let env = [("NOTIFY_SOCKET", notify.path.as_os_str())];

    // Ready once it serves: a request goes through right after.
    let (a, _a_log) = Proc::start_with(&config, &[], &env);
    let first = notify.next().await;
    assert_eq!(field(&first, "READY"), Some("1"), "{first:?}");
    assert_eq!(
        field(&first, "STATUS"),
        Some(format!("serving on {addr}").as_str())
    );
    let leader = pki.leader(LEADER_A, false);
    let reply = leader
        .post(addr, "/p/rpc", &rpc_start("1", LEADER_A, "t-1"))
        .await
        .unwrap();
    assert_eq!(reply.status, 200);

    // SIGHUP: reloading (with the time it started), then ready again.
    let before = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    signal(a.pid(), "-HUP");
    let reloading = notify.next().await;
    assert_eq!(field(&reloading, "RELOADING"), Some("1"), "{reloading:?}");
    let usec: u64 = field(&reloading, "MONOTONIC_USEC")
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC: {reloading:?}"));
    let since = u64::try_from(before.tv_sec).unwrap() * 1_000_000;
    assert!(
        usec >= since && usec < since + 60_000_000,
        "MONOTONIC_USEC {usec} is not this clock's (now about {since})"
    );
    let reloaded = notify.next().await;
    assert_eq!(field(&reloaded, "READY"), Some("1"), "{reloaded:?}");
    assert_eq!(
        field(&reloaded, "STATUS"),
        Some("serving; configuration reloaded")
    );

    // A take-over: the old process, still the main one, names the new one; then the new
    // one names itself and says it serves; the old one, draining, says nothing more (a
    // STOPPING=1 from it would stop the service).
    let (b, b_log) = Proc::start_with(&config, &["--take-over"], &env);
    let named = notify.next().await;
    assert_eq!(named, format!("MAINPID={}", b.pid()));
    let taken = notify.next().await;
    assert_eq!(
        field(&taken, "MAINPID"),
        Some(b.pid().to_string().as_str()),
        "{taken:?}"
    );
    assert_eq!(field(&taken, "READY"), Some("1"));
    let status = field(&taken, "STATUS").unwrap_or("");
    assert!(
        status.contains(&format!("from pid {}", a.pid())),
        "{status:?}"
    );
    log_line(b_log, "took the listening sockets over").await;
    assert_eq!(a.exited().await, Some(0), "A's exit");
    let from_a = notify.pending();
    assert!(from_a.is_empty(), "after the take-over: {from_a:?}");
    ready(admin).await;

    // SIGTERM: stopping, then the drain.
    signal(b.pid(), "-TERM");
    let stopping = notify.next().await;
    assert_eq!(field(&stopping, "STOPPING"), Some("1"), "{stopping:?}");
    assert!(field(&stopping, "STATUS").is_some_and(|s| s.starts_with("draining")));
    assert_eq!(b.exited().await, Some(0), "B's exit");
}

/// A process this test did not start (a gateway's successor), killed when the test ends
/// however it ends.
struct Orphan(u32);

impl Drop for Orphan {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .status();
    }
}

impl Orphan {
    /// Waits (30 s at most) until the process has exited (gone, or a zombie nobody reaps).
    async fn exited(&self) {
        let stat = format!("/proc/{}/stat", self.0);
        within(30, async {
            while let Ok(s) = std::fs::read_to_string(&stat) {
                if s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr2_starts_a_successor_inside_the_service_and_systemd_follows_it() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let (addr, admin) = (free_port(), free_port());
    let socket = pki.dir.path().join("aipgw.sock");
    let listener = format!(
        "drain_timeout = \"1s\"\nhandover_socket = \"{}\"\n",
        socket.display()
    );
    let rest = format!(
        "[admin]\nbind = \"{admin}\"\n[reload]\nwatch = false\n{}",
        partner_block("p", "/p", &partner.url(), "")
    );
    let text = pki
        .config(&listener, &rest)
        .replace("bind = \"127.0.0.1:0\"", &format!("bind = \"{addr}\""));
    let config = pki.write("gateway.toml", &text);
    let notify = Notify::bind(pki.dir.path());
    let env = [("NOTIFY_SOCKET", notify.path.as_os_str())];
    let (a, _a_log) = Proc::start_with(&config, &[], &env);
    assert_eq!(field(&notify.next().await, "READY"), Some("1"));

    // SIGUSR2: A starts its successor, names it to systemd, and drains.
    signal(a.pid(), "-USR2");
    let named = notify.next().await;
    let pid: u32 = field(&named, "MAINPID")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no MAINPID: {named:?}"));
    let successor = Orphan(pid);
    assert_ne!(pid, a.pid());
    let taken = notify.next().await;
    assert_eq!(
        field(&taken, "MAINPID"),
        Some(pid.to_string().as_str()),
        "{taken:?}"
    );
    assert_eq!(field(&taken, "READY"), Some("1"));
    assert_eq!(a.exited().await, Some(0), "A's exit");

    // The successor serves on the same sockets, and stops on SIGTERM.
    ready(admin).await;
    let leader = pki.leader(LEADER_A, false);
    let reply = leader
        .post(addr, "/p/rpc", &rpc_start("1", LEADER_A, "t-1"))
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    signal(pid, "-TERM");
    assert_eq!(field(&notify.next().await, "STOPPING"), Some("1"));
    successor.exited().await;
}
