//! The series a finished request counts into, remembered per thread.
//!
//! `Family` finds a series by hashing its labels (SipHash, the Partner's name among them)
//! under a lock; the three a request ends with (`requests_total`,
//! `request_duration_seconds`, `upstream_duration_seconds`) cost 1,300 instructions per
//! request that way, 2% of an HTTP/1.1 request (callgrind, `benches/README.md`,
//! "Instructions per request"). Each thread remembers the series it counted into by the
//! labels' identities instead: the Partner label's address (one `Arc<str>` per Partner
//! for as long as its series last, see `super::partners`), the method's (a static
//! string), the status and the code.
//!
//! What is remembered belongs to one generation of the Partners' series
//! ([`super::partners::PartnerSeries::generation`]): a reload that rebinds them, and may
//! drop some, starts a new one, and a thread forgets all it remembered at its next
//! request. A series is made, or found, only through `PartnerSeries::with`, as before:
//! what is remembered is what `with` handed out.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use super::{Metrics, RequestLabels, RouteLabels};

/// The most label sets a thread remembers; past it, it starts again (the labels are
/// bounded, by `admin.partner_metrics`, the methods, statuses and codes, but a fleet
/// with series for every Partner could have many).
const MAX_REMEMBERED: usize = 4096;

/// A request's labels by identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    partner: usize,
    /// Address and length: two static strings may start at one address.
    method: (usize, usize),
    status: u16,
    code: i32,
}

/// A label set's series, as `PartnerSeries::with` handed them out.
struct Series {
    requests: Counter,
    seconds: Histogram,
    /// Made only once a request with these labels reached its Partner.
    upstream: Option<Histogram>,
}

#[derive(Default)]
struct Remembered {
    generation: u64,
    series: HashMap<Key, Series, ahash::RandomState>,
}

thread_local! {
    static REMEMBERED: RefCell<Remembered> = RefCell::new(Remembered::default());
}

/// What a finished request counts.
pub(crate) struct Finished<'a> {
    pub(crate) partner: &'a Arc<str>,
    pub(crate) method: &'static str,
    pub(crate) status: u16,
    pub(crate) code: i32,
    pub(crate) total: f64,
    /// The Partner's time, when the request reached one.
    pub(crate) upstream: Option<f64>,
}

impl Metrics {
    /// Counts a finished request in its series (`requests_total`,
    /// `request_duration_seconds` and, when it reached a Partner,
    /// `upstream_duration_seconds`), found as the module documentation says.
    pub(crate) fn count_request(&self, r: &Finished<'_>) {
        let key = Key {
            partner: Arc::as_ptr(r.partner).cast::<u8>() as usize,
            method: (r.method.as_ptr() as usize, r.method.len()),
            status: r.status,
            code: r.code,
        };
        let generation = self.partners.generation();
        let counted = REMEMBERED
            .try_with(|m| {
                let mut m = m.borrow_mut();
                if m.generation != generation {
                    m.series.clear();
                    m.generation = generation;
                }
                let Some(s) = m.series.get_mut(&key) else {
                    return false;
                };
                s.requests.inc();
                s.seconds.observe(r.total);
                if let Some(up) = r.upstream {
                    match &s.upstream {
                        Some(h) => h.observe(up),
                        None => s.upstream = self.upstream_series(r, up),
                    }
                }
                true
            })
            .unwrap_or(false);
        if !counted {
            self.count_and_remember(r, key, generation);
        }
    }

    /// A label set this thread has not counted into (this generation): counted through
    /// `PartnerSeries::with`, and its series remembered when `with` handed them all out.
    fn count_and_remember(&self, r: &Finished<'_>, key: Key, generation: u64) {
        let request = RequestLabels {
            partner: r.partner.clone(),
            method: r.method,
            status: r.status,
            code: r.code,
        };
        let mut requests = None;
        self.partner_series(&self.requests, r.partner, &request, |c| {
            c.inc();
            requests = Some(c.clone());
        });
        let route = RouteLabels {
            partner: r.partner.clone(),
            method: r.method,
        };
        let mut seconds = None;
        self.partner_series(&self.request_seconds, r.partner, &route, |h| {
            h.observe(r.total);
            seconds = Some(h.clone());
        });
        let upstream = r.upstream.and_then(|up| self.upstream_series(r, up));
        let (Some(requests), Some(seconds)) = (requests, seconds) else {
            return; // the Partner's series were dropped meanwhile: nothing to remember
        };
        let _ = REMEMBERED.try_with(|m| {
            let mut m = m.borrow_mut();
            if m.generation != generation {
                return;
            }
            if m.series.len() >= MAX_REMEMBERED {
                m.series.clear();
            }
            m.series.insert(
                key,
                Series {
                    requests,
                    seconds,
                    upstream,
                },
            );
        });
    }

    /// Observes the Partner's time in its series, and hands that series out.
    fn upstream_series(&self, r: &Finished<'_>, up: f64) -> Option<Histogram> {
        let route = RouteLabels {
            partner: r.partner.clone(),
            method: r.method,
        };
        let mut series = None;
        self.partner_series(&self.upstream_seconds, r.partner, &route, |h| {
            h.observe(up);
            series = Some(h.clone());
        });
        series
    }
}

/// How many label sets this thread remembers (tests).
#[cfg(test)]
fn remembered() -> usize {
    REMEMBERED.with(|m| m.borrow().series.len())
}

#[cfg(test)]
mod tests {
    use super::super::PartnerMetrics;
    use super::*;

    fn finished<'a>(partner: &'a Arc<str>, upstream: Option<f64>) -> Finished<'a> {
        Finished {
            partner,
            method: "rpc",
            status: 200,
            code: 0,
            total: 0.002,
            upstream,
        }
    }

    fn count_of(m: &Metrics, partner: &str) -> Option<u64> {
        let labels = RequestLabels {
            partner: partner.into(),
            method: "rpc",
            status: 200,
            code: 0,
        };
        m.requests.get(&labels).map(|c| c.get())
    }

    fn upstream_made(m: &Metrics, partner: &str) -> bool {
        let route = RouteLabels {
            partner: partner.into(),
            method: "rpc",
        };
        m.upstream_seconds.get(&route).is_some()
    }

    /// Requests counted from the remembered series land where the families find them,
    /// and the Partner's time gets its series with the first request that has one.
    #[test]
    fn remembered_series_are_the_families_own() {
        let m = Metrics::new();
        m.rebind_partners(&PartnerMetrics::All, ["p"].into_iter());
        let p = m.partner_label(Some("p"));
        m.count_request(&finished(&p, None));
        assert!(!upstream_made(&m, "p"), "no Partner time yet");
        for _ in 0..3 {
            m.count_request(&finished(&p, Some(0.001)));
        }
        assert_eq!(count_of(&m, "p"), Some(4));
        assert!(upstream_made(&m, "p"));
        let page = m.render(Default::default(), std::iter::empty());
        assert!(
            page.lines().any(|l| l.starts_with(
                "aipgw_upstream_duration_seconds_count{partner=\"p\",method=\"rpc\"} 3"
            )),
            "{page}"
        );
    }

    /// A reload that drops a Partner's series: a request still holding the old label
    /// neither counts into the dropped series nor makes it again, though this thread
    /// remembered it.
    #[test]
    fn a_dropped_partners_series_are_forgotten() {
        let m = Metrics::new();
        m.rebind_partners(&PartnerMetrics::All, ["p", "q"].into_iter());
        let p = m.partner_label(Some("p"));
        m.count_request(&finished(&p, Some(0.001)));
        assert_eq!(count_of(&m, "p"), Some(1));
        m.rebind_partners(&PartnerMetrics::All, ["q"].into_iter());
        assert_eq!(count_of(&m, "p"), None, "dropped by the reload");
        // The thread forgets what it remembered of the old binding at its next request:
        // a new label at the old one's address could not find the dropped series.
        let q = m.partner_label(Some("q"));
        m.count_request(&finished(&q, None));
        assert_eq!(remembered(), 1, "only q's series");
        m.count_request(&finished(&p, Some(0.001)));
        assert_eq!(count_of(&m, "p"), None, "not made again");
        // Counted again once it is back, in a series of its own from zero.
        m.rebind_partners(&PartnerMetrics::All, ["p", "q"].into_iter());
        let p = m.partner_label(Some("p"));
        m.count_request(&finished(&p, None));
        assert_eq!(count_of(&m, "p"), Some(1));
    }

    /// Two gateways' metrics in one process (tests, embedding) never share what a thread
    /// remembers.
    #[test]
    fn two_metrics_keep_their_own_series() {
        let (a, b) = (Metrics::new(), Metrics::new());
        a.rebind_partners(&PartnerMetrics::None, ["p"].into_iter());
        b.rebind_partners(&PartnerMetrics::None, ["p"].into_iter());
        let (la, lb) = (a.partner_label(Some("p")), b.partner_label(Some("p")));
        for _ in 0..2 {
            a.count_request(&finished(&la, None));
            b.count_request(&finished(&lb, None));
        }
        assert_eq!(count_of(&a, "other"), Some(2));
        assert_eq!(count_of(&b, "other"), Some(2));
    }
}
