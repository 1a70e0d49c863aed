//! The audit log's series (`crate::audit`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Records written, lost to a full queue, and failed writes.
#[derive(Default)]
pub(crate) struct AuditSeries {
    /// Records appended to the audit file.
    pub(crate) records: Counter,
    /// Records lost: the queue was full (each loss is also a gap record in the chain).
    pub(crate) dropped: Counter,
    /// Records or flushes the file refused (disk full, permissions).
    pub(crate) write_errors: Counter,
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
    }
}
