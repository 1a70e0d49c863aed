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
//! A reload keeps quota, in-flight and stream state (see `Gateway::replace`), and is
//! refused when the new config's bounds do not fit under the open-file limit: the same
//! check as `aipgw check` and `aipgw run` (`crate::fdlimit::ensure`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};

use crate::config::Config;
use crate::gateway::Gateway;

/// Loads `path`, makes the open-file check `aipgw check` and `aipgw run` make
/// (`fdlimit::ensure`), and swaps it in; logs the outcome. A config over the open-file
/// limit is refused (`config_reloads_total{result="over_budget"}`) and the old one stays.
pub fn reload_now(gateway: &Gateway, path: &Path) -> anyhow::Result<()> {
    let count = |result| {
        let labels = crate::metrics::ResultLabels { result };
        let metrics = gateway.snapshot().metrics.clone();
        metrics.config_reloads.get_or_create(&labels).inc();
    };
    // `replace` counts its own outcome; a config that does not even load, or does not fit
    // under the open-file limit, is counted here.
    let result = match Config::load(path) {
        Ok(cfg) => match crate::fdlimit::ensure(&cfg) {
            Ok(_) => gateway.replace(cfg),
            Err(e) => {
                count("over_budget");
                Err(e.into())
            }
        },
        Err(e) => {
            count("failed");
            Err(e)
        }
    };
    // The audit log (the one the gateway started with) records both outcomes.
    let error = result.as_ref().err().map(|e| format!("{e:#}"));
    let snap = gateway.snapshot();
    snap.audit.reloaded(path, error.clone());
    if let Some(amp) = &snap.amp {
        let mut detail = serde_json::Map::new();
        detail.insert("config".into(), path.display().to_string().into());
        if let Some(e) = &error {
            detail.insert("error".into(), e.as_str().into());
        }
        amp.system("reload", error.is_none(), detail);
    }
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

/// What named files held before a load started: the content a load read is what is
/// remembered, not what is on disk once it has finished.
#[derive(Default)]
struct Known(Vec<(PathBuf, Option<ring::digest::Digest>)>);

impl Known {
    fn read(files: &[PathBuf]) -> Known {
        Known(files.iter().cloned().zip(digests(files)).collect())
    }

    /// The digest of `f` if it was read, else what `f` holds now.
    fn digest(&self, f: &Path) -> Option<ring::digest::Digest> {
        match self.0.iter().find(|(p, _)| p == f) {
            Some((_, d)) => *d,
            None => digests(std::slice::from_ref(&f.to_path_buf()))
                .pop()
                .flatten(),
        }
    }
}

/// What the files a config names held when it was loaded, for a watcher started after
/// the load ([`spawn`]): a write landing between the load and the start of the watch is
/// then a change at its event, not taken for what was loaded.
#[derive(Default)]
pub struct AtLoad(Known);

impl AtLoad {
    /// Reads the config file; call it before the file is loaded.
    pub fn config_file(config_path: &Path) -> AtLoad {
        AtLoad(Known::read(&[config_path.to_path_buf()]))
    }

    /// Reads the other files `cfg` names; call it before the gateway loads them.
    pub fn and_named(mut self, config_path: &Path, cfg: &Config) -> AtLoad {
        for f in named_files(config_path, cfg) {
            if !self.0 .0.iter().any(|(p, _)| *p == f) {
                let d = digest(&f);
                self.0 .0.push((f, d));
            }
        }
        self
    }
}

impl Interest {
    /// What `cfg` names; each file's content as `known` has it (read before the load),
    /// or as it is now for a file the previous config did not name.
    fn new(config_path: &Path, cfg: &Config, known: &Known) -> Interest {
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
        let contents = files.iter().map(|f| known.digest(f)).collect();
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
    files.iter().map(|f| digest(f)).collect()
}

/// The SHA-256 of what `f` holds now; `None` if it cannot be read.
fn digest(f: &Path) -> Option<ring::digest::Digest> {
    std::fs::read(f)
        .ok()
        .map(|b| ring::digest::digest(&ring::digest::SHA256, &b))
}

/// Starts reloading on SIGHUP and (with `files`) on file changes, on a task of its own;
/// see [`watcher`]. Abort the handle to stop.
pub fn spawn(
    gateway: Arc<Gateway>,
    config_path: PathBuf,
    debounce: Duration,
    files: bool,
    at_load: AtLoad,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(watcher(gateway, config_path, debounce, files, at_load))
}

/// Reloads on SIGHUP and (with `files`) on file changes while the returned future runs
/// (`background::Background::spawn` runs it until the shutdown). The file watches are in
/// place when this returns, so no change made after it is missed, and one made since the
/// files were read for `at_load` is seen as a change at its event. Needs a runtime (the
/// SIGHUP handler).
pub fn watcher(
    gateway: Arc<Gateway>,
    config_path: PathBuf,
    debounce: Duration,
    files: bool,
    at_load: AtLoad,
) -> impl std::future::Future<Output = ()> + Send + 'static {
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
    w.rewatch(&gateway.snapshot().config, &at_load.0);
    #[cfg(unix)]
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    #[cfg(not(unix))]
    let hup: Option<()> = None;
    run(gateway, w, rx, debounce, hup)
}

struct Watched {
    watcher: Option<notify::RecommendedWatcher>,
    dirs: BTreeSet<PathBuf>,
    interest: Interest,
    config_path: PathBuf,
}

impl Watched {
    /// Watches exactly the folders `cfg` needs, and notes what its files held when it was
    /// loaded (`known`, read before the load started).
    fn rewatch(&mut self, cfg: &Config, known: &Known) {
        self.interest = Interest::new(&self.config_path, cfg, known);
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
                    let labels = crate::metrics::ResultLabels { result: "unchanged" };
                    let metrics = gateway.snapshot().metrics.clone();
                    metrics.config_reloads.get_or_create(&labels).inc();
                    continue;
                }
                true
            }
            _ = sighup(&mut hup) => {
                tracing::info!("SIGHUP: reloading");
                false
            }
        };
        // What the files hold as the load starts is what it reads: remembered as such, a
        // write landing during or just after the load is a change at its event. (Read
        // after the load, it was taken for what had been loaded and never applied.)
        let mut known = Known::read(&w.interest.files);
        crate::systemd::reloading();
        let mut loaded = reload_now(&gateway, &w.config_path).is_ok();
        if !loaded && from_files {
            // A file edited in place may have been read half-written: once it has been
            // quiet for another `debounce`, try again.
            quiet(&mut rx, &w.interest, debounce).await;
            known = Known::read(&w.interest.files);
            loaded = reload_now(&gateway, &w.config_path).is_ok();
        }
        crate::systemd::ready(if loaded {
            "serving; configuration reloaded"
        } else {
            "serving; the reload failed, the previous configuration stays (see the log)"
        });
        w.rewatch(&gateway.snapshot().config, &known);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "[listener]\nbind = \"127.0.0.1:0\"\ncert = \"/nonexistent/c.pem\"\nkey = \"/nonexistent/k.pem\"\nclient_ca = [\"/nonexistent/ca.pem\"]\n";

    /// A config file in a folder of its own (gone with the folder), at version 1.
    fn config_file() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aipgw.toml");
        write_version(&path, 1);
        (dir, path)
    }

    fn write_version(path: &Path, n: u32) {
        std::fs::write(path, format!("{CONFIG}# {n}\n")).unwrap();
    }

    /// A watcher of `path` without file events (the tests drive it by hand).
    fn watched(path: &Path) -> Watched {
        Watched {
            watcher: None,
            dirs: BTreeSet::new(),
            interest: Interest::default(),
            config_path: path.to_path_buf(),
        }
    }

    /// The CI failure this answers: a reload read the file, the next write landed before
    /// the watcher noted the files, and that write was noted as what had been loaded, so
    /// its own event found nothing changed and it never applied.
    #[test]
    fn a_write_landing_after_a_load_is_a_change_not_the_loaded_content() {
        let (_dir, path) = config_file();
        let mut w = watched(&path);
        w.rewatch(&Config::load(&path).unwrap(), &Known::default());
        assert!(!w.interest.changed_on_disk());
        // A load starts: what it reads is noted first.
        write_version(&path, 2);
        let known = Known::read(&w.interest.files);
        let loaded = Config::load(&path).unwrap();
        // The next write lands before the watcher notes the files again.
        write_version(&path, 3);
        w.rewatch(&loaded, &known);
        assert!(
            w.interest.changed_on_disk(),
            "the write after the load was taken for what was loaded"
        );
        // Once that is loaded too, nothing is pending.
        let known = Known::read(&w.interest.files);
        let loaded = Config::load(&path).unwrap();
        w.rewatch(&loaded, &known);
        assert!(!w.interest.changed_on_disk());
    }

    /// The same at start: the watcher starts after the gateway loaded its config, and a
    /// write in between is a change.
    #[test]
    fn a_write_before_the_watcher_starts_is_a_change() {
        let (_dir, path) = config_file();
        let at_load = AtLoad::config_file(&path);
        let loaded = Config::load(&path).unwrap();
        let at_load = at_load.and_named(&path, &loaded);
        write_version(&path, 2);
        let mut w = watched(&path);
        w.rewatch(&loaded, &at_load.0);
        assert!(
            w.interest.changed_on_disk(),
            "the write before the watch was missed"
        );
    }
}
