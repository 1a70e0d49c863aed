//! The task that keeps the listener certificate's OCSP staple fresh (see
//! `revocation::staple`): it asks the responder the current snapshot's [`Stapler`]
//! names, when due, and hands the result to it. A reload with a new certificate is asked
//! about at once (unless the staple carried over still stands).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;

use super::ocsp::{query, Failure};
use super::staple::Stapler;
use crate::gateway::Gateway;

/// Keeps the current listener certificate's staple fresh until aborted (see the module
/// documentation).
pub async fn run(gateway: Arc<Gateway>) {
    let mut client: Option<(
        Option<std::path::PathBuf>,
        super::fetch::HttpClient<Full<Bytes>>,
    )> = None;
    // The stapler the next query is for, and when it is due.
    let mut last: std::sync::Weak<Stapler> = std::sync::Weak::new();
    let mut due = tokio::time::Instant::now();
    loop {
        let snap = gateway.snapshot();
        let stapler = snap.tls.stapler.clone();
        let settings = snap.config.revocation.clone();
        let metrics = snap.metrics.clone();
        drop(snap);
        if !std::ptr::eq(last.as_ptr(), Arc::as_ptr(&stapler)) {
            // A new config: ask now unless the staple carried over stands.
            let now = crate::identity::verdict::unix_now();
            if stapler.until().is_none_or(|u| u <= now) {
                due = tokio::time::Instant::now();
            }
            last = Arc::downgrade(&stapler);
        }
        let now = tokio::time::Instant::now();
        if let (Some(subject), true) = (&stapler.subject, due <= now) {
            if client.as_ref().is_none_or(|(ca, _)| *ca != settings.tls_ca) {
                client = super::fetch::client(&settings)
                    .map(|c| (settings.tls_ca.clone(), c))
                    .map_err(|e| tracing::error!(error = %format!("{e:#}"), "ocsp stapling: no HTTP client"))
                    .ok();
            }
            let result = match &client {
                Some((_, c)) => query::ask_raw(c, subject, &settings)
                    .await
                    .map_err(Failure::label),
                None => Err(Failure::Unreachable.label()),
            };
            let wait = stapler.settle(
                result,
                crate::identity::verdict::unix_now(),
                &settings,
                &metrics,
            );
            due = tokio::time::Instant::now() + wait;
        }
        // Wake for the next query, or to look for a reload.
        let look = tokio::time::Instant::now() + settings.ocsp.retry_interval;
        drop(stapler);
        tokio::time::sleep_until(due.max(tokio::time::Instant::now()).min(look)).await;
    }
}
