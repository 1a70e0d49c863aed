//! systemd socket activation: the listening sockets systemd bound (`aipgw.socket`,
//! `aipgw-admin.socket`) and passed to `aipgw run`, as `sd_listen_fds` takes them.
//!
//! systemd passes them at descriptors 3, 4, ... and says so in the environment:
//! `LISTEN_PID` (the process they are for: another one's are left alone),
//! `LISTEN_FDS` (how many) and `LISTEN_FDNAMES` (their `FileDescriptorName=`, separated by
//! `:`). [`from_env`] reads the three variables, removes them (so that a process this one
//! starts, such as the successor of an upgrade, does not take descriptors that are not
//! its own), marks the descriptors close-on-exec, and checks each is a listening TCP
//! stream socket. The names `listener` (the gateway's mTLS listener) and `admin` (the
//! admin listener) say which is which; without them (no `LISTEN_FDNAMES`, or systemd's
//! default names, the socket units' own) the first is the listener and the second the
//! admin one. At most [`MAX_FDS`] descriptors are taken: more is refused, as is a
//! name used twice or one that is neither. `cli::run` then checks each address against
//! the config's `listener.bind` / `admin.bind`.
//!
//! Must not: bind or accept (that is `cli::run` and `server`).

use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};

use anyhow::{bail, Context as _};

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const FIRST_FD: RawFd = 3;
/// The most descriptors taken: the listener and the admin listener.
pub const MAX_FDS: usize = 2;
/// The name (`FileDescriptorName=`) of the gateway's listener.
pub const LISTENER: &str = "listener";
/// The name (`FileDescriptorName=`) of the admin listener.
pub const ADMIN: &str = "admin";

/// The listening sockets systemd passed.
#[derive(Debug, Default)]
pub struct Activated {
    /// The gateway's listener.
    pub listener: Option<std::net::TcpListener>,
    /// The admin listener.
    pub admin: Option<std::net::TcpListener>,
}

/// The sockets systemd passed to this process, if any (`None` when `LISTEN_PID` is unset
/// or names another process); the three variables are removed either way. A descriptor
/// that is not a listening TCP socket, more than [`MAX_FDS`] of them, or names other than
/// [`LISTENER`] and [`ADMIN`] are refused.
///
/// Call before any other thread runs: it changes the environment.
pub fn from_env() -> anyhow::Result<Option<Activated>> {
    let var = |k: &str| std::env::var(k).ok();
    let (pid, fds, names) = (var("LISTEN_PID"), var("LISTEN_FDS"), var("LISTEN_FDNAMES"));
    for k in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(k);
    }
    let Some(pid) = pid else {
        return Ok(None);
    };
    let me = rustix::process::getpid().as_raw_nonzero().get();
    if pid.trim().parse::<i32>().ok() != Some(me) {
        return Ok(None);
    }
    let n: usize = fds
        .as_deref()
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("systemd socket activation: LISTEN_FDS={fds:?} is not a count"))?;
    if n > MAX_FDS {
        bail!(
            "systemd socket activation: {n} sockets passed (LISTEN_FDS), at most {MAX_FDS}: the listener and the admin listener"
        );
    }
    let roles = roles(n, names.as_deref())?;
    let mut got = Activated::default();
    for (i, role) in roles.into_iter().enumerate() {
        let fd = FIRST_FD + i32::try_from(i).unwrap_or(0);
        let listener = take(fd)
            .with_context(|| format!("systemd socket activation: descriptor {fd} ({role})"))?;
        match role {
            LISTENER => got.listener = Some(listener),
            _ => got.admin = Some(listener),
        }
    }
    Ok(Some(got))
}

/// What each of the `n` descriptors is: by `names` when they name [`LISTENER`] or
/// [`ADMIN`], otherwise by place.
fn roles(n: usize, names: Option<&str>) -> anyhow::Result<Vec<&'static str>> {
    let by_place = [LISTENER, ADMIN][..n].to_vec();
    let Some(names) = names else {
        return Ok(by_place);
    };
    let names: Vec<&str> = names.split(':').collect();
    if !names.iter().any(|s| *s == LISTENER || *s == ADMIN) {
        return Ok(by_place);
    }
    if names.len() != n {
        bail!(
            "systemd socket activation: {} names (LISTEN_FDNAMES) for {n} sockets",
            names.len()
        );
    }
    let mut roles = Vec::with_capacity(n);
    for name in names {
        let role = match name {
            LISTENER => LISTENER,
            ADMIN => ADMIN,
            other => bail!(
                "systemd socket activation: a socket named {other:?}: FileDescriptorName= must be {LISTENER:?} or {ADMIN:?}"
            ),
        };
        if roles.contains(&role) {
            bail!("systemd socket activation: two sockets named {role:?}");
        }
        roles.push(role);
    }
    Ok(roles)
}

/// Descriptor `fd`, close-on-exec, checked to be a listening TCP socket, as a
/// non-blocking listener.
fn take(fd: RawFd) -> anyhow::Result<std::net::TcpListener> {
    // Checked open before it is owned: a count larger than what systemd passed must not
    // make this process close (or later use) a descriptor it does not own.
    let flags = rustix::io::fcntl_getfd(borrow_raw(fd)).context("not open")?;
    #[expect(
        unsafe_code,
        reason = "systemd passes these descriptors to this process, which owns them from here on (sd_listen_fds); LISTEN_PID named this process and the descriptor is open"
    )]
    // SAFETY: the descriptor is open (above) and nothing else in this process uses it:
    // systemd passed it for this process to own, and it is taken once, before any other
    // thread runs.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&owned, flags | rustix::io::FdFlags::CLOEXEC)?;
    if rustix::net::sockopt::socket_type(&owned)? != rustix::net::SocketType::STREAM {
        bail!("not a stream socket (ListenStream=)");
    }
    if !rustix::net::sockopt::socket_acceptconn(&owned)? {
        bail!("not a listening socket (Accept=no, the default, is needed)");
    }
    super::handover::listener(owned).context("not a TCP socket (ListenStream= an address and port)")
}

/// `fd` borrowed, to ask whether it is open.
fn borrow_raw(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    #[expect(
        unsafe_code,
        reason = "only passed to fcntl(F_GETFD), which fails with EBADF on a closed descriptor and touches nothing"
    )]
    // SAFETY: F_GETFD reads the descriptor's flags and nothing else; a closed one gives
    // EBADF. The borrow is not kept.
    unsafe {
        std::os::fd::BorrowedFd::borrow_raw(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_by_name_by_place_and_refused() {
        assert_eq!(roles(1, None).unwrap(), [LISTENER]);
        assert_eq!(roles(2, None).unwrap(), [LISTENER, ADMIN]);
        assert_eq!(roles(2, Some("admin:listener")).unwrap(), [ADMIN, LISTENER]);
        assert_eq!(roles(1, Some("admin")).unwrap(), [ADMIN]);
        // systemd's default names (the socket units'): by place.
        assert_eq!(
            roles(2, Some("aipgw.socket:aipgw-admin.socket")).unwrap(),
            [LISTENER, ADMIN]
        );
        assert!(roles(2, Some("listener:listener")).is_err());
        assert!(roles(2, Some("listener:other")).is_err());
        assert!(roles(2, Some("listener")).is_err());
    }
}
