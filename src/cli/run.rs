//! `aipgw run`: the gateway's sockets (bound here, passed by systemd:
//! `crate::server::activation`, or taken over from the running process:
//! `crate::server::handover`), the work beside the listener, the listener until
//! SIGTERM or a hand-over to a new process, then the ordered stop.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::shared::{failed, open_files, shared_store, shutdown_signal, usage, Failure};
use crate::config::{Config, ListenerConfig};
use crate::server::activation::Activated;
use crate::server::handover::{self, Control, Offered, Predecessor};

/// The sockets `run` serves on.
struct Sockets {
    main: TcpListener,
    /// The admin listener's socket when it was taken over (otherwise bound later).
    admin: Option<TcpListener>,
    /// The control socket a successor takes these sockets over through.
    control: Option<Control>,
    /// The process these sockets were taken from, serving until told this one does.
    predecessor: Option<Predecessor>,
}

/// Runs the gateway until SIGTERM/SIGINT or a hand-over, then drains and stops in order.
pub(super) async fn run(
    cfg: Config,
    at_load: Option<crate::reload::AtLoad>,
    take_over: bool,
    activated: Option<Activated>,
) -> Result<(), Failure> {
    let (bind, admin_bind) = (cfg.listener.bind, cfg.admin_bind);
    let (cfg_scheduler, worker_count) = (cfg.scheduler, cfg.workers());
    let cache_flush = cfg.cache_flush_interval;
    // Before the workers start: their arenas are made with it.
    crate::allocator::set_freed_page_decay(cfg.freed_page_decay);
    let handover_timeout = cfg.listener.handover_timeout;
    // The certificates, keys and CRLs as they are before the gateway reads them.
    let reload = cfg.source.clone().map(|p| {
        let at_load = at_load.unwrap_or_default().and_named(&p, &cfg);
        (p, cfg.reload_watch, cfg.reload_debounce, at_load)
    });
    open_files(&cfg)?;
    let sockets = sockets(&cfg.listener, admin_bind, take_over, activated).await?;
    let gateway = crate::Gateway::new(cfg).map_err(usage)?;
    shared_store(&gateway, false).await.map_err(usage)?;
    // Set once a successor serves on these sockets: this process stops accepting.
    let (handed_tx, handed_rx) = watch::channel(false);
    // Everything beside the listener has one owner, stopped in order after the drain.
    let mut background = crate::background::Background::start(&gateway);
    let admin = admin_socket(admin_bind, sockets.admin).await?;
    if let Some(control) = sockets.control {
        let offered = Offered {
            main: dup(&sockets.main)?,
            admin: admin.as_ref().map(dup).transpose()?,
        };
        let path = control.path().display().to_string();
        tracing::info!(%path, "hand-over offered on the control socket");
        // The streams this process's buffer holds, named to the successor.
        let g = gateway.clone();
        let streams = move || crate::sse::handed::lines(&*g.snapshot().replay, handover::MAX_NAME);
        // SIGUSR2 starts the successor (until this process has handed its sockets over).
        let until_handed = handed(handed_rx.clone());
        let usr2 = super::upgrade::on_sigusr2();
        background.spawn(async move {
            tokio::select! {
                () = usr2 => {}
                () = until_handed => {}
            }
        });
        background.spawn(async move {
            let pid = handover::offer(control, offered, handover_timeout, &streams).await;
            tracing::info!(pid, "the listening sockets were taken over: draining");
            handed_tx.send_replace(true);
        });
    }
    if let Some(admin) = admin {
        let stop = handed(handed_rx.clone());
        background.spawn(crate::admin::run(admin, gateway.clone(), stop));
    }
    // SIGHUP always reloads; file changes too unless `reload.watch = false`.
    if let Some((path, watch, debounce, at_load)) = reload {
        let g = gateway.clone();
        background.spawn(crate::reload::watcher(g, path, debounce, watch, at_load));
    }
    let workers = match cfg_scheduler {
        crate::config::Scheduler::PerCore => Some(Arc::new(
            crate::workers::Workers::start(worker_count, cache_flush)
                .map_err(|e| failed(anyhow::anyhow!("cannot start the workers: {e}")))?,
        )),
        crate::config::Scheduler::Shared => None,
    };
    // SIGTERM taken before systemd hears `READY=1` (see `shutdown_signal`).
    let term = shutdown_signal();
    // systemd (`Type=notify`): ready now that the listening socket accepts; after a
    // take-over, this process is the service's main one from now on.
    match sockets.predecessor {
        Some(p) => {
            let pid = took_over(&gateway, p, handover_timeout).await;
            let from = pid.map_or(String::new(), |p| {
                format!(" (took the sockets over from pid {p})")
            });
            crate::systemd::main_pid_ready(&format!("serving on {bind}{from}"));
        }
        None => crate::systemd::ready(&format!("serving on {bind}")),
    }
    tracing::info!(%bind, workers = worker_count, scheduler = ?cfg_scheduler, "aipgw listening");
    let stop = async {
        tokio::select! {
            _ = term => {
                crate::systemd::stopping("draining: in-flight requests finish, then the process exits");
            }
            // Nothing to tell systemd: the successor is its main process now.
            _ = handed(handed_rx) => {}
        }
    };
    let result = crate::server::listen(sockets.main, gateway, stop, workers.clone())
        .await
        .map_err(failed);
    background.shutdown().await;
    // After the drain: whatever is left on the workers is cancelled.
    drop(workers);
    result
}

/// Tells the process these sockets came from that this one serves, and keeps the streams
/// it names (`sse::handed`) for as long as it could have served them; its pid, if it
/// confirmed.
async fn took_over(
    gateway: &crate::Gateway,
    p: Predecessor,
    timeout: std::time::Duration,
) -> Option<u32> {
    let snap = gateway.snapshot();
    match p.ready(timeout, snap.config.replay.max_streams).await {
        Ok(d) => {
            let keep = snap.config.replay.retention + snap.config.listener.drain_timeout;
            snap.handed_over.set(&d.streams, d.pid, keep);
            let streams = snap.handed_over.count();
            tracing::info!(pid = d.pid, streams, "took the listening sockets over");
            Some(d.pid)
        }
        Err(e) => {
            tracing::warn!(error = %e, "took the listening sockets over");
            None
        }
    }
}

/// The admin listener's socket, if configured: `inherited` from the process taken over,
/// or bound here.
async fn admin_socket(
    bind: Option<SocketAddr>,
    inherited: Option<TcpListener>,
) -> Result<Option<TcpListener>, Failure> {
    let Some(bind) = bind else {
        return Ok(None);
    };
    let listener = match inherited {
        Some(l) => l,
        None => TcpListener::bind(bind).await.map_err(|e| {
            failed(anyhow::anyhow!(
                "cannot bind the admin listener {bind}: {e}"
            ))
        })?,
    };
    tracing::info!(%bind, "admin listener: /healthz /readyz /metrics");
    Ok(Some(listener))
}

/// Completes once a successor has taken the sockets over (never if none does).
async fn handed(mut rx: watch::Receiver<bool>) {
    if rx.wait_for(|h| *h).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A second descriptor of `listener`'s socket, to hand over.
fn dup(listener: &TcpListener) -> Result<std::os::fd::OwnedFd, Failure> {
    listener
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| failed(e.into()))
}

/// The listening sockets: taken over from the running gateway (`--take-over`), passed by
/// systemd (socket activation, `server::activation`), or bound, with the control socket
/// if `listener.handover_socket` is set.
async fn sockets(
    l: &ListenerConfig,
    admin_bind: Option<SocketAddr>,
    take_over: bool,
    activated: Option<Activated>,
) -> Result<Sockets, Failure> {
    let path = l.handover_socket.as_deref();
    if !take_over {
        let activated = activated.unwrap_or_default();
        let tokio =
            |l: std::net::TcpListener| TcpListener::from_std(l).map_err(|e| failed(e.into()));
        let main = match activated.listener {
            Some(s) => tokio(passed(s, "listener.bind", Some(l.bind))?)?,
            None => TcpListener::bind(l.bind)
                .await
                .map_err(|e| failed(anyhow::anyhow!("cannot bind {}: {e}", l.bind)))?,
        };
        let admin = activated
            .admin
            .map(|s| passed(s, "admin.bind", admin_bind))
            .transpose()?;
        let control = match path {
            Some(p) => Some(Control::bind(p).await.map_err(failed)?),
            None => None,
        };
        return Ok(Sockets {
            main,
            admin: admin.map(tokio).transpose()?,
            control,
            predecessor: None,
        });
    }
    if activated.is_some() {
        return Err(usage(anyhow::anyhow!(
            "--take-over: systemd passed listening sockets (socket activation): a take-over takes them from the running gateway instead"
        )));
    }
    let path = path.ok_or_else(|| {
        usage(anyhow::anyhow!(
            "--take-over: the config sets no listener.handover_socket"
        ))
    })?;
    let got = handover::take_over(path, l.handover_timeout)
        .await
        .map_err(failed)?;
    let addr = got.main.local_addr().map_err(|e| failed(e.into()))?;
    if !same(addr, l.bind) {
        return Err(usage(anyhow::anyhow!(
            "--take-over: the running gateway listens on {addr}, listener.bind is {}",
            l.bind
        )));
    }
    // The admin socket is used where the config names the same address; otherwise it is
    // bound anew (and the old process's is closed once it stops).
    let admin = got
        .admin
        .filter(|a| matches!((a.local_addr(), admin_bind), (Ok(a), Some(b)) if same(a, b)));
    let tokio = |l: std::net::TcpListener| TcpListener::from_std(l).map_err(|e| failed(e.into()));
    Ok(Sockets {
        main: tokio(got.main)?,
        admin: admin.map(tokio).transpose()?,
        control: Some(got.control),
        predecessor: Some(got.predecessor),
    })
}

/// A socket systemd passed for the config's `field` (`bind`), checked to listen there.
fn passed(
    s: std::net::TcpListener,
    field: &str,
    bind: Option<SocketAddr>,
) -> Result<std::net::TcpListener, Failure> {
    let addr = s.local_addr().map_err(|e| failed(e.into()))?;
    match bind {
        Some(b) if same(addr, b) => {
            tracing::info!(%addr, field, "listening socket from systemd (socket activation)");
            Ok(s)
        }
        Some(b) => Err(usage(anyhow::anyhow!(
            "systemd socket activation: the socket passed for {field} listens on {addr}, {field} is {b}: make the socket unit's ListenStream= and the config name the same address"
        ))),
        None => Err(usage(anyhow::anyhow!(
            "systemd socket activation: a socket passed for {field} ({addr}), and the config sets no {field}"
        ))),
    }
}

/// Whether a socket bound to `addr` is the one a config naming `bind` asks for (port 0:
/// any port on that address).
fn same(addr: SocketAddr, bind: SocketAddr) -> bool {
    addr == bind || (bind.port() == 0 && addr.ip() == bind.ip())
}
