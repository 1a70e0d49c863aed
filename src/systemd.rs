//! What systemd is told (`sd_notify`, for `Type=notify`): `READY=1` once the listeners
//! accept, `RELOADING=1` with `MONOTONIC_USEC` then `READY=1` around a reload,
//! `STOPPING=1` when a drain starts, `STATUS=` lines saying what the gateway does, and,
//! for a take-over, `MAINPID=` of the new process, so that systemd follows it when the old
//! one exits: sent by the old process (the main one, heard under the default
//! `NotifyAccess=main`) before it tells the new one it drains, and by the new one after.
//!
//! A few lines over a Unix datagram socket rather than the `sd-notify` crate: the protocol
//! is one datagram of `KEY=value` lines to the socket `NOTIFY_SOCKET` names (a path, or
//! an abstract name after `@`), the monotonic clock comes from `rustix`, which the
//! hand-over already uses, and the crate would add a dependency for no more than this.
//! Without `NOTIFY_SOCKET` (not under systemd, or `Type=` other than `notify`) nothing is
//! sent. A failed send is logged at debug level and otherwise ignored: systemd not
//! hearing is no reason to stop serving.
//!
//! Must not: decide when the gateway is ready (that is `cli::run` and `reload`).

/// Sends `state` (newline-separated `KEY=value` assignments) to systemd, if it listens.
pub(crate) fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&path, state) {
        tracing::debug!(error = %e, "sd_notify: not sent");
    }
}

/// `READY=1` and a status line.
pub(crate) fn ready(status: &str) {
    notify(&format!("READY=1\nSTATUS={status}"));
}

/// `RELOADING=1` with the time it started (`MONOTONIC_USEC`), as systemd asks.
pub(crate) fn reloading() {
    notify(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading the configuration",
        monotonic_usec()
    ));
}

/// `STOPPING=1` and a status line.
pub(crate) fn stopping(status: &str) {
    notify(&format!("STOPPING=1\nSTATUS={status}"));
}

/// The process `pid` took this one's sockets over: it is the service's main process now
/// (sent by the old process, which systemd hears as the main one under the default
/// `NotifyAccess=main`, before it tells the new one it drains).
pub(crate) fn main_pid(pid: u32) {
    notify(&format!("MAINPID={pid}"));
}

/// This process is now the service's main process (after a take-over), and serves
/// (heard under `NotifyAccess=all`, or once the old process named it).
pub(crate) fn main_pid_ready(status: &str) {
    notify(&format!(
        "MAINPID={}\nREADY=1\nSTATUS={status}",
        std::process::id()
    ));
}

/// CLOCK_MONOTONIC in microseconds, the clock systemd compares `MONOTONIC_USEC` with.
fn monotonic_usec() -> u64 {
    #[cfg(unix)]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000
            + u64::try_from(t.tv_nsec).unwrap_or(0) / 1_000
    }
    #[cfg(not(unix))]
    0
}

#[cfg(target_os = "linux")]
fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let bytes = path.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(std::path::Path::new(path))?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(all(unix, not(target_os = "linux")))]
fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    let socket = std::os::unix::net::UnixDatagram::unbound()?;
    socket.send_to(state.as_bytes(), path)?;
    Ok(())
}

#[cfg(not(unix))]
fn send(_: &std::ffi::OsStr, _: &str) -> std::io::Result<()> {
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn one_datagram_to_a_path_or_an_abstract_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1\nSTATUS=x").unwrap();
        let mut buf = [0u8; 64];
        let n = socket.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=x");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("aipgw-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_socket = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
        send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = abstract_socket.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn the_monotonic_clock_is_in_microseconds() {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let usec = monotonic_usec();
        let secs = u64::try_from(t.tv_sec).unwrap();
        assert!(
            usec / 1_000_000 >= secs && usec / 1_000_000 <= secs + 1,
            "{usec} vs {secs} s"
        );
    }
}
