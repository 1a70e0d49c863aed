//! Connection workers: one thread per core, each running a single-threaded tokio runtime
//! (`runtime.scheduler = "per_core"`, the default).
//!
//! The accept loop (`server::run_on`) hands each accepted connection to the worker with
//! the fewest open connections; from then on everything the connection does runs on that
//! thread: its TLS, its requests, the Partner connections its requests use (each worker
//! has its own Partner pools, `upstream::UpstreamPool` picks them by
//! [`current`]), and the tasks its requests spawn. No request crosses threads, so there is
//! no work-stealing queue, no cross-thread wake-up and no shared pool lock on the request
//! path: the shape of NGINX's and HAProxy's workers. The price is that a connection stays
//! on its worker: a few very busy HTTP/2 connections can load the workers unevenly
//! (`runtime.scheduler = "shared"` uses tokio's work-stealing runtime instead).
//!
//! Must not: know what a connection does (that is `server`).

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    static INDEX: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The worker this thread is (`Some(0..n)`), or `None` off the workers (the accept
/// thread, a shared runtime, an embedding program).
pub fn current() -> Option<usize> {
    INDEX.with(Cell::get)
}

/// The pool a per-worker structure of `n` slots uses on this thread: the worker's own,
/// slot 0 off the workers.
pub(crate) fn slot(n: usize) -> usize {
    current().map_or(0, |i| i % n.max(1))
}

/// The running workers; dropping this stops them (their remaining tasks are cancelled).
pub struct Workers {
    workers: Vec<Worker>,
}

struct Worker {
    handle: Handle,
    /// Connections on this worker now.
    open: Arc<AtomicUsize>,
    /// Allocation-cache flushes made on this worker.
    flushes: Arc<AtomicU64>,
    /// Dropped to stop the worker.
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Workers {
    /// Starts `n` worker threads (at least one), named `aipgw-worker-<i>`, each flushing
    /// its allocation cache every `cache_flush` (`runtime.cache_flush_interval`; see
    /// [`crate::allocator::flush_thread_cache`]).
    pub fn start(n: usize, cache_flush: Option<Duration>) -> std::io::Result<Workers> {
        let mut workers = Vec::with_capacity(n.max(1));
        for i in 0..n.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let flushes = Arc::new(AtomicU64::new(0));
            if let Some(every) = cache_flush {
                // A task of the worker's own runtime, so the cache flushed is this thread's.
                let flushes = flushes.clone();
                handle.spawn(async move {
                    let first = tokio::time::Instant::now() + every;
                    let mut tick = tokio::time::interval_at(first, every);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tick.tick().await;
                        if crate::allocator::flush_thread_cache() {
                            flushes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            let (stop, stopped) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("aipgw-worker-{i}"))
                .spawn(move || {
                    INDEX.with(|c| c.set(Some(i)));
                    // Tasks spawned through `handle` run while this thread blocks here.
                    // It ends when its `stop` sender is dropped (or sends).
                    let _ = runtime.block_on(stopped);
                    // Dropping the runtime cancels what is left (after the drain).
                })?;
            workers.push(Worker {
                handle,
                open: Arc::new(AtomicUsize::new(0)),
                flushes,
                stop: Some(stop),
                thread: Some(thread),
            });
        }
        Ok(Workers { workers })
    }

    /// How many workers run.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Always false: there is at least one worker.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Open connections per worker, in worker order.
    pub fn open_connections(&self) -> Vec<usize> {
        self.workers
            .iter()
            .map(|w| w.open.load(Ordering::Relaxed))
            .collect()
    }

    /// Allocation-cache flushes made so far, per worker in worker order (each counts only
    /// flushes the allocator did: none in a build without jemalloc).
    pub fn cache_flushes(&self) -> Vec<u64> {
        self.workers
            .iter()
            .map(|w| w.flushes.load(Ordering::Relaxed))
            .collect()
    }

    /// Moves an accepted connection to the least loaded worker and runs `serve(tcp)`
    /// there. The socket is re-registered with that worker's reactor, so its readiness
    /// events wake that thread only.
    pub(crate) fn serve<F, Fut>(&self, tcp: TcpStream, serve: F) -> std::io::Result<()>
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let w = self
            .workers
            .iter()
            .min_by_key(|w| w.open.load(Ordering::Relaxed))
            .expect("at least one worker");
        let std = tcp.into_std()?;
        let open = w.open.clone();
        open.fetch_add(1, Ordering::Relaxed);
        // The socket becomes a tokio one again on the worker, inside its runtime.
        w.handle.spawn(async move {
            let _counted = OpenGuard(open);
            match TcpStream::from_std(std) {
                Ok(tcp) => serve(tcp).await,
                Err(e) => tracing::warn!(error = %e, "cannot move a connection to its worker"),
            }
        });
        Ok(())
    }
}

struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Each worker has its own stop channel, so one not yet blocked on it still sees it.
        for w in &mut self.workers {
            w.stop.take();
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Workers stopped before they reach their wait still stop (each has its own stop
    /// channel; one shared `Notify` keeps a single permit, and the rest waited forever).
    #[test]
    fn workers_stopped_at_once_all_stop() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for _ in 0..20 {
                drop(Workers::start(4, None).unwrap());
            }
            let _ = done.send(());
        });
        assert!(
            finished
                .recv_timeout(std::time::Duration::from_secs(20))
                .is_ok(),
            "a worker never stopped"
        );
    }

    /// Issue 13: each worker flushes its own allocation cache on its timer (a task of its
    /// runtime), whether or not it has work; none without the setting.
    #[test]
    #[expect(
        clippy::disallowed_methods,
        reason = "real threads outside any runtime: only the wall clock and a blocking wait"
    )]
    fn each_worker_flushes_its_cache_on_its_timer() {
        let jemalloc = crate::allocator::flush_thread_cache();
        let workers = Workers::start(2, Some(Duration::from_millis(5))).unwrap();
        let quiet = Workers::start(2, None).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while workers.cache_flushes().iter().any(|&n| n < 3) && jemalloc {
            assert!(
                std::time::Instant::now() < deadline,
                "flushes so far: {:?}",
                workers.cache_flushes()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        if !jemalloc {
            assert_eq!(workers.cache_flushes(), [0, 0], "nothing to flush");
        }
        assert_eq!(quiet.cache_flushes(), [0, 0]);
    }

    #[test]
    fn connections_go_to_the_least_loaded_worker_and_run_there() {
        let workers = Workers::start(2, None).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut clients = Vec::new();
            for _ in 0..4 {
                clients.push(TcpStream::connect(addr).await.unwrap());
                let (tcp, _) = listener.accept().await.unwrap();
                let tx = tx.clone();
                workers
                    .serve(tcp, move |mut tcp| async move {
                        use tokio::io::AsyncReadExt;
                        let _ = tx.send((current(), std::thread::current().id()));
                        // Held open until the client closes.
                        let mut b = [0u8; 1];
                        let _ = tcp.read(&mut b).await;
                    })
                    .unwrap();
                // Counted before the next pick: each serve is seen by the next.
            }
            let mut seen = Vec::new();
            for _ in 0..4 {
                seen.push(rx.recv().await.unwrap());
            }
            let on = |i| seen.iter().filter(|(w, _)| *w == Some(i)).count();
            assert_eq!((on(0), on(1)), (2, 2), "{seen:?}");
            // Off the accept thread: each worker its own thread.
            assert!(seen.iter().all(|(_, t)| *t != std::thread::current().id()));
            assert_eq!(workers.open_connections(), vec![2, 2]);
            drop(clients);
            for _ in 0..200 {
                if workers.open_connections() == vec![0, 0] {
                    break;
                }
                tokio::task::yield_now().await;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert_eq!(workers.open_connections(), vec![0, 0]);
        });
        assert_eq!(current(), None);
        drop(workers);
    }
}
