//! The writer task: takes events off the queue in batches, seals each into the chain,
//! signs it and appends it (on the blocking pool: a file write never holds up the
//! runtime the accept loop and reloads run on); every `audit.quota_interval` it writes
//! the quota refusals counted; a record lost to a full queue becomes a gap record; a new
//! key from a reload becomes a rotation record signed by the old one (after the batch
//! that carries the reload's own record), after which the new key signs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::file::ChainFile;
use super::key::Signer;
use super::record::{record, seal, Event};
use super::{Audit, Shared};

/// Events taken off the queue per batch, at most.
const BATCH: usize = 256;

/// How often a writer waiting for the file tries its lock again.
const LOCK_POLL: Duration = Duration::from_millis(50);

/// What the queue carries.
pub(crate) enum Msg {
    /// A record to write.
    Event(Event),
    /// Write the stop record, flush, answer, and end.
    Stop(oneshot::Sender<()>),
}

/// What the writer starts with.
pub(crate) struct Start {
    pub(crate) shared: Arc<Shared>,
    pub(crate) rx: mpsc::Receiver<Msg>,
    pub(crate) file: Opening,
    pub(crate) signer: Signer,
}

/// The audit file as the writer gets it.
pub(crate) enum Opening {
    /// Locked and open, the chain read.
    Held(ChainFile),
    /// Held by another process: the writer waits for it (`file.rs`).
    Wait,
}

/// One step of a batch.
enum Step {
    Write(Event),
    /// Signs from here on.
    Key(Signer),
}

/// The file and the key, moved to the blocking pool for each batch.
struct Writing {
    file: ChainFile,
    signer: Signer,
    gateway: String,
}

impl Writing {
    fn apply(&mut self, steps: Vec<Step>, m: &crate::metrics::Metrics) {
        for step in steps {
            let event = match step {
                Step::Key(k) => {
                    self.signer = k;
                    continue;
                }
                Step::Write(e) => e,
            };
            let line = seal(
                record(&self.gateway, &event),
                &self.signer,
                &mut self.file.chain,
            );
            let written = if self.file.fits(&line) {
                self.file.append(&line)
            } else {
                self.file.rotate().and_then(|()| self.file.append(&line))
            };
            match written {
                Ok(()) => {
                    m.audit.records.inc();
                }
                Err(e) => {
                    m.audit.write_errors.inc();
                    tracing::error!(error = %e, "audit record not written");
                }
            }
        }
        if let Err(e) = self.file.flush() {
            m.audit.write_errors.inc();
            tracing::error!(error = %e, "audit file not flushed");
        }
    }
}

/// Runs the writer until the stop message (or until every sender is gone).
pub(crate) async fn run(start: Start) {
    let Start {
        shared,
        mut rx,
        file,
        signer,
    } = start;
    let mut early = Vec::new();
    let file = match file {
        Opening::Held(f) => f,
        Opening::Wait => match wait_for_file(&shared, &mut rx, &mut early).await {
            Some(f) => f,
            None => return,
        },
    };
    let mut steps = Vec::new();
    // Started with a key other than the last record's (changed while stopped): said
    // first, signed by the new key, the old one not being this process's.
    if let Some(old) = file.chain.kid.clone().filter(|k| k != signer.kid()) {
        steps.push(Step::Write(Event::KeyRotated {
            before: Some(old),
            after: signer.kid().to_owned(),
        }));
    }
    steps.push(Step::Write(Event::Start));
    // What came while waiting for the file, then what did not fit.
    steps.extend(early.into_iter().map(Step::Write));
    let lost = shared.lost.swap(0, Ordering::Relaxed);
    if lost > 0 {
        steps.push(Step::Write(Event::Gap { lost }));
    }
    let mut w = Writing {
        file,
        signer,
        gateway: shared.settings.aic.clone(),
    };
    let Some(mut writing) = write(w, &shared, steps).await else {
        return;
    };
    let period = shared.settings.quota_interval;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        let mut batch = Vec::new();
        let mut stop = None;
        let mut take = |m: Msg, batch: &mut Vec<Event>| match m {
            Msg::Event(e) => batch.push(e),
            Msg::Stop(ack) => stop = Some(ack),
        };
        tokio::select! {
            m = rx.recv() => match m {
                Some(m) => take(m, &mut batch),
                None => return,
            },
            _ = tick.tick() => batch.extend(Audit::take_quota(&shared)),
        }
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(m) => take(m, &mut batch),
                Err(_) => break,
            }
        }
        let mut steps = Vec::with_capacity(batch.len() + 3);
        let lost = shared.lost.swap(0, Ordering::Relaxed);
        if lost > 0 {
            steps.push(Step::Write(Event::Gap { lost }));
        }
        steps.extend(batch.into_iter().map(Step::Write));
        // After the batch: a reload's own record comes before the rotation it brought.
        let next_key = crate::sync::lock(&shared.next_key).take();
        if let Some(k) = next_key.filter(|k| k.kid() != writing.signer.kid()) {
            steps.push(Step::Write(Event::KeyRotated {
                before: Some(writing.signer.kid().to_owned()),
                after: k.kid().to_owned(),
            }));
            steps.push(Step::Key(k));
        }
        if stop.is_some() {
            steps.extend(Audit::take_quota(&shared).into_iter().map(Step::Write));
            steps.push(Step::Write(Event::Stop));
        }
        w = match write(writing, &shared, steps).await {
            Some(w) => w,
            None => return,
        };
        writing = w;
        if let Some(ack) = stop {
            let _ = ack.send(());
            return;
        }
    }
}

/// Waits until no other process holds the file, then opens it (its chain read then);
/// meanwhile the queue's events are kept in `early` (up to `audit.queue`; more are lost
/// and counted, a gap record once written). `None`: stopped first (the records kept are
/// not written: said in the log and counted as write errors), or the file failed.
async fn wait_for_file(
    shared: &Arc<Shared>,
    rx: &mut mpsc::Receiver<Msg>,
    early: &mut Vec<Event>,
) -> Option<ChainFile> {
    let s = &shared.settings;
    let waiting = &shared.metrics.audit.waiting;
    waiting.set(1);
    let mut poll = tokio::time::interval(LOCK_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let opened = loop {
        tokio::select! {
            _ = poll.tick() => {
                let (path, bytes, files) = (s.file.clone(), s.max_file_bytes, s.max_files);
                let tried = tokio::task::spawn_blocking(move || {
                    ChainFile::try_open(&path, bytes, files)
                })
                .await;
                match tried {
                    Ok(Ok(Some(f))) => break Some(f),
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => {
                        tracing::error!(error = %format!("{e:#}"), "audit: the file could not be opened: no audit records");
                        break None;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "audit: the file could not be opened: no audit records");
                        break None;
                    }
                }
            }
            m = rx.recv() => match m {
                Some(Msg::Event(e)) if early.len() < s.queue => early.push(e),
                Some(Msg::Event(_)) => {
                    shared.lost.fetch_add(1, Ordering::Relaxed);
                    shared.metrics.audit.dropped.inc();
                }
                Some(Msg::Stop(ack)) => {
                    tracing::error!(
                        file = %s.file.display(),
                        records = early.len(),
                        "audit: stopped while another process held the file: these records were not written"
                    );
                    shared.metrics.audit.write_errors.inc_by(early.len() as u64);
                    let _ = ack.send(());
                    break None;
                }
                None => break None,
            },
        }
    };
    waiting.set(0);
    opened
}

/// Applies a batch on the blocking pool; `None` if that failed (the writer ends).
async fn write(mut w: Writing, shared: &Arc<Shared>, steps: Vec<Step>) -> Option<Writing> {
    let metrics = shared.metrics.clone();
    let done = tokio::task::spawn_blocking(move || {
        w.apply(steps, &metrics);
        w
    })
    .await;
    match done {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::error!(error = %e, "the audit writer failed: no more audit records");
            None
        }
    }
}
