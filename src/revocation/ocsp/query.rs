//! The background task that asks OCSP responders ([`run`], owned by
//! `background::Background`): it takes the queries the request path queued, asks each
//! (an HTTP POST of the DER request, RFC 6960 appendix A.1) within `ocsp_timeout` and
//! `ocsp_max_response_bytes`, judges the answer (`super::wire`) and settles the entry.
//! Queries run side by side, at most `ocsp_max_queries` of them (the request path counts
//! them before it queues one). Nothing here runs on a worker thread.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use super::wire::{Answer, Subject};
use super::{Failure, Ocsp};
use crate::revocation::fetch::HttpClient;
use crate::revocation::settings::RevocationSettings;

/// Asks the responders of the queued queries until aborted.
pub async fn run(ocsp: Arc<Ocsp>) {
    let Some(mut queue) = ocsp.take_queue() else {
        return;
    };
    // The client, and the CA bundle it was made for (a reload may name another).
    let mut client: Option<(Option<std::path::PathBuf>, HttpClient<Full<Bytes>>)> = None;
    let mut running = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            Some(subject) = queue.recv() => {
                let settings = ocsp.settings();
                if client.as_ref().is_none_or(|(ca, _)| *ca != settings.tls_ca) {
                    client = match crate::revocation::fetch::client(&settings) {
                        Ok(c) => Some((settings.tls_ca.clone(), c)),
                        Err(e) => {
                            tracing::error!(error = %format!("{e:#}"), "ocsp: no HTTP client");
                            None
                        }
                    };
                }
                let Some((_, c)) = &client else {
                    ocsp.settle(&subject, Err(Failure::Unreachable), unix_now());
                    continue;
                };
                let c = c.clone();
                running.spawn(async move {
                    let result = ask(&c, &subject, &settings).await;
                    (subject, result)
                });
            }
            Some(done) = running.join_next() => {
                if let Ok((subject, result)) = done {
                    ocsp.settle(&subject, result, unix_now());
                }
            }
        }
    }
}

fn unix_now() -> u64 {
    crate::identity::verdict::unix_now()
}

/// One query, judged.
async fn ask(
    client: &HttpClient<Full<Bytes>>,
    subject: &Subject,
    settings: &RevocationSettings,
) -> Result<Answer, Failure> {
    ask_raw(client, subject, settings).await.map(|(a, _)| a)
}

/// One query, judged, with the response's DER (what a staple carries).
pub(crate) async fn ask_raw(
    client: &HttpClient<Full<Bytes>>,
    subject: &Subject,
    settings: &RevocationSettings,
) -> Result<(Answer, Bytes), Failure> {
    let o = &settings.ocsp;
    let body = tokio::time::timeout(o.timeout, post(client, subject, o.max_response_bytes))
        .await
        .map_err(|_| Failure::Timeout)??;
    let secs = |d: std::time::Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let answer = subject
        .judge(
            &body,
            i64::try_from(unix_now()).unwrap_or(i64::MAX),
            secs(o.clock_skew),
            secs(o.max_age),
        )
        .map_err(Failure::Bad)?;
    Ok((answer, body))
}

async fn post(
    client: &HttpClient<Full<Bytes>>,
    subject: &Subject,
    max: usize,
) -> Result<Bytes, Failure> {
    let req = Request::post(&subject.url)
        .header(header::CONTENT_TYPE, "application/ocsp-request")
        .header(header::ACCEPT, "application/ocsp-response")
        .body(Full::new(Bytes::from(subject.request.clone())))
        .map_err(|_| Failure::Unreachable)?;
    let resp = client
        .request(req)
        .await
        .map_err(|_| Failure::Unreachable)?;
    if resp.status() != StatusCode::OK {
        return Err(Failure::HttpStatus);
    }
    let declared = crate::body::declared_length(resp.headers());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(Failure::TooLarge);
    }
    match Limited::new(resp.into_body(), max).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Failure::TooLarge),
        Err(_) => Err(Failure::Unreachable),
    }
}
