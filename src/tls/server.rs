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

use anyhow::Context;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error as TlsError, ServerConfig,
    SignatureScheme,
};

use super::live::LiveTrust;
use super::pem;
use crate::config::{ClientAuthMode, ListenerConfig};
use crate::identity::AicRules;
use crate::revocation::staple::Stapler;

/// What the accept loop needs: the rustls config, and the trust settings every
/// connection's verdict is judged against (after the handshake, and again whenever they
/// change: see `identity::verdict`).
#[derive(Clone)]
pub struct ServerTls {
    /// The rustls server configuration.
    pub config: Arc<ServerConfig>,
    /// The chain verifier, its generation and the CRLs' expiry: the current generation
    /// (replaced when fetched CRLs change, see `tls::live`).
    pub trust: Arc<LiveTrust>,
    /// The listener's certificate, with its OCSP staple (`revocation::staple`).
    pub stapler: Arc<Stapler>,
    /// The handshake's own chain verification stands for the connection's first verdict
    /// (full handshakes only): `strict` mode, without fetched CRLs (with them, a new
    /// generation may come between the handshake and the verdict, so the verdict is
    /// judged under the generation it is recorded with).
    pub strict: bool,
}

pub(crate) use super::provider;

/// The WebPKI client verifier for the configured CAs and CRL files (no fetched CRLs).
pub(crate) fn client_chain_verifier(
    l: &ListenerConfig,
) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let trust = LiveTrust::new(l, Arc::new(AicRules::default()), None)?;
    let verifier = trust.load().verifier.clone();
    Ok(verifier)
}

/// Builds the listener's TLS settings, with the CRLs fetched so far (those `previous`,
/// the settings of the config load before, holds); `fetching`: `[revocation]` fetches
/// CRLs.
pub(crate) fn build(
    l: &ListenerConfig,
    rules: AicRules,
    previous: Option<&ServerTls>,
    fetching: bool,
    stapling: bool,
) -> anyhow::Result<ServerTls> {
    let strict = l.client_auth == ClientAuthMode::Strict;
    let rules = Arc::new(rules);
    let trust = Arc::new(LiveTrust::new(
        l,
        rules.clone(),
        previous.map(|p| &*p.trust),
    )?);
    let verifier = Arc::new(GatewayClientVerifier {
        inner: trust.load().verifier.clone(),
        live: trust.clone(),
        strict_rules: strict.then(|| rules.clone()),
    });
    let certs = pem::load_certs(&l.cert).context("listener.cert")?;
    let key = pem::load_key(&l.key).context("listener.key")?;
    let key = rustls::sign::CertifiedKey::from_der(
        certs,
        key,
        &super::provider::with_groups(&l.tls_groups),
    )
    .context("listener.cert/listener.key: the key does not match the certificate")?;
    let stapler = Arc::new(Stapler::new(
        key,
        trust.ca_certs(),
        stapling,
        previous.map(|p| &*p.stapler),
    ));
    let mut config =
        ServerConfig::builder_with_provider(super::provider::with_groups(&l.tls_groups))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .context("TLS 1.3")?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(stapler.clone());
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
        stapler,
        strict: strict && !fetching,
    })
}

/// The listener's client-certificate verifier, in one of the two modes.
#[derive(Debug)]
pub(crate) struct GatewayClientVerifier {
    /// The first generation's verifier: the CA names and the handshake signatures (the
    /// same in every generation of a config load).
    inner: Arc<dyn ClientCertVerifier>,
    /// The current generation: chains are verified with its CRLs.
    live: Arc<LiveTrust>,
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
            .live
            .load()
            .verifier
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
