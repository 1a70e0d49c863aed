//! Development certificates (rcgen): a CA, the gateway's server and client certificates,
//! Leader certificates in both reference AIC profiles, and a Partner server certificate.
//!
//! Used by `aipgw dev-certs` (the files in `certs/`) and by the tests, which make fresh
//! ones at run time. Never for production: keys are written unencrypted.

use std::net::IpAddr;
use std::path::Path;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
    RevokedCertParams, SanType, SerialNumber,
};
use ring::rand::{SecureRandom, SystemRandom};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::{Duration, OffsetDateTime};

/// The Leader AIC of the v1-profile development certificate.
pub const DEV_LEADER_V1_AIC: &str = "10001000011K912345E789ABCDEF2353";
/// The Leader AIC of the v2.1-profile development certificate.
pub const DEV_LEADER_V2_AIC: &str = "10001000011K94ZH3VDXLP4S5EB63614";
/// The demo Partner's AIC.
pub const DEV_PARTNER_AIC: &str = "10001000011K96TFZ2B9H9I1J85AUF77";
/// The gateway's own AIC (its client certificate towards Partners).
pub const DEV_GATEWAY_AIC: &str = "10001000011K9DX1GW14X1VSP2QQNG44";
/// A v2.1-profile Leader's dotted AIC: registrar `1`, whose salt is
/// [`DEV_REGISTRAR_SALT_HEX`] (the AIP v2 facts' test vector).
pub const DEV_LEADER_DOTTED_AIC: &str = "1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU4";
/// The development registrar `1`'s salt, hex (configured in `config/aipgw.toml`).
pub const DEV_REGISTRAR_SALT_HEX: &str = "1234";

/// What to put in a certificate.
#[derive(Debug, Clone)]
pub struct CertSpec {
    /// Subject CN.
    pub common_name: String,
    /// SAN DNS names.
    pub dns: Vec<String>,
    /// SAN IP addresses.
    pub ips: Vec<IpAddr>,
    /// SAN URIs.
    pub uris: Vec<String>,
    /// Extended key usages.
    pub client_auth: bool,
    /// Extended key usages.
    pub server_auth: bool,
    /// Validity start.
    pub not_before: OffsetDateTime,
    /// Validity end.
    pub not_after: OffsetDateTime,
    /// Serial number (random when `None`).
    pub serial: Option<u64>,
    /// CRL Distribution Point URIs (none by default).
    pub crl_distribution_points: Vec<String>,
    /// Authority Information Access OCSP responder URIs (none by default).
    pub ocsp_urls: Vec<String>,
    /// The `id-kp-OCSPSigning` extended key usage (a delegated OCSP responder).
    pub ocsp_signing: bool,
}

impl CertSpec {
    fn base(cn: &str) -> CertSpec {
        let now = OffsetDateTime::now_utc();
        CertSpec {
            common_name: cn.to_owned(),
            dns: vec![],
            ips: vec![],
            uris: vec![],
            client_auth: false,
            server_auth: false,
            not_before: now - Duration::days(1),
            not_after: now + Duration::days(365 * 10),
            serial: None,
            crl_distribution_points: vec![],
            ocsp_urls: vec![],
            ocsp_signing: false,
        }
    }

    /// A Leader in the v1 CA profile: `CN=<AIC>.<suffix>`, `DNS:<AIC>.<suffix>`,
    /// `URI:agent://<AIC>`, clientAuth + serverAuth.
    pub fn leader_v1(aic: &str, suffix: &str) -> CertSpec {
        let name = format!("{aic}.{suffix}");
        CertSpec {
            dns: vec![name.clone()],
            uris: vec![format!("agent://{aic}")],
            client_auth: true,
            server_auth: true,
            ..CertSpec::base(&name)
        }
    }

    /// A Leader in the v2.1 CA profile: `CN=<AIC>`, `URI:acps://<AIC>`, clientAuth.
    pub fn leader_v2(aic: &str) -> CertSpec {
        CertSpec {
            uris: vec![format!("acps://{aic}")],
            client_auth: true,
            ..CertSpec::base(aic)
        }
    }

    /// A v2.1-profile agent: `CN=<AIC>`, `URI:acps://<AIC>`, and the extra host names
    /// and addresses its description publishes (they claim no identity).
    pub fn leader_v21(aic: &str, hosts: &[&str]) -> CertSpec {
        let mut spec = CertSpec::leader_v2(aic);
        for h in hosts {
            match h.parse::<IpAddr>() {
                Ok(ip) => spec.ips.push(ip),
                Err(_) => spec.dns.push((*h).to_owned()),
            }
        }
        spec
    }

    /// A TLS server for the given DNS names and IP addresses.
    pub fn server(names: &[&str]) -> CertSpec {
        let mut spec = CertSpec::base(names.first().copied().unwrap_or("server"));
        for n in names {
            match n.parse::<IpAddr>() {
                Ok(ip) => spec.ips.push(ip),
                Err(_) => spec.dns.push((*n).to_owned()),
            }
        }
        spec.server_auth = true;
        spec
    }

    /// A Partner server in the v2.1 profile: CN and `URI:acps://<AIC>` plus host names.
    pub fn partner_server(aic: &str, names: &[&str]) -> CertSpec {
        let mut spec = CertSpec::server(names);
        spec.common_name = aic.to_owned();
        spec.uris.push(format!("acps://{aic}"));
        spec
    }
}

/// An issued certificate and its key.
pub struct Issued {
    /// DER certificate.
    pub cert_der: CertificateDer<'static>,
    /// PEM certificate.
    pub cert_pem: String,
    /// PEM PKCS#8 key.
    pub key_pem: String,
    /// The serial number.
    pub serial: u64,
}

impl Issued {
    /// The key as DER.
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        use rustls_pki_types::pem::PemObject;
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .unwrap_or_else(|_| PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(Vec::new())))
    }
}

/// The Authority Information Access extension naming `urls` as OCSP responders.
fn aia_ocsp(urls: &[String]) -> anyhow::Result<rcgen::CustomExtension> {
    use der::Encode;
    use x509_cert::ext::pkix::name::GeneralName;
    use x509_cert::ext::pkix::{AccessDescription, AuthorityInfoAccessSyntax};
    let ocsp = der::oid::ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.48.1");
    let mut descs = Vec::with_capacity(urls.len());
    for u in urls {
        descs.push(AccessDescription {
            access_method: ocsp,
            access_location: GeneralName::UniformResourceIdentifier(der::asn1::Ia5String::new(u)?),
        });
    }
    let content = AuthorityInfoAccessSyntax(descs).to_der()?;
    Ok(rcgen::CustomExtension::from_oid_content(
        &[1, 3, 6, 1, 5, 5, 7, 1, 1],
        content,
    ))
}

/// A certificate authority that issues development certificates and CRLs.
pub struct DevCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

fn random_serial() -> u64 {
    let mut b = [0u8; 8];
    let _ = SystemRandom::new().fill(&mut b);
    u64::from_be_bytes(b) >> 1 | 1
}

/// A CA certificate's parameters: ten years, certificate and CRL signing.
fn ca_params(name: &str, constraints: BasicConstraints) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(constraints);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::days(2);
    params.not_after = now + Duration::days(365 * 10);
    params.serial_number = Some(SerialNumber::from_slice(&random_serial().to_be_bytes()));
    params
}

impl DevCa {
    /// A new self-signed CA.
    pub fn new(name: &str) -> anyhow::Result<DevCa> {
        let params = ca_params(name, BasicConstraints::Unconstrained);
        let key = KeyPair::generate()?;
        Ok(DevCa {
            issuer: CertifiedIssuer::self_signed(params, key)?,
        })
    }

    /// An intermediate CA signed by this one (the v2.1 reference CA's shape: root ->
    /// intermediate -> leaf).
    pub fn intermediate(&self, name: &str) -> anyhow::Result<DevCa> {
        let mut params = ca_params(name, BasicConstraints::Constrained(0));
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        Ok(DevCa {
            issuer: CertifiedIssuer::signed_by(params, key, &self.issuer)?,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// The CA private key, PEM.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Issues a certificate.
    pub fn issue(&self, spec: &CertSpec) -> anyhow::Result<Issued> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, spec.common_name.as_str());
        for d in &spec.dns {
            params
                .subject_alt_names
                .push(SanType::DnsName(d.clone().try_into()?));
        }
        for ip in &spec.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        for u in &spec.uris {
            params
                .subject_alt_names
                .push(SanType::URI(u.clone().try_into()?));
        }
        if spec.client_auth {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        if spec.server_auth {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if spec.ocsp_signing {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::OcspSigning);
        }
        if !spec.ocsp_urls.is_empty() {
            params.custom_extensions.push(aia_ocsp(&spec.ocsp_urls)?);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = spec.not_before;
        params.not_after = spec.not_after;
        params.use_authority_key_identifier_extension = true;
        if !spec.crl_distribution_points.is_empty() {
            params.crl_distribution_points = vec![rcgen::CrlDistributionPoint {
                uris: spec.crl_distribution_points.clone(),
            }];
        }
        let serial = spec.serial.unwrap_or_else(random_serial);
        params.serial_number = Some(SerialNumber::from_slice(&serial.to_be_bytes()));
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_der: cert.der().clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            serial,
        })
    }

    /// A CRL revoking the given serials, valid from `this_update` to `next_update`.
    pub fn crl(
        &self,
        revoked: &[u64],
        this_update: OffsetDateTime,
        next_update: OffsetDateTime,
    ) -> anyhow::Result<String> {
        let params = CertificateRevocationListParams {
            this_update,
            next_update,
            crl_number: SerialNumber::from_slice(&[1]),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(&s.to_be_bytes()),
                    revocation_time: this_update,
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        Ok(params.signed_by(&self.issuer)?.pem()?)
    }
}

/// Writes the development certificate set into `dir` (see `certs/README.md`).
pub fn write_dev_certs(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let write = |name: &str, text: &str| -> anyhow::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    };
    let ca = DevCa::new("aipgw DEVELOPMENT CA - do not trust")?;
    write("ca.pem", &ca.cert_pem())?;
    write("ca.key", &ca.key_pem())?;
    let set = [
        (
            "gateway",
            CertSpec::server(&["localhost", "127.0.0.1", "::1"]),
        ),
        ("gateway-client", {
            let mut s = CertSpec::leader_v2(DEV_GATEWAY_AIC);
            s.common_name = DEV_GATEWAY_AIC.to_owned();
            s
        }),
        (
            "leader-v1",
            CertSpec::leader_v1(DEV_LEADER_V1_AIC, "acps.pub"),
        ),
        ("leader-v2", CertSpec::leader_v2(DEV_LEADER_V2_AIC)),
        (
            "partner",
            CertSpec::partner_server(DEV_PARTNER_AIC, &["localhost", "127.0.0.1"]),
        ),
    ];
    for (name, spec) in set {
        let issued = ca.issue(&spec)?;
        write(&format!("{name}.pem"), &issued.cert_pem)?;
        write(&format!("{name}.key"), &issued.key_pem)?;
    }
    // A second certificate of the v2 Leader, revoked by the CA's CRL.
    let revoked = ca.issue(&CertSpec::leader_v2(DEV_LEADER_V2_AIC))?;
    write("leader-revoked.pem", &revoked.cert_pem)?;
    write("leader-revoked.key", &revoked.key_pem)?;
    // A v2.1-profile Leader with a dotted AIC, issued through an intermediate; its PEM
    // holds the leaf and the intermediate, as the reference client sends them.
    let intermediate = ca.intermediate("aipgw DEVELOPMENT intermediate CA - do not trust")?;
    let issued = intermediate.issue(&CertSpec::leader_v21(
        DEV_LEADER_DOTTED_AIC,
        &["leader.example.test", "192.0.2.10"],
    ))?;
    write(
        "leader-dotted.pem",
        &format!("{}{}", issued.cert_pem, intermediate.cert_pem()),
    )?;
    write("leader-dotted.key", &issued.key_pem)?;
    // One CRL per issuer, both in crl.pem, valid as long as the certificates: with CRLs
    // configured, a certificate whose issuer has none is refused (unknown status).
    let now = OffsetDateTime::now_utc();
    let until = now + Duration::days(3650);
    write(
        "crl.pem",
        &format!(
            "{}{}",
            ca.crl(&[revoked.serial], now, until)?,
            intermediate.crl(&[], now, until)?
        ),
    )?;
    Ok(())
}
