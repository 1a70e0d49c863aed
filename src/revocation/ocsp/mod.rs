//! OCSP for Leader certificates (issue 31, item 2): the answers cache and the gate a
//! request passes.
//!
//! A request on a verified connection looks its certificate up ([`Ocsp::gate`]): the
//! certificate's [`wire::Subject`] (issuer, serial, responder, request DER) is made once
//! per verdict and shared through the verdict cache, so a returning Leader costs an
//! atomic load and one map lookup. A standing `revoked` answer refuses (-32010
//! `revoked`), a `good` one passes. Without a standing answer the query is queued for the
//! background task ([`run`], owned by `background::Background`) and the request is never
//! held on the network by this step: under `soft` it passes, under `hard` it goes on to
//! `layers::ocsp_wait`, which waits for the answer at most `revocation.ocsp_timeout`.
//! Since every request looks the answer up, an answer that arrives after the handshake
//! applies to the connection's next request.
//!
//! Answers are kept per (issuer, serial) until their `nextUpdate`, at most
//! `ocsp_max_age`, in at most `ocsp_max_entries` entries; a `good` answer is asked again
//! once nine tenths of its time has passed (the request meanwhile passes on it). A
//! `revoked` answer is asked again like a `good` one, but stands until a newer answer
//! replaces it. A failed query stands for `ocsp_retry_interval`.

pub mod query;
pub mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use rustls_pki_types::CertificateDer;

use super::settings::{OcspPolicy, RevocationSettings};
use crate::identity::{ConnIdentity, CredentialError};
use crate::metrics::Metrics;
pub use query::run;
use wire::{Answer, Bad, Status, Subject};

/// What a request does after the lookup.
#[derive(Debug, PartialEq, Eq)]
pub enum Gate {
    /// Goes on.
    Pass,
    /// Refused with -32010 and this reason.
    Refuse(CredentialError),
    /// (`hard`) Waits for the answer being asked (`layers::ocsp_wait`).
    Wait,
}

/// Why a query gave no answer (a metrics label: `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The query took longer than `ocsp_timeout`.
    Timeout,
    /// No connection, or the connection failed.
    Unreachable,
    /// An HTTP status other than 200.
    HttpStatus,
    /// A body longer than `ocsp_max_response_bytes`.
    TooLarge,
    /// `ocsp_max_queries` were queued or in flight.
    QueueFull,
    /// An answer that was not taken.
    Bad(Bad),
}

impl Failure {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Unreachable => "unreachable",
            Failure::HttpStatus => "http_status",
            Failure::TooLarge => "too_large",
            Failure::QueueFull => "queue_full",
            Failure::Bad(b) => b.label(),
        }
    }
}

/// One certificate's entry.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The standing answer (`None`: none yet, or the last query failed).
    status: Option<Status>,
    /// Unix seconds until which `status` (or, without one, the failure) stands.
    until: u64,
    /// Unix seconds from which a standing answer is asked again.
    refresh_at: u64,
    /// A query is queued or in flight.
    querying: bool,
}

/// The answers cache, the queue to the background task, and the settings they follow.
pub struct Ocsp {
    settings: ArcSwap<RevocationSettings>,
    entries: Mutex<HashMap<[u8; 32], Entry>>,
    queue: tokio::sync::mpsc::UnboundedSender<Arc<Subject>>,
    receiver: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Arc<Subject>>>>,
    /// Queries queued or in flight (at most `ocsp_max_queries`).
    queries: AtomicUsize,
    /// Bumped at every settled query (a `hard` request waits on it).
    answered: tokio::sync::watch::Sender<u64>,
    /// Queries settled so far (what `answered` counts, read without its lock): a pooled
    /// Partner connection is judged again when it moved.
    settled: AtomicU64,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Ocsp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ocsp")
            .field("entries", &self.lock().len())
            .finish()
    }
}

impl Ocsp {
    /// An empty cache following `settings`.
    pub fn new(settings: &RevocationSettings, metrics: Arc<Metrics>) -> Ocsp {
        metrics
            .ocsp
            .set_max_responders(settings.ocsp.max_responder_labels);
        let (queue, receiver) = tokio::sync::mpsc::unbounded_channel();
        Ocsp {
            settings: ArcSwap::from_pointee(settings.clone()),
            entries: Mutex::new(HashMap::new()),
            queue,
            receiver: Mutex::new(Some(receiver)),
            queries: AtomicUsize::new(0),
            answered: tokio::sync::watch::channel(0).0,
            settled: AtomicU64::new(0),
            metrics,
        }
    }

    /// A reload's settings (the answers stay: they do not depend on the config).
    pub fn reconfigure(&self, settings: &RevocationSettings) {
        self.metrics
            .ocsp
            .set_max_responders(settings.ocsp.max_responder_labels);
        self.settings.store(Arc::new(settings.clone()));
    }

    /// The settings now.
    pub fn settings(&self) -> Arc<RevocationSettings> {
        self.settings.load_full()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Entry>> {
        crate::sync::lock(&self.entries)
    }

    /// The subject of `identity`'s end entity (made once per verdict).
    fn subject(
        &self,
        identity: &ConnIdentity,
        cas: &[CertificateDer<'static>],
        fallback: Option<&str>,
    ) -> Option<Arc<Subject>> {
        identity.ocsp_subject(|chain| Subject::of(chain, cas, fallback))
    }

    /// The verdict for a request on a verified connection at `now` (see the module
    /// documentation); `cas`: the configured client CAs (where the issuer is looked for).
    pub fn gate(&self, identity: &ConnIdentity, cas: &[CertificateDer<'static>], now: u64) -> Gate {
        let settings = self.settings.load();
        let policy = settings.ocsp.policy;
        if policy == OcspPolicy::Off {
            return Gate::Pass;
        }
        let Some(subject) = self.subject(identity, cas, settings.ocsp.url.as_deref()) else {
            // No responder to ask, or no issuer to check an answer with.
            return no_answer(policy, false);
        };
        self.gate_subject(&subject, now)
    }

    /// The verdict for the certificate `subject` names at `now`, its query queued when no
    /// answer stands (Leaders through [`Ocsp::gate`]; Partners at their handshake,
    /// `revocation::partner`). `Pass` when OCSP is off.
    pub fn gate_subject(&self, subject: &Arc<Subject>, now: u64) -> Gate {
        let settings = self.settings.load();
        let policy = settings.ocsp.policy;
        if policy == OcspPolicy::Off {
            return Gate::Pass;
        }
        let mut map = self.lock();
        let (hit, status, querying) = match map.get_mut(&subject.key) {
            Some(e) if standing(e, now) => {
                if now >= e.refresh_at && !e.querying {
                    e.querying = self.enqueue(subject);
                }
                (true, e.status, e.querying)
            }
            Some(e) if e.querying || now < e.until => (true, None, e.querying),
            _ => {
                let querying = self.enqueue(subject);
                let entry = Entry {
                    status: None,
                    until: if querying {
                        0
                    } else {
                        now + settings.ocsp.retry_interval.as_secs()
                    },
                    refresh_at: 0,
                    querying,
                };
                insert(&mut map, subject.key, entry, settings.ocsp.max_entries, now);
                (false, None, querying)
            }
        };
        drop(map);
        subject
            .lookups
            .get_or_init(|| self.metrics.ocsp.lookups(&subject.url))
            .looked_up(hit);
        match status {
            Some(Status::Good) => Gate::Pass,
            Some(Status::Revoked) => Gate::Refuse(CredentialError::Revoked),
            Some(Status::Unknown) => no_answer(policy, false),
            None => no_answer(policy, querying),
        }
    }

    /// The verdict for a certificate that names no responder (or whose issuer is not
    /// known): `Pass`, but under `hard` a refusal (`revocation_status_unknown`).
    pub fn unaskable(&self) -> Gate {
        no_answer(self.settings.load().ocsp.policy, false)
    }

    /// Whether OCSP is asked (`soft` or `hard`).
    pub fn enabled(&self) -> bool {
        self.settings.load().ocsp.policy != OcspPolicy::Off
    }

    /// Queues a query for `subject`; false (counted) when `ocsp_max_queries` are
    /// queued or in flight.
    fn enqueue(&self, subject: &Arc<Subject>) -> bool {
        let max = self.settings.load().ocsp.max_queries;
        let taken = self
            .queries
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        if !taken || self.queue.send(subject.clone()).is_err() {
            if taken {
                self.queries.fetch_sub(1, Ordering::AcqRel);
            }
            self.metrics
                .ocsp
                .failed(&subject.url, Failure::QueueFull.label());
            return false;
        }
        true
    }

    /// The subject a `hard` request must wait for: `Some` when the policy is `hard` and
    /// no standing `good` answer lets it through (see `layers::ocsp_wait`).
    pub fn awaited(&self, identity: &ConnIdentity, now: u64) -> Option<Arc<Subject>> {
        let settings = self.settings.load();
        if settings.ocsp.policy != OcspPolicy::Hard {
            return None;
        }
        let subject = identity.ocsp_subject_made()?;
        match self.settled(&subject.key, now) {
            Some(Ok(())) => None,
            _ => Some(subject),
        }
    }

    /// Under `hard`, what the entry of `key` says now: `None` while a query is still
    /// out.
    fn settled(&self, key: &[u8; 32], now: u64) -> Option<Result<(), CredentialError>> {
        let map = self.lock();
        let Some(e) = map.get(key) else {
            return Some(Err(CredentialError::RevocationStatusUnknown));
        };
        match e.status {
            Some(Status::Good) if now < e.until => Some(Ok(())),
            Some(Status::Revoked) => Some(Err(CredentialError::Revoked)),
            _ if e.querying => None,
            _ => Some(Err(CredentialError::RevocationStatusUnknown)),
        }
    }

    /// Waits (at most `ocsp_timeout`) for the answer on `subject`: `Ok` for `good`.
    pub async fn wait(&self, subject: &Subject) -> Result<(), CredentialError> {
        let timeout = self.settings.load().ocsp.timeout;
        let mut answered = self.answered.subscribe();
        let waited = tokio::time::timeout(timeout, async {
            loop {
                let now = crate::identity::verdict::unix_now();
                if let Some(verdict) = self.settled(&subject.key, now) {
                    return verdict;
                }
                if answered.changed().await.is_err() {
                    return Err(CredentialError::RevocationStatusUnknown);
                }
            }
        })
        .await;
        waited.unwrap_or(Err(CredentialError::RevocationStatusUnknown))
    }

    /// How many queries have settled: it moves whenever an answer (or a failure) is
    /// stored.
    pub(crate) fn settled_count(&self) -> u64 {
        self.settled.load(Ordering::Acquire)
    }

    /// The queue's receiving end, once (for [`run`]).
    pub(crate) fn take_queue(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Arc<Subject>>> {
        crate::sync::lock(&self.receiver).take()
    }

    /// A query on `subject` ended at `now` (Unix seconds).
    pub(crate) fn settle(&self, subject: &Subject, result: Result<Answer, Failure>, now: u64) {
        self.queries.fetch_sub(1, Ordering::AcqRel);
        let settings = self.settings.load();
        let o = &settings.ocsp;
        let entry = match result {
            Ok(answer) => {
                self.metrics
                    .ocsp
                    .answered(&subject.url, answer.status.label());
                if answer.status == Status::Revoked {
                    tracing::warn!(responder = subject.url, "ocsp: certificate revoked");
                }
                let next = answer
                    .next_update
                    .and_then(|n| u64::try_from(n).ok())
                    .unwrap_or(u64::MAX);
                let until = next.min(now + o.max_age.as_secs()).max(now + 1);
                Entry {
                    status: Some(answer.status),
                    until,
                    refresh_at: now + (until - now) * 9 / 10,
                    querying: false,
                }
            }
            Err(failure) => {
                self.metrics.ocsp.failed(&subject.url, failure.label());
                tracing::warn!(
                    responder = subject.url,
                    reason = failure.label(),
                    "ocsp: no usable answer"
                );
                Entry {
                    status: None,
                    until: now + o.retry_interval.as_secs().max(1),
                    refresh_at: 0,
                    querying: false,
                }
            }
        };
        let mut map = self.lock();
        // A failed refresh leaves a standing answer in place until it ends.
        let keep = map
            .get(&subject.key)
            .is_some_and(|e| entry.status.is_none() && standing(e, now));
        if keep {
            if let Some(e) = map.get_mut(&subject.key) {
                e.querying = false;
                e.refresh_at = entry.until.min(e.until);
            }
        } else {
            insert(&mut map, subject.key, entry, o.max_entries, now);
        }
        drop(map);
        self.settled.fetch_add(1, Ordering::AcqRel);
        self.answered.send_modify(|n| *n += 1);
    }

    /// How many answers (or failures) are held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether `e` holds an answer that stands at `now`: one before its end, or a `revoked`
/// one (a revocation is final: only a newer answer replaces it, never a failed query).
fn standing(e: &Entry, now: u64) -> bool {
    match e.status {
        Some(Status::Revoked) => true,
        Some(_) => now < e.until,
        None => false,
    }
}

/// What a request without a standing answer does.
fn no_answer(policy: OcspPolicy, querying: bool) -> Gate {
    match policy {
        OcspPolicy::Hard if querying => Gate::Wait,
        OcspPolicy::Hard => Gate::Refuse(CredentialError::RevocationStatusUnknown),
        _ => Gate::Pass,
    }
}

/// Inserts within `max` entries: when full, the ended ones go first, then any one that
/// is not being asked.
fn insert(map: &mut HashMap<[u8; 32], Entry>, key: [u8; 32], e: Entry, max: usize, now: u64) {
    if map.len() >= max && !map.contains_key(&key) {
        map.retain(|_, e| e.querying || now < e.until);
        if map.len() >= max {
            let victim = map
                .iter()
                .find(|(_, e)| !e.querying)
                .or_else(|| map.iter().next())
                .map(|(k, _)| *k);
            if let Some(k) = victim {
                map.remove(&k);
            }
        }
    }
    map.insert(key, e);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(status: Option<Status>, until: u64, querying: bool) -> Entry {
        Entry {
            status,
            until,
            refresh_at: 0,
            querying,
        }
    }

    #[test]
    fn the_cache_is_bounded_ended_entries_first_and_queries_kept() {
        let mut map = HashMap::new();
        let now = 1_000;
        insert(
            &mut map,
            [1; 32],
            entry(Some(Status::Good), now + 10, false),
            2,
            now,
        );
        insert(&mut map, [2; 32], entry(None, 0, true), 2, now);
        // Full: a third entry pushes out one that is not being asked.
        insert(
            &mut map,
            [3; 32],
            entry(Some(Status::Good), now + 10, false),
            2,
            now,
        );
        assert_eq!(map.len(), 2);
        assert!(map.contains_key(&[2; 32]), "an entry being asked stays");
        // Ended entries go first.
        insert(
            &mut map,
            [4; 32],
            entry(Some(Status::Good), now + 10, false),
            2,
            now + 20,
        );
        assert_eq!(map.len(), 2);
        assert!(map.contains_key(&[2; 32]) && map.contains_key(&[4; 32]));
    }

    #[test]
    fn a_revoked_answer_stands_past_its_end_and_a_good_one_does_not() {
        let now = 1_000;
        assert!(standing(&entry(Some(Status::Revoked), now - 1, false), now));
        assert!(!standing(&entry(Some(Status::Good), now, false), now));
        assert!(standing(&entry(Some(Status::Good), now + 1, false), now));
        assert!(!standing(&entry(None, now + 10, false), now));
        assert_eq!(no_answer(OcspPolicy::Soft, true), Gate::Pass);
        assert_eq!(no_answer(OcspPolicy::Hard, true), Gate::Wait);
        assert_eq!(
            no_answer(OcspPolicy::Hard, false),
            Gate::Refuse(CredentialError::RevocationStatusUnknown)
        );
    }
}
