//! `[audit]` as written: the signed, hash-chained audit log (`crate::audit`). Off unless
//! `file` is set.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// `[audit]`: `file` and the bounds are read at start; `key` and `kid` follow a reload
/// (the key rotation is itself a record, signed by the old key).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RawAudit {
    /// The audit log (JSON lines of AMP `audit` records); unset (the default): no audit
    /// log.
    pub file: Option<PathBuf>,
    /// The signing key: an Ed25519 private key in a PKCS#8 PEM file (`openssl genpkey
    /// -algorithm ed25519`); required with `file`.
    pub key: Option<PathBuf>,
    /// `integrity.kid` of the records (default: `ed25519:` and the first 16 hex digits of
    /// the SHA-256 of the raw public key).
    pub kid: Option<String>,
    /// The gateway's AIC, the records' `aic` (default: the AIC of the listener's
    /// certificate; a certificate without one makes this required).
    pub aic: Option<String>,
    /// Records waiting for the writer, at most (default 4096); past that a record is
    /// lost, counted in `aipgw_audit_dropped_total` and in a gap record in the chain.
    pub queue: usize,
    /// The file is rotated before it would grow past this (default 100 MiB).
    pub max_file_bytes: u64,
    /// Rotated files kept (`FILE.1` .. `FILE.n`; default 10); the oldest beyond is
    /// removed.
    pub max_files: usize,
    /// Quota refusals are written as one record per AIC per this interval, with their
    /// count (default 10 s).
    #[serde(with = "humantime_serde")]
    pub quota_interval: Duration,
    /// AICs counted apart per interval, at most (default 1000); refusals of AICs beyond
    /// are counted together in one record. Also the bound of callers counted apart for
    /// `repeat_limit`.
    pub quota_max_aics: usize,
    /// Other refusals (identity, block list, access, ownership) of one kind from one caller
    /// (its AIC, or its address without one) written one record each per
    /// `quota_interval`, at most (default 10); the rest are counted and written as one
    /// record with their count at the interval's end, so a flood (no certificate needed
    /// for an identity refusal) cannot rotate the trail away.
    pub repeat_limit: u64,
}

impl Default for RawAudit {
    fn default() -> Self {
        RawAudit {
            file: None,
            key: None,
            kid: None,
            aic: None,
            queue: 4096,
            max_file_bytes: 100 << 20,
            max_files: 10,
            quota_interval: Duration::from_secs(10),
            quota_max_aics: 1000,
            repeat_limit: 10,
        }
    }
}

impl RawAudit {
    /// Validated (`None` when `file` is unset); `cert` is the listener's certificate,
    /// whose AIC is the default `aic`.
    pub(crate) fn settings(
        &self,
        cert: &std::path::Path,
        suffix: &str,
    ) -> anyhow::Result<Option<crate::audit::AuditSettings>> {
        let Some(file) = self.file.clone() else {
            return Ok(None);
        };
        let key = self
            .key
            .clone()
            .ok_or_else(|| anyhow::anyhow!("audit.key: required with audit.file"))?;
        if self.queue == 0 || self.max_files == 0 || self.quota_max_aics == 0 {
            anyhow::bail!(
                "audit.queue, audit.max_files and audit.quota_max_aics: must be at least 1"
            );
        }
        if self.max_file_bytes < 4096 {
            anyhow::bail!("audit.max_file_bytes: must be at least 4096");
        }
        if self.quota_interval.is_zero() {
            anyhow::bail!("audit.quota_interval: must be greater than zero");
        }
        let aic = match &self.aic {
            Some(a) => a.clone(),
            None => listener_aic(cert, suffix).map_err(|e| {
                anyhow::anyhow!(
                    "audit.aic: not set, and the listener's certificate carries no AIC to take ({e})"
                )
            })?,
        };
        Ok(Some(crate::audit::AuditSettings {
            file,
            key,
            kid: self.kid.clone(),
            aic,
            queue: self.queue,
            max_file_bytes: self.max_file_bytes,
            max_files: self.max_files,
            quota_interval: self.quota_interval,
            quota_max_aics: self.quota_max_aics,
            repeat_limit: self.repeat_limit,
        }))
    }
}

/// The AIC of the listener's certificate.
pub(super) fn listener_aic(cert: &std::path::Path, suffix: &str) -> anyhow::Result<String> {
    let certs = crate::tls::pem::load_certs(cert)?;
    let first = certs
        .first()
        .ok_or_else(|| anyhow::anyhow!("no certificate"))?;
    let aic = crate::identity::cert::aic_from_certificate(first, suffix)
        .map_err(|e| anyhow::anyhow!("{}", e.reason()))?;
    Ok(aic.as_str().to_owned())
}
