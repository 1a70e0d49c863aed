//! The audit log's series (`crate::audit`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Records written, lost to a full queue, failed writes, and a wait for the file.
#[derive(Default)]
pub(crate) struct AuditSeries {
    /// Records appended to the audit file.
    pub(crate) records: Counter,
    /// Records lost: the queue was full (each loss is also a gap record in the chain).
    pub(crate) dropped: Counter,
    /// Records or flushes the file refused (disk full, permissions).
    pub(crate) write_errors: Counter,
    /// 1 while the audit file is held by another process (see `audit::file`).
    pub(crate) waiting: Gauge,
}

impl AuditSeries {
    /// Registers the series.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "audit_records",
            "Audit records appended to the audit file",
            self.records.clone(),
        );
        r.register(
            "audit_dropped",
            "Audit records lost because the audit queue was full (a gap record in the chain says how many)",
            self.dropped.clone(),
        );
        r.register(
            "audit_write_errors",
            "Audit records or flushes the audit file refused",
            self.write_errors.clone(),
        );
        r.register(
            "audit_waiting",
            "1 while the audit file is held by another process (a take-over's old one): records queue until it lets go",
            self.waiting.clone(),
        );
    }
}
