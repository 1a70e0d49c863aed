//! Hot reload: on SIGHUP, or when the config file, a certificate, a key or a CRL changes
//! on disk, the config is loaded again and swapped in whole (`Gateway::replace`). An
//! invalid config is refused with a log line and `config_reloads{result="failed"}`, and
//! the old one keeps serving.
//!
//! The *folders* of those files are watched, not the files: Kubernetes-style secret
//! updates swap a symlink (`..data`) beside the files, and editors replace files by
//! renaming. But only events that concern a file the config names count: the file itself,
//! the file its symlink points to, or a `..`-prefixed entry (the swapped symlink). A log
//! written next to the config triggers nothing. Events are debounced (`reload.debounce`):
//! a burst of writes is one check. A check reloads only when the content of a named file
//! actually changed (a SHA-256 of each is kept); SIGHUP always reloads.
//!
//! A reload keeps quota, in-flight and stream state (see `Gateway::replace`).

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

/// The config and every file it names.
fn named_files(config_path: &Path, cfg: &Config) -> Vec<PathBuf> {
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
    files.into_iter().map(Path::to_path_buf).collect()
}

/// The folder of a file (`.` for a bare name).
fn folder(f: &Path) -> PathBuf {
    match f.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// What the watcher listens for: the named files, where their symlinks lead, and their
/// folders; and what the named files held at the last load.
#[derive(Default)]
struct Interest {
    files: Vec<PathBuf>,
    /// The named files and their resolved targets, for matching event paths.
    paths: BTreeSet<PathBuf>,
    dirs: BTreeSet<PathBuf>,
    contents: Vec<Option<ring::digest::Digest>>,
}

impl Interest {
    fn new(config_path: &Path, cfg: &Config) -> Interest {
        let files = named_files(config_path, cfg);
        let mut paths = BTreeSet::new();
        let mut dirs = BTreeSet::new();
        for f in &files {
            let abs = std::path::absolute(f).unwrap_or_else(|_| f.clone());
            dirs.insert(folder(&abs));
            paths.insert(abs);
            if let Ok(real) = std::fs::canonicalize(f) {
                dirs.insert(folder(&real));
                paths.insert(real);
            }
        }
        let contents = digests(&files);
        Interest {
            files,
            paths,
            dirs,
            contents,
        }
    }

    /// Whether a change at `path` may concern a named file.
    fn concerns(&self, path: &Path) -> bool {
        let swapped = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(".."));
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        swapped || self.paths.contains(&abs) || self.paths.iter().any(|p| p.starts_with(&abs))
    }

    /// Whether a named file's content differs from the last load.
    fn changed_on_disk(&self) -> bool {
        let now = digests(&self.files);
        now.len() != self.contents.len()
            || now
                .iter()
                .zip(&self.contents)
                .any(|(a, b)| a.as_ref().map(|d| d.as_ref()) != b.as_ref().map(|d| d.as_ref()))
    }
}

fn digests(files: &[PathBuf]) -> Vec<Option<ring::digest::Digest>> {
    files
        .iter()
        .map(|f| {
            std::fs::read(f)
                .ok()
                .map(|b| ring::digest::digest(&ring::digest::SHA256, &b))
        })
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
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<PathBuf>>();
    let watcher = if files {
        match notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if let Ok(e) = res {
                if !e.kind.is_access() {
                    let _ = tx.send(e.paths);
                }
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
        interest: Interest::default(),
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
    interest: Interest,
    config_path: PathBuf,
}

impl Watched {
    /// Watches exactly the folders the current config needs, and notes what its files
    /// hold now.
    fn rewatch(&mut self, gateway: &Gateway) {
        self.interest = Interest::new(&self.config_path, &gateway.snapshot().config);
        let Some(w) = self.watcher.as_mut() else {
            return;
        };
        let wanted = self.interest.dirs.clone();
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

type Events = tokio::sync::mpsc::UnboundedReceiver<Vec<PathBuf>>;

/// Waits until no event concerning a named file has come for `debounce`.
async fn quiet(rx: &mut Events, interest: &Interest, debounce: Duration) {
    let deadline = || tokio::time::Instant::now() + debounce;
    let mut until = deadline();
    loop {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(paths)) => {
                if paths.iter().any(|p| interest.concerns(p)) {
                    until = deadline();
                }
            }
            Ok(None) | Err(_) => return,
        }
    }
}

async fn run(
    gateway: Arc<Gateway>,
    mut w: Watched,
    mut rx: Events,
    debounce: Duration,
    mut hup: Hangup,
) {
    let mut events_open = true;
    loop {
        let from_files = tokio::select! {
            ev = rx.recv(), if events_open => {
                let Some(paths) = ev else {
                    events_open = false; // no file watching: SIGHUP only
                    continue;
                };
                if !paths.iter().any(|p| w.interest.concerns(p)) {
                    continue; // a file the config does not name
                }
                quiet(&mut rx, &w.interest, debounce).await;
                if !w.interest.changed_on_disk() {
                    tracing::debug!("watched files unchanged: no reload");
                    continue;
                }
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
            quiet(&mut rx, &w.interest, debounce).await;
            let _ = reload_now(&gateway, &w.config_path);
        }
        w.rewatch(&gateway);
    }
}
