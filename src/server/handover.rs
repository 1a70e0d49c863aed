//! Upgrades without a refused connection: a new process takes the running one's
//! listening sockets over, and the old one drains.
//!
//! The design is the inherited socket (as HAProxy's seamless reload, Envoy's hot restart
//! and NGINX's binary upgrade do), not `SO_REUSEPORT`: with `SO_REUSEPORT` each process
//! has a socket of its own and an accept queue of its own, the kernel spreads new
//! connections over them, and the connections waiting in the old process's queue when it
//! closes its socket are reset; de-selecting a socket without closing it takes a BPF
//! program. Handing the very socket over keeps one accept queue all along: a connection
//! that arrives while the processes change waits in that queue until one of them accepts
//! it, and none is ever refused or reset.
//!
//! With `listener.handover_socket` set, `run` binds that Unix socket (mode 0600) and
//! offers on it ([`offer`]). A new process started with `aipgw run --take-over`
//! ([`take_over`]) connects there; the old one checks that it runs as the same user
//! (`SO_PEERCRED`) and sends it, with `SCM_RIGHTS`, the listening socket, the control
//! socket itself (so the new process can be upgraded in turn) and the admin listener's
//! socket if it has one. The new process builds everything that can fail (the config,
//! the certificates, the workers), then says `ready`; only then does the old one name the
//! streams its replay buffer holds (`stream <name>` lines, for `sse::handed`), stop
//! accepting (on the gateway's and the admin listener's sockets, which the new process
//! accepts on from then on), answer `draining` and drain as on SIGTERM: in-flight
//! requests finish, streams still open after `listener.drain_timeout` get their final
//! `shutting_down` event, and it exits 0. A new process that fails before `ready`, or
//! takes longer than `listener.handover_timeout`, changes nothing: the old one keeps
//! serving and offering.
//!
//! Must not: accept connections or serve requests (that is `server`).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::{UnixListener, UnixStream};

/// The first line the old process sends, with the sockets.
const HELLO: &str = "aipgw-handover 1";
/// The new process serves: the old one may stop accepting.
const READY: &str = "ready";
/// The old process stopped accepting and drains.
const DRAINING: &str = "draining";
/// The most sockets handed over: the listener, the control socket, the admin listener.
const MAX_FDS: usize = 3;
/// Precedes a stream's name, between `ready` and `draining`.
const STREAM: &str = "stream ";
/// The longest line either side reads, but a stream's.
const MAX_LINE: u64 = 256;
/// The longest stream's name sent (a longer one is left out).
pub const MAX_NAME: usize = 4096;

/// The control socket a running gateway offers its listening sockets on.
pub struct Control {
    listener: UnixListener,
    path: PathBuf,
}

impl Control {
    /// Binds `path` with mode 0600. A socket file nothing answers on (left by a process
    /// that is gone) is replaced; one a running gateway answers on is not: that gateway
    /// is taken over with `run --take-over`.
    pub async fn bind(path: &Path) -> anyhow::Result<Control> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                bail!("{}: exists and is not a socket", path.display());
            }
            if UnixStream::connect(path).await.is_ok() {
                bail!(
                    "{}: a running gateway answers there: start with --take-over to take its sockets over",
                    path.display()
                );
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Control {
            listener,
            path: path.to_owned(),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The listening sockets a process offers (duplicates of the ones it accepts on).
pub struct Offered {
    /// The gateway's listener.
    pub main: OwnedFd,
    /// The admin listener, if there is one.
    pub admin: Option<OwnedFd>,
}

/// Serves the control socket until a successor running as the same user has taken the
/// sockets and said it serves; returns its process id. Each attempt is bounded by
/// `timeout`; a failed one is logged and the next is awaited, this process serving on.
/// `streams` names the streams this process holds, each at most [`MAX_NAME`] bytes on
/// one line (asked once the successor serves).
pub async fn offer(
    control: Control,
    sockets: Offered,
    timeout: Duration,
    streams: &(dyn Fn() -> Vec<String> + Sync),
) -> u32 {
    loop {
        let stream = match control.listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "control socket: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let handed = hand_over(stream, &control, &sockets, streams);
        match tokio::time::timeout(timeout, handed).await {
            Ok(Ok(pid)) => return pid,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "hand-over failed: this process serves on");
            }
            Err(_) => tracing::warn!(
                ?timeout,
                "hand-over: the new process did not say it serves in time: this process serves on"
            ),
        }
        // systemd may have been told of the successor already: this process is the main
        // one still.
        crate::systemd::main_pid(std::process::id());
    }
}

/// One hand-over to the process at the other end of `stream`: the sockets sent, its
/// `ready` awaited, the streams named, `draining` answered.
async fn hand_over(
    stream: UnixStream,
    control: &Control,
    s: &Offered,
    streams: &(dyn Fn() -> Vec<String> + Sync),
) -> anyhow::Result<u32> {
    let pid = same_user(&stream)?;
    let mut fds = vec![s.main.as_fd(), control.listener.as_fd()];
    fds.extend(s.admin.as_ref().map(|a| a.as_fd()));
    let hello = format!("{HELLO} {}\n", std::process::id());
    send_fds(&stream, hello.as_bytes(), &fds).await?;
    let mut stream = BufReader::new(stream);
    let said = read_line(&mut stream).await?;
    if said != READY {
        bail!("pid {pid}: expected {READY:?}, got {said:?}");
    }
    // systemd follows the new process from now on (before it hears `draining` and says
    // so itself, so its own notification comes after this one).
    crate::systemd::main_pid(pid);
    let mut said = String::new();
    for name in streams() {
        if name.len() <= MAX_NAME && !name.contains('\n') {
            said.push_str(STREAM);
            said.push_str(&name);
            said.push('\n');
        }
    }
    said.push_str(DRAINING);
    said.push('\n');
    stream.get_mut().write_all(said.as_bytes()).await?;
    Ok(pid)
}

/// The sockets a new process took over, and the old process that still has to stop.
pub struct Inherited {
    /// The gateway's listener.
    pub main: std::net::TcpListener,
    /// The admin listener, if the old process had one.
    pub admin: Option<std::net::TcpListener>,
    /// The control socket, for the next upgrade.
    pub control: Control,
    /// The old process.
    pub predecessor: Predecessor,
}

/// The old process, serving until told [`Predecessor::ready`].
pub struct Predecessor {
    stream: BufReader<UnixStream>,
    /// Its process id.
    pub pid: u32,
}

/// Connects to the running gateway's control socket at `path` and takes its sockets
/// (within `timeout`); it serves on until [`Predecessor::ready`].
pub async fn take_over(path: &Path, timeout: Duration) -> anyhow::Result<Inherited> {
    let at = || format!("take-over through {}", path.display());
    let stream = UnixStream::connect(path).await.with_context(at)?;
    same_user(&stream).with_context(at)?;
    let received = tokio::time::timeout(timeout, recv_fds(&stream)).await;
    let (hello, fds) = received
        .map_err(|_| anyhow::anyhow!("no sockets within {timeout:?}"))
        .and_then(|r| r.map_err(anyhow::Error::from))
        .with_context(at)?;
    let pid = std::str::from_utf8(&hello)
        .ok()
        .and_then(|h| {
            h.strip_suffix('\n')?
                .strip_prefix(HELLO)?
                .trim()
                .parse()
                .ok()
        })
        .ok_or_else(|| anyhow::anyhow!("{}: not a gateway's hand-over", at()))?;
    let mut fds = fds.into_iter();
    let (Some(main), Some(control)) = (fds.next(), fds.next()) else {
        bail!("{}: fewer sockets than a hand-over sends", at());
    };
    let control = std::os::unix::net::UnixListener::from(control);
    control.set_nonblocking(true)?;
    Ok(Inherited {
        main: listener(main)?,
        admin: fds.next().map(listener).transpose()?,
        control: Control {
            listener: UnixListener::from_std(control)?,
            path: path.to_owned(),
        },
        predecessor: Predecessor {
            stream: BufReader::new(stream),
            pid,
        },
    })
}

/// An inherited descriptor (taken over, or passed by systemd: `server::activation`) as
/// a non-blocking TCP listener; an error if it has no TCP address.
pub(crate) fn listener(fd: OwnedFd) -> std::io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::from(fd);
    l.local_addr()?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// What the old process said once told this one serves.
pub struct Drained {
    /// Its process id.
    pub pid: u32,
    /// The streams it named (at most `max_streams` of them).
    pub streams: Vec<String>,
}

impl Predecessor {
    /// Tells the old process this one serves, and waits (within `timeout`) for it to say
    /// it stopped accepting and drains; keeps the first `max_streams` streams it names.
    pub async fn ready(mut self, timeout: Duration, max_streams: usize) -> anyhow::Result<Drained> {
        let pid = self.pid;
        let told = async {
            let ready = format!("{READY}\n");
            self.stream.get_mut().write_all(ready.as_bytes()).await?;
            let mut streams = Vec::new();
            let mut named = 0usize;
            loop {
                let said = read_line_within(&mut self.stream, MAX_NAME + STREAM.len()).await?;
                if said == DRAINING {
                    break;
                }
                let Some(name) = said.strip_prefix(STREAM) else {
                    bail!("expected {DRAINING:?}, got {said:?}");
                };
                named += 1;
                if streams.len() < max_streams {
                    streams.push(name.to_owned());
                }
            }
            if named > streams.len() {
                tracing::warn!(
                    named,
                    kept = streams.len(),
                    "hand-over: more streams named than replay.max_streams: re-streams of the others are forwarded"
                );
            }
            Ok(Drained { pid, streams })
        };
        tokio::time::timeout(timeout, told)
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {timeout:?}"))?
            .with_context(|| format!("pid {pid} did not confirm the hand-over"))
    }
}

/// The peer's process id, if it runs as this process's user.
fn same_user(stream: &UnixStream) -> anyhow::Result<u32> {
    let cred = stream.peer_cred()?;
    let me = rustix::process::getuid().as_raw();
    if cred.uid() != me {
        bail!("the peer runs as uid {}, this process as {me}", cred.uid());
    }
    let pid = cred.pid().unwrap_or(0);
    Ok(u32::try_from(pid).unwrap_or(0))
}

/// One line (at most [`MAX_LINE`] bytes), without its newline.
async fn read_line(stream: &mut BufReader<UnixStream>) -> anyhow::Result<String> {
    read_line_within(stream, MAX_LINE as usize).await
}

/// One line (at most `max` bytes and its newline), without its newline.
async fn read_line_within(
    stream: &mut BufReader<UnixStream>,
    max: usize,
) -> anyhow::Result<String> {
    let mut line = String::new();
    stream.take(max as u64 + 1).read_line(&mut line).await?;
    match line.strip_suffix('\n') {
        Some(l) => Ok(l.to_owned()),
        None => bail!("the peer closed the control connection"),
    }
}

/// Sends `bytes` with `fds` attached (`SCM_RIGHTS`), in one message.
async fn send_fds(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> anyhow::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            let mut control = SendAncillaryBuffer::new(&mut space);
            control.push(SendAncillaryMessage::ScmRights(fds));
            let iov = [IoSlice::new(bytes)];
            Ok(rustix::net::sendmsg(
                stream,
                &iov,
                &mut control,
                SendFlags::empty(),
            )?)
        })
        .await?;
    if sent != bytes.len() {
        bail!(
            "the hand-over message was cut ({sent} of {} bytes)",
            bytes.len()
        );
    }
    Ok(())
}

/// Receives one message and the descriptors attached to it (close-on-exec).
async fn recv_fds(stream: &UnixStream) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = [0u8; MAX_LINE as usize];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let (n, fds) = stream
        .async_io(Interest::READABLE, || {
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(&mut buf)];
            let got =
                rustix::net::recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
            if got.flags.contains(ReturnFlags::CTRUNC) {
                return Err(std::io::Error::other("more sockets than a hand-over sends"));
            }
            let mut fds = Vec::with_capacity(MAX_FDS);
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(r) = m {
                    fds.extend(r);
                }
            }
            Ok((got.bytes, fds))
        })
        .await?;
    Ok((buf[..n].to_vec(), fds))
}
