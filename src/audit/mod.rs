//! The audit log: every security decision as an AMP `audit` record, signed by the
//! gateway's audit key and chained by hash, in a file of JSON lines (`[audit]`, off by
//! default).
//!
//! What is recorded: requests refused for their identity (no certificate, a rejected
//! one), the block list, access rules and task ownership (one record each, from the one
//! place refusals become responses: `layers::respond`); quota refusals, counted per AIC
//! and written once per `audit.quota_interval` (a flood cannot fill the disk); config
//! reloads, applied or refused (with the SHA-256 of the file read); an open
//! connection's certificate verdict that changed (a reloaded CRL revoked it, it
//! expired); the gateway's start and stop; key rotations; records lost.
//!
//! Writing never blocks a request: [`Audit::record`] puts the event in a bounded queue
//! (`audit.queue`) and returns; a writer task (owned by `background`) signs and appends.
//! A full queue loses the record, counts it (`aipgw_audit_dropped_total`) and the writer
//! puts a gap record in the chain, saying how many were lost.
//!
//! Records, signatures and the chain: `record`; the file and its rotation: `file`; the
//! writer: `writer`; `aipgw audit verify`: `verify`.

pub(crate) mod file;
pub(crate) mod key;
pub(crate) mod record;
pub mod verify;
pub(crate) mod writer;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::mpsc;

use crate::error::GatewayError;
use crate::identity::{ConnAuth, CredentialError};
use record::{Event, Refusal, Refused};

/// `[audit]`, validated (see `config::raw::RawAudit` for each field's meaning and
/// default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSettings {
    /// The audit file.
    pub file: PathBuf,
    /// The signing key (PKCS#8 PEM).
    pub key: PathBuf,
    /// The key id, if set.
    pub kid: Option<String>,
    /// The gateway's AIC.
    pub aic: String,
    /// Queue bound.
    pub queue: usize,
    /// Rotation size.
    pub max_file_bytes: u64,
    /// Rotated files kept.
    pub max_files: usize,
    /// Quota refusals aggregated over this.
    pub quota_interval: Duration,
    /// AICs counted apart per interval.
    pub quota_max_aics: usize,
    /// Refusals of one kind from one caller written in full per interval.
    pub repeat_limit: u64,
}

/// Who made a refused request, and what it asked.
#[derive(Debug)]
pub(crate) struct Caller {
    /// Its AIC, when its certificate gave one.
    pub(crate) aic: Option<String>,
    /// Its address.
    pub(crate) ip: IpAddr,
    /// The JSON-RPC method, once read.
    pub(crate) method: Option<&'static str>,
    /// The Partner the path names.
    pub(crate) partner: Option<Arc<str>>,
    /// The AIP task, once read.
    pub(crate) task: Option<String>,
    /// The request's trace id.
    pub(crate) trace_id: Option<String>,
}

/// One kind of refusal from one caller in the current interval: refusals seen, those past
/// `audit.repeat_limit`, and the last of those.
type Repeats = (u64, u64, Option<Box<Refused>>);

/// Other refusals past `audit.repeat_limit` in the current interval, per kind and caller.
#[derive(Default)]
struct RepeatTally {
    /// Per kind and caller (its AIC, or its address).
    by_caller: HashMap<(Refusal, Box<str>), Repeats, ahash::RandomState>,
    /// Refusals past the limit of callers past `quota_max_aics`, and the last of them.
    others: (u64, Option<Box<Refused>>),
}

/// Quota refusals counted in the current interval.
#[derive(Default)]
struct QuotaTally {
    /// Per AIC: count, last address, last reason.
    by_aic: HashMap<String, (u64, IpAddr, &'static str), ahash::RandomState>,
    /// Refusals of AICs past `quota_max_aics`.
    others: u64,
}

/// What the writer owns and the handle shares.
pub(crate) struct Shared {
    pub(crate) settings: AuditSettings,
    /// Records lost to a full queue since the last gap record.
    pub(crate) lost: AtomicU64,
    quota: Mutex<QuotaTally>,
    repeats: Mutex<RepeatTally>,
    /// A new signing key, set by a reload, taken by the writer.
    pub(crate) next_key: Mutex<Option<key::Signer>>,
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
}

/// The audit log's handle: shared by every snapshot (carried over reloads).
pub struct Audit {
    inner: Option<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    tx: mpsc::Sender<writer::Msg>,
    /// The writer's half, until `background` starts it.
    start: Mutex<Option<writer::Start>>,
}

impl Audit {
    /// No audit log.
    pub fn off() -> Audit {
        Audit { inner: None }
    }

    /// Opens the audit file (reading where its chain stands) and loads the key.
    pub fn open(
        settings: Option<&AuditSettings>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> anyhow::Result<Audit> {
        let Some(s) = settings else {
            return Ok(Audit::off());
        };
        let signer = key::Signer::load(&s.key, s.kid.as_deref())
            .with_context(|| format!("audit.key {}", s.key.display()))?;
        let file = match file::ChainFile::try_open(&s.file, s.max_file_bytes, s.max_files)? {
            Some(f) => writer::Opening::Held(f),
            None => {
                // Held by another process: opened now only to find a path or permission
                // error at load; the writer waits for the lock (file.rs).
                file::open_append(&s.file)?;
                tracing::info!(
                    file = %s.file.display(),
                    "audit: the file is held by another process (a take-over's old one?); records queue until it lets go"
                );
                writer::Opening::Wait
            }
        };
        let (tx, rx) = mpsc::channel(s.queue);
        let shared = Arc::new(Shared {
            settings: s.clone(),
            lost: AtomicU64::new(0),
            quota: Mutex::default(),
            repeats: Mutex::default(),
            next_key: Mutex::new(None),
            metrics,
        });
        let start = writer::Start {
            shared: shared.clone(),
            rx,
            file,
            signer,
        };
        Ok(Audit {
            inner: Some(Inner {
                shared,
                tx,
                start: Mutex::new(Some(start)),
            }),
        })
    }

    /// Whether records are written.
    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Queues an event; never waits (a full queue loses it, counted).
    pub(crate) fn record(&self, event: Event) {
        let Some(inner) = &self.inner else { return };
        if inner.tx.try_send(writer::Msg::Event(event)).is_err() {
            inner.shared.lost.fetch_add(1, Ordering::Relaxed);
            inner.shared.metrics.audit.dropped.inc();
        }
    }

    /// The writer task (once; `None` when off or already taken); its first record says
    /// the gateway started.
    pub(crate) fn writer(&self) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let inner = self.inner.as_ref()?;
        let start = crate::sync::lock(&inner.start).take()?;
        Some(writer::run(start))
    }

    /// Writes the stop record and waits (up to `timeout`) for everything queued before it
    /// to be written.
    pub(crate) async fn stop(&self, timeout: Duration) {
        let Some(inner) = &self.inner else { return };
        let (done, wait) = tokio::sync::oneshot::channel();
        if inner
            .tx
            .send_timeout(writer::Msg::Stop(done), timeout)
            .await
            .is_ok()
        {
            let _ = tokio::time::timeout(timeout, wait).await;
        }
    }

    /// A request refused by `error` (a security decision; anything else is not
    /// recorded), made by `who` (built only when the log is on: see [`Audit::enabled`]).
    pub(crate) fn refused(&self, error: &GatewayError, who: Caller) {
        let Some(inner) = &self.inner else { return };
        let kind = match error {
            GatewayError::AuthenticationRequired => Refusal::Identity,
            GatewayError::InvalidCredential(CredentialError::Blocked) => Refusal::BlockList,
            GatewayError::InvalidCredential(_) => Refusal::Identity,
            GatewayError::Forbidden { reason, .. } => match *reason {
                "not_task_owner" | "unknown_task" | "not_stream_owner" | "session_mismatch" => {
                    Refusal::Ownership
                }
                _ => Refusal::Access,
            },
            GatewayError::RateLimited { reason, .. } => {
                if let Some(aic) = who.aic.as_deref() {
                    self.quota_refused(inner, aic, who.ip, reason);
                }
                return;
            }
            _ => return,
        };
        let (_, code, reason) = error.classify();
        let refused = Box::new(Refused {
            kind,
            aic: who.aic,
            ip: who.ip,
            reason,
            code,
            method: who.method,
            partner: who.partner,
            task: who.task,
            trace_id: who.trace_id.filter(|t| t.len() == 32),
            repeated: None,
        });
        if let Some(refused) = Self::past_repeat_limit(inner, refused) {
            self.record(Event::Refused(refused));
        }
    }

    /// `refused` back if it is within `audit.repeat_limit` for its kind and caller this
    /// interval; otherwise counted (the last kept) and `None`.
    fn past_repeat_limit(inner: &Inner, refused: Box<Refused>) -> Option<Box<Refused>> {
        let s = &inner.shared.settings;
        let caller: Box<str> = match &refused.aic {
            Some(aic) => aic.as_str().into(),
            None => refused.ip.to_string().into(),
        };
        let mut t = crate::sync::lock(&inner.shared.repeats);
        let key = (refused.kind, caller);
        if t.by_caller.len() >= s.quota_max_aics && !t.by_caller.contains_key(&key) {
            t.others.0 += 1;
            t.others.1 = Some(refused);
            return None;
        }
        let (seen, past, last) = t.by_caller.entry(key).or_insert((0, 0, None));
        *seen += 1;
        if *seen <= s.repeat_limit {
            return Some(refused);
        }
        *past += 1;
        *last = Some(refused);
        None
    }

    fn quota_refused(&self, inner: &Inner, aic: &str, ip: IpAddr, reason: &'static str) {
        let max = inner.shared.settings.quota_max_aics;
        let mut q = crate::sync::lock(&inner.shared.quota);
        if let Some(e) = q.by_aic.get_mut(aic) {
            *e = (e.0 + 1, ip, reason);
        } else if q.by_aic.len() < max {
            q.by_aic.insert(aic.to_owned(), (1, ip, reason));
        } else {
            q.others += 1;
        }
    }

    /// An open connection's verdict changed from `before` to `after`.
    pub(crate) fn verdict_changed(
        &self,
        peer: std::net::SocketAddr,
        before: &ConnAuth,
        after: &ConnAuth,
    ) {
        if self.inner.is_none() {
            return;
        }
        let aic = |a: &ConnAuth| match a {
            ConnAuth::Verified(p) => Some(p.aic.as_str().to_owned()),
            _ => None,
        };
        let after = match after {
            ConnAuth::Verified(p) => Ok(p.aic.as_str().to_owned()),
            ConnAuth::Missing => Err("no_client_certificate"),
            ConnAuth::Rejected(e) => Err(e.reason()),
        };
        self.record(Event::Verdict {
            peer,
            before: aic(before),
            after,
        });
    }

    /// A reload of `path`: applied (`error` `None`) or refused.
    pub(crate) fn reloaded(&self, path: &Path, error: Option<String>) {
        if self.inner.is_none() {
            return;
        }
        let sha256 = std::fs::read(path)
            .ok()
            .map(|b| crate::identity::sha256_hex(&b));
        self.record(Event::Reload {
            path: path.display().to_string(),
            sha256,
            error,
        });
    }

    /// A reloaded config's audit key, loaded (`None`: no audit log, or none now). Other
    /// `[audit]` fields are read at start only.
    pub(crate) fn load_key(
        &self,
        settings: Option<&AuditSettings>,
    ) -> anyhow::Result<Option<key::Signer>> {
        let (Some(_), Some(s)) = (&self.inner, settings) else {
            return Ok(None);
        };
        key::Signer::load(&s.key, s.kid.as_deref())
            .with_context(|| format!("audit.key {}", s.key.display()))
            .map(Some)
    }

    /// Hands a reloaded key to the writer: if its id differs from the current one, the
    /// writer records the rotation (signed by the old key) after the reload's record and
    /// signs with the new one from then on.
    pub(crate) fn use_key(&self, key: Option<key::Signer>) {
        let (Some(inner), Some(key)) = (&self.inner, key) else {
            return;
        };
        // Taken by the writer after its next batch (the reload's own record).
        *crate::sync::lock(&inner.shared.next_key) = Some(key);
    }

    /// The quota refusals counted since the last call, as events.
    pub(crate) fn take_quota(shared: &Shared) -> Vec<Event> {
        let tally = std::mem::take(&mut *crate::sync::lock(&shared.quota));
        let window_secs = shared.settings.quota_interval.as_secs();
        let mut events: Vec<Event> = tally
            .by_aic
            .into_iter()
            .map(|(aic, (count, ip, reason))| Event::Quota {
                aic: Some(aic),
                ip: Some(ip),
                reason,
                count,
                window_secs,
            })
            .collect();
        if tally.others > 0 {
            events.push(Event::Quota {
                aic: None,
                ip: None,
                reason: "aic_rate",
                count: tally.others,
                window_secs,
            });
        }
        // Refusals past the repeat limit: one record per kind and caller, the last one's
        // details with their count (the callers past the bound: one, actor `*`).
        let repeats = std::mem::take(&mut *crate::sync::lock(&shared.repeats));
        let past = (repeats.by_caller.into_values()).map(|(_, n, last)| (n, last, false));
        let others = (repeats.others.0, repeats.others.1, true);
        for (count, last, any) in past.chain(std::iter::once(others)) {
            if let (true, Some(mut r)) = (count > 0, last) {
                r.repeated = Some((count, window_secs, any));
                events.push(Event::Refused(r));
            }
        }
        events
    }
}

#[cfg(test)]
mod tests;
