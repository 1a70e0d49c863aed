//! The listener's rustls configuration: TLS 1.3 only, ALPN h2 and http/1.1, and client
//! certificates verified against the configured CAs and CRLs.
//!
//! Two modes (`listener.client_auth`):
//! - `strict`: [`GatewayClientVerifier`] fails the handshake on a missing or bad
//!   certificate, including one that carries no valid AIC.
//! - `jsonrpc`: [`GatewayClientVerifier`] lets every handshake complete, but still checks the
//!   CertificateVerify signature (the client proves it holds the key); the chain is then
//!   verified once per connection by `identity::authenticate` with the very same
//!   WebPKI verifier, so both modes are equally strict. The verdict becomes a JSON-RPC
//!   error on each request instead of a handshake alert the Leader cannot read.

use std::sync::Arc;

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error as TlsError, RootCertStore,
    ServerConfig, SignatureScheme,
};

use super::pem;
use crate::config::{ClientAuthMode, ListenerConfig};
use crate::identity::AicRules;
use crate::identity::Trust;

/// What the accept loop needs: the rustls config, and the trust settings every
/// connection's verdict is judged against (after the handshake, and again whenever they
/// change: see `identity::verdict`).
#[derive(Clone)]
pub struct ServerTls {
    /// The rustls server configuration.
    pub config: Arc<ServerConfig>,
    /// The chain verifier, its generation and the CRLs' expiry.
    pub trust: Trust,
    /// `strict` mode: the handshake itself verified the chain (full handshakes only).
    pub strict: bool,
}

/// Each build of the listener's TLS settings is a new trust generation.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The crypto provider used everywhere (ring).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The WebPKI client verifier for the configured CAs and CRLs.
pub(crate) fn client_chain_verifier(
    l: &ListenerConfig,
) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = RootCertStore::empty();
    for path in &l.client_ca {
        for cert in pem::load_certs(path)? {
            roots
                .add(cert)
                .with_context(|| format!("{}: not a usable CA certificate", path.display()))?;
        }
    }
    let crls = load_crls(l)?;
    let mut builder =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).with_crls(crls);
    if !l.allow_expired_crl {
        builder = builder.enforce_revocation_expiration();
    }
    if l.allow_unknown_revocation_status {
        builder = builder.allow_unknown_revocation_status();
    }
    builder
        .build()
        .context("listener: cannot build the client verifier")
}

fn load_crls(
    l: &ListenerConfig,
) -> anyhow::Result<Vec<rustls::pki_types::CertificateRevocationListDer<'static>>> {
    let mut crls = Vec::new();
    for path in &l.crl {
        crls.extend(pem::load_crls(path)?);
    }
    Ok(crls)
}

/// The earliest `nextUpdate` of the configured CRLs (Unix seconds), when expired CRLs are
/// refused: a verdict judged before then must be judged again from then on.
fn crl_next_update(l: &ListenerConfig) -> anyhow::Result<Option<u64>> {
    use x509_parser::prelude::{CertificateRevocationList, FromDer};
    if l.allow_expired_crl {
        return Ok(None);
    }
    let mut earliest: Option<u64> = None;
    for der in load_crls(l)? {
        if let Ok((_, crl)) = CertificateRevocationList::from_der(&der) {
            if let Some(next) = crl.next_update() {
                let t = u64::try_from(next.timestamp()).unwrap_or(0);
                earliest = Some(earliest.map_or(t, |e| e.min(t)));
            }
        }
    }
    Ok(earliest)
}

/// Builds the listener's TLS settings.
pub(crate) fn build(l: &ListenerConfig, rules: AicRules) -> anyhow::Result<ServerTls> {
    let chain = client_chain_verifier(l)?;
    let strict = l.client_auth == ClientAuthMode::Strict;
    let rules = Arc::new(rules);
    let verifier = Arc::new(GatewayClientVerifier {
        inner: chain.clone(),
        strict_rules: strict.then(|| rules.clone()),
    });
    let trust = Trust {
        verifier: chain,
        generation: GENERATION.fetch_add(1, Ordering::Relaxed),
        crl_next_update: crl_next_update(l)?,
        aic_rules: rules,
        verdicts: Arc::new(crate::identity::Verdicts::new(l.verdict_cache)),
    };
    let certs = pem::load_certs(&l.cert).context("listener.cert")?;
    let key = pem::load_key(&l.key).context("listener.key")?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .context("listener.cert/listener.key: the key does not match the certificate")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    if l.tls_session_cache == 0 {
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    } else {
        config.session_storage = rustls::server::ServerSessionMemoryCache::new(l.tls_session_cache);
    }
    Ok(ServerTls {
        config: Arc::new(config),
        trust,
        strict,
    })
}

/// The listener's client-certificate verifier, in one of the two modes.
#[derive(Debug)]
pub(crate) struct GatewayClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    /// `Some(rules)` in strict mode: chain and AIC are checked during the handshake.
    /// `None` in jsonrpc mode: any chain is accepted here and verified right after the
    /// handshake by `identity::authenticate`, with `inner`.
    strict_rules: Option<Arc<AicRules>>,
}

impl ClientCertVerifier for GatewayClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        self.strict_rules.is_some()
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, TlsError> {
        let Some(rules) = &self.strict_rules else {
            return Ok(ClientCertVerified::assertion()); // deferred, see above
        };
        let ok = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        rules.certificate_aic(end_entity).map_err(|_| {
            TlsError::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
        })?;
        Ok(ok)
    }
    // The handshake signature proves the client holds the certificate's key; it is
    // checked in both modes.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, TlsError> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, TlsError> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
