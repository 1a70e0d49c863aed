//! Hot reload: on SIGHUP, or when the config file, a certificate, a key or a CRL changes
//! on disk, the config is loaded again and swapped in whole (`Gateway::replace`). An
//! invalid config is refused with a log line and `config_reloads{result="failed"}`, and
//! the old one keeps serving.
//!
//! The *folders* of those files are watched, not the files: Kubernetes-style secret
//! updates swap a symlink (`..data`) beside the files, and editors replace files by
//! renaming. Events are debounced (`reload.debounce`): a burst of writes reloads once.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};

use crate::config::Config;
use crate::gateway::Gateway;

/// Loads `path` and swaps it in; logs the outcome.
pub fn reload_now(gateway: &Gateway, path: &Path) -> anyhow::Result<()> {
    // `replace` counts its own outcome; a config that does not even load is counted here.
    let result = match Config::load(path) {
        Ok(cfg) => gateway.replace(cfg),
        Err(e) => {
            let labels = crate::metrics::ResultLabels { result: "failed" };
            gateway
                .snapshot()
                .metrics
                .config_reloads
                .get_or_create(&labels)
                .inc();
            Err(e)
        }
    };
    match &result {
        Ok(()) => tracing::info!(config = %path.display(), "configuration reloaded"),
        Err(e) => tracing::error!(
            config = %path.display(),
            error = %format!("{e:#}"),
            "configuration reload refused; the old one stays"
        ),
    }
    result
}

/// The folders holding the config and every file it names.
fn watched_dirs(config_path: &Path, cfg: &Config) -> BTreeSet<PathBuf> {
    let mut files: Vec<&Path> = vec![config_path, &cfg.listener.cert, &cfg.listener.key];
    files.extend(cfg.listener.client_ca.iter().map(PathBuf::as_path));
    files.extend(cfg.listener.crl.iter().map(PathBuf::as_path));
    for p in &cfg.partners {
        if let Some(t) = &p.tls {
            files.push(&t.ca);
            if let Some((c, k)) = &t.client_cert {
                files.push(c);
                files.push(k);
            }
        }
    }
    files
        .into_iter()
        .filter_map(|f| f.parent())
        .map(|d| {
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            }
        })
        .map(Path::to_path_buf)
        .collect()
}

/// Starts reloading on SIGHUP and (with `files`) on file changes; the file watches are in
/// place when this returns, so no change made after it is missed. Abort the handle to stop.
pub fn spawn(
    gateway: Arc<Gateway>,
    config_path: PathBuf,
    debounce: Duration,
    files: bool,
) -> tokio::task::JoinHandle<()> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let watcher = if files {
        match notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if res.is_ok_and(|e| !e.kind.is_access()) {
                let _ = tx.send(());
            }
        }) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "file watching unavailable; reload with SIGHUP");
                None
            }
        }
    } else {
        drop(tx);
        None
    };
    let mut w = Watched {
        watcher,
        dirs: BTreeSet::new(),
        config_path,
    };
    w.rewatch(&gateway);
    #[cfg(unix)]
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    #[cfg(not(unix))]
    let hup: Option<()> = None;
    tokio::spawn(run(gateway, w, rx, debounce, hup))
}

struct Watched {
    watcher: Option<notify::RecommendedWatcher>,
    dirs: BTreeSet<PathBuf>,
    config_path: PathBuf,
}

impl Watched {
    /// Watches exactly the folders the current config needs.
    fn rewatch(&mut self, gateway: &Gateway) {
        let Some(w) = self.watcher.as_mut() else {
            return;
        };
        let wanted = watched_dirs(&self.config_path, &gateway.snapshot().config);
        for d in self.dirs.difference(&wanted) {
            let _ = w.unwatch(d);
        }
        for d in wanted.difference(&self.dirs) {
            if let Err(e) = w.watch(d, RecursiveMode::NonRecursive) {
                tracing::warn!(dir = %d.display(), error = %e, "cannot watch");
            }
        }
        self.dirs = wanted;
    }
}

#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = Option<()>;

async fn sighup(hup: &mut Hangup) {
    #[cfg(unix)]
    if let Some(s) = hup.as_mut() {
        s.recv().await;
        return;
    }
    let _ = hup;
    std::future::pending::<()>().await
}

async fn run(
    gateway: Arc<Gateway>,
    mut w: Watched,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<()>,
    debounce: Duration,
    mut hup: Hangup,
) {
    let mut events_open = true;
    loop {
        let from_files = tokio::select! {
            ev = rx.recv(), if events_open => {
                if ev.is_none() {
                    events_open = false; // no file watching: SIGHUP only
                    continue;
                }
                // Debounce: wait until the files have been quiet for `debounce`.
                while let Ok(Some(())) = tokio::time::timeout(debounce, rx.recv()).await {}
                true
            }
            _ = sighup(&mut hup) => {
                tracing::info!("SIGHUP: reloading");
                false
            }
        };
        if reload_now(&gateway, &w.config_path).is_err() && from_files {
            // A file edited in place may have been read half-written: once it has been
            // quiet for another `debounce`, try again.
            while let Ok(Some(())) = tokio::time::timeout(debounce, rx.recv()).await {}
            let _ = reload_now(&gateway, &w.config_path);
        }
        w.rewatch(&gateway);
    }
}
