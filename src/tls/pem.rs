//! Loading certificates, keys and CRLs from files (rustls-pki-types' `PemObject`).

use std::path::Path;

use anyhow::{bail, Context};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: malformed PEM", path.display()))?;
    if certs.is_empty() {
        bail!("{}: no certificate found", path.display());
    }
    Ok(certs)
}

/// The private key in a PEM file.
pub fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("{}: no usable private key", path.display()))
}

/// The CRLs in a file: PEM (one or more) or a single DER CRL.
pub(crate) fn load_crls(path: &Path) -> anyhow::Result<Vec<CertificateRevocationListDer<'static>>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.starts_with(b"-----") || bytes.iter().take(64).all(|b| b.is_ascii()) {
        let crls = CertificateRevocationListDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("{}: malformed PEM", path.display()))?;
        if crls.is_empty() {
            bail!("{}: no CRL found", path.display());
        }
        Ok(crls)
    } else {
        Ok(vec![CertificateRevocationListDer::from(bytes)])
    }
}
