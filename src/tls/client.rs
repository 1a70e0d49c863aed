//! TLS to Partners: the Partner's CA, the gateway's own client certificate (reference
//! Partners require mutual TLS), and, when the config names the Partner's AIC, a check
//! that the Partner's certificate carries exactly that AIC; then its revocation status
//! (the listener's CRLs and the OCSP answers cache: `revocation::partner`).

use std::sync::Arc;

use anyhow::Context;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error as TlsError, RootCertStore,
    SignatureScheme,
};

use super::pem;
use super::server::provider;
use crate::config::{Groups, PartnerTlsConfig};
use crate::identity::cert::aic_from_certificate;
use crate::identity::Aic;
use crate::revocation::ocsp::wire::Subject;
use crate::revocation::partner::{PartnerRevocation, PartnerRevoked};

/// The error a Partner certificate gets when its AIC is not the configured one.
#[derive(Debug, thiserror::Error)]
#[error("Partner certificate AIC is not {expected}")]
pub(crate) struct PartnerAicMismatch {
    /// The AIC the config requires.
    pub expected: Aic,
}

/// Builds the client config for one Partner; its certificate's revocation status is
/// judged with `revocation` (when given), and the same check is returned, to judge its
/// connections again later (`upstream::trust`); it offers `groups`.
pub(crate) fn partner_client_config(
    tls: &PartnerTlsConfig,
    expected_aic: Option<Aic>,
    aic_suffix: &str,
    revocation: Option<Arc<PartnerRevocation>>,
    groups: &Groups,
) -> anyhow::Result<(ClientConfig, Option<Arc<PartnerCheck>>)> {
    let mut roots = RootCertStore::empty();
    let cas = pem::load_certs(&tls.ca)?;
    for cert in &cas {
        roots
            .add(cert.clone())
            .with_context(|| format!("{}: not a usable CA certificate", tls.ca.display()))?;
    }
    let roots = Arc::new(roots);
    let inner = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .context("tls.ca")?;
    // Reference Partner certificates name only their AIC: with a pinned AIC and no
    // `server_name`, the AIC claim is the name that is verified, not the URL's host.
    let by_aic = expected_aic.is_some() && tls.server_name.is_none();
    let check = revocation.map(|r| {
        Arc::new(PartnerCheck(Revocation {
            check: r,
            cas,
            subject: std::sync::Mutex::new(None),
        }))
    });
    let checked = check.is_some();
    let verifier = Arc::new(PartnerVerifier {
        inner,
        roots: by_aic.then_some(roots),
        expected_aic,
        aic_suffix: aic_suffix.to_owned(),
        revocation: check.clone(),
    });
    let builder = ClientConfig::builder_with_provider(super::provider::with_groups(groups))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    // ALPN is set by the connector (hyper-rustls), from the HTTP versions enabled there.
    let mut config = match &tls.client_cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(pem::load_certs(cert)?, pem::load_key(key)?)
            .context("tls.cert/tls.key: the key does not match the certificate")?,
        None => builder.with_no_client_auth(),
    };
    if checked {
        // A resumed session skips the certificate check: every connection is judged.
        config.resumption = rustls::client::Resumption::disabled();
    }
    Ok((config, check))
}

/// A Partner's revocation check, as its handshakes make it, to judge a connection made
/// earlier again.
#[derive(Debug)]
pub(crate) struct PartnerCheck(Revocation);

impl PartnerCheck {
    /// Moves whenever a verdict may have changed (see `PartnerRevocation::epoch`).
    pub(crate) fn epoch(&self) -> u64 {
        self.0.check.epoch()
    }

    /// The verdict, now, on the certificate chain a Partner presented (end entity first).
    pub(crate) fn rejudge(&self, chain: &[CertificateDer<'_>]) -> Result<(), PartnerRevoked> {
        match chain.split_first() {
            Some((end_entity, intermediates)) => {
                self.0.judge(end_entity, intermediates, UnixTime::now())
            }
            None => Ok(()), // a TLS 1.3 server always presents one; nothing to judge
        }
    }
}

/// WebPKI server verification, then the Partner AIC pin.
#[derive(Debug)]
struct PartnerVerifier {
    inner: Arc<WebPkiServerVerifier>,
    /// `Some` when the chain is verified without the host name (the AIC pin names it).
    roots: Option<Arc<RootCertStore>>,
    expected_aic: Option<Aic>,
    aic_suffix: String,
    revocation: Option<Arc<PartnerCheck>>,
}

/// A Partner verifier's revocation check.
#[derive(Debug)]
struct Revocation {
    check: Arc<PartnerRevocation>,
    /// The Partner's `tls.ca` certificates (where its certificate's issuer is looked for).
    cas: Vec<CertificateDer<'static>>,
    /// The last end entity's OCSP subject (a Partner presents the same certificate on
    /// each connection: it is made once).
    subject: std::sync::Mutex<Option<Made>>,
}

/// An end entity's DER and the OCSP subject made for it.
type Made = (Vec<u8>, Option<Arc<Subject>>);

impl Revocation {
    /// The CRL and OCSP verdicts on the chain at `now`.
    fn judge(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<(), PartnerRevoked> {
        let Ok((_, leaf)) = x509_parser::parse_x509_certificate(end_entity) else {
            return Ok(()); // the chain verifier parsed it; unreachable
        };
        let secs = now.as_secs();
        self.check.offer(&leaf);
        self.check
            .crl_check(&leaf, i64::try_from(secs).unwrap_or(i64::MAX))?;
        if !self.check.ocsp_enabled() {
            return Ok(());
        }
        let subject = self.subject(end_entity, intermediates);
        self.check.ocsp_check(subject.as_ref(), secs)
    }

    fn subject(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Option<Arc<Subject>> {
        let mut held = crate::sync::lock(&self.subject);
        if let Some((der, subject)) = &*held {
            if der.as_slice() == end_entity.as_ref() {
                return subject.clone();
            }
        }
        let chain: Vec<CertificateDer<'_>> = std::iter::once(end_entity.clone())
            .chain(intermediates.iter().cloned())
            .collect();
        let subject = self.check.subject(&chain, &self.cas);
        *held = Some((end_entity.to_vec(), subject.clone()));
        subject
    }
}

impl ServerCertVerifier for PartnerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        let ok = match &self.roots {
            Some(roots) => {
                let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
                rustls::client::verify_server_cert_signed_by_trust_anchor(
                    &cert,
                    roots,
                    intermediates,
                    now,
                    provider().signature_verification_algorithms.all,
                )?;
                ServerCertVerified::assertion()
            }
            None => self.inner.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            )?,
        };
        if let Some(expected) = self.expected_aic {
            match aic_from_certificate(end_entity, &self.aic_suffix) {
                Ok(aic) if aic == expected => {}
                _ => {
                    return Err(TlsError::InvalidCertificate(CertificateError::Other(
                        rustls::OtherError(Arc::new(PartnerAicMismatch { expected })),
                    )))
                }
            }
        }
        if let Some(r) = &self.revocation {
            if let Err(why) = r.0.judge(end_entity, intermediates, now) {
                tracing::warn!(server = ?server_name, reason = %why, "Partner certificate refused");
                return Err(TlsError::InvalidCertificate(CertificateError::Other(
                    rustls::OtherError(Arc::new(why)),
                )));
            }
        }
        Ok(ok)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
