//! The webhook's own certificate authority, as pure functions of the time (self-signed mode):
//! make a CA, issue a serving certificate from a CA kept as PEM, and read back what a PEM
//! certificate says (expiry, names). ECDSA P-256 keys (rcgen with ring); times are Unix seconds.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use x509_parser::extensions::GeneralName;

use crate::tls::TlsError;

/// How far back `notBefore` is set, so that a clock a little behind the writer's (another node,
/// the API server) already accepts a fresh certificate. Renewal is timed from `notAfter` alone.
pub const BACKDATE_SECONDS: i64 = 3600;

/// A CA: its certificate, its private key (PEM) and its expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_after: i64,
}

/// A serving certificate and its key (PEM), its expiry and its subject alternative names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_after: i64,
    pub sans: Vec<String>,
}

/// What one PEM certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub not_before: i64,
    pub not_after: i64,
    pub is_ca: bool,
    /// DNS names and IP addresses, in the certificate's order.
    pub sans: Vec<String>,
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// rcgen's time for Unix seconds (clamped to the years X.509 can say).
fn at(unix: i64) -> time::OffsetDateTime {
    const YEAR_9999: i64 = 253_402_300_799;
    time::OffsetDateTime::from_unix_timestamp(unix.clamp(0, YEAR_9999))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn secs(d: Duration) -> i64 {
    d.as_secs().min(i64::MAX as u64 / 4) as i64
}

/// A new CA valid from `now` (backdated) for `validity`. Its common name carries `now`, so
/// successive CAs have distinct subjects.
pub fn new_authority(now: i64, validity: Duration) -> Result<Authority, TlsError> {
    let key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("primus-webhook CA {now}"));
    dn.push(DnType::OrganizationName, "Primus Projection");
    ca.distinguished_name = dn;
    let not_after = now.saturating_add(secs(validity));
    ca.not_before = at(now - BACKDATE_SECONDS);
    ca.not_after = at(not_after);
    let cert = ca.self_signed(&key)?;
    Ok(Authority {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after,
    })
}

/// A serving certificate for `sans` signed by `ca`, valid from `now` (backdated) for
/// `validity` but never past the CA's own expiry.
pub fn issue(
    ca: &Authority,
    sans: &[String],
    now: i64,
    validity: Duration,
) -> Result<Leaf, TlsError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(sans.to_vec())?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        sans.first().map(String::as_str).unwrap_or("primus-webhook"),
    );
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let not_after = now.saturating_add(secs(validity)).min(ca.not_after);
    params.not_before = at(now - BACKDATE_SECONDS);
    params.not_after = at(not_after);
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Leaf {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after,
        sans: sans.to_vec(),
    })
}

/// Read the first certificate of a PEM text.
pub fn inspect(pem: &str) -> Result<CertInfo, TlsError> {
    let bad = |why: String| TlsError::BadCertificate(why);
    let (_, block) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| bad(format!("PEM: {e}")))?;
    let cert = block.parse_x509().map_err(|e| bad(format!("X.509: {e}")))?;
    let validity = cert.validity();
    let is_ca = cert
        .basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|b| b.value.ca);
    let mut sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                GeneralName::DNSName(d) => sans.push(d.to_string()),
                GeneralName::IPAddress(ip) => match ip.len() {
                    4 => sans.push(
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*ip).unwrap_or_default())
                            .to_string(),
                    ),
                    16 => sans.push(
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*ip).unwrap_or_default())
                            .to_string(),
                    ),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        is_ca,
        sans,
    })
}

/// Whether the serving certificate `leaf_pem` is valid at `now` for its first name and chains
/// to one of the CA certificates `roots` (what the API server checks against the caBundle).
pub fn chains_to(leaf_pem: &str, roots: &[&str], now: i64) -> bool {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    let ders = |pem: &str| -> Vec<CertificateDer<'static>> {
        rustls_pemfile::certs(&mut pem.as_bytes())
            .filter_map(Result::ok)
            .collect()
    };
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        for c in ders(r) {
            let _ = store.add(c);
        }
    }
    let Ok(info) = inspect(leaf_pem) else {
        return false;
    };
    let (Some(leaf), Some(name)) = (ders(leaf_pem).into_iter().next(), info.sans.first()) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(name.clone()) else {
        return false;
    };
    let Ok(verifier) = rustls::client::WebPkiServerVerifier::builder_with_provider(
        std::sync::Arc::new(store),
        primus_runtime::tls::ring_provider(),
    )
    .build() else {
        return false;
    };
    let when = UnixTime::since_unix_epoch(Duration::from_secs(now.max(0) as u64));
    verifier
        .verify_server_cert(&leaf, &[], &name, &[], when)
        .is_ok()
}

/// Every PEM certificate block of a text, each as its own PEM text (a CA bundle split up).
pub fn split_bundle(pem: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(b) = rest.find(BEGIN) {
        let Some(e) = rest[b..].find(END) else {
            break;
        };
        let end = b + e + END.len();
        out.push(format!("{}\n", &rest[b..end]));
        rest = &rest[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;

    #[test]
    fn a_leaf_chains_to_its_authority_and_says_what_it_is() {
        let now = 1_800_000_000;
        let ca = new_authority(now, Duration::from_secs(365 * DAY)).unwrap();
        let info = inspect(&ca.cert_pem).unwrap();
        assert!(info.is_ca);
        assert_eq!(info.not_after, now + 365 * DAY as i64);
        assert_eq!(info.not_before, now - BACKDATE_SECONDS);
        assert_eq!(info.not_after, ca.not_after);

        let sans = vec!["svc.ns.svc".to_string(), "127.0.0.1".to_string()];
        let leaf = issue(&ca, &sans, now + 10, Duration::from_secs(90 * DAY)).unwrap();
        let info = inspect(&leaf.cert_pem).unwrap();
        assert!(!info.is_ca);
        assert_eq!(info.sans, sans);
        assert_eq!(info.not_after, now + 10 + 90 * DAY as i64);
        assert_eq!(leaf.not_after, info.not_after);
        // A leaf never outlives its CA.
        let late = issue(
            &ca,
            &sans,
            now + 300 * DAY as i64,
            Duration::from_secs(90 * DAY),
        )
        .unwrap();
        assert_eq!(inspect(&late.cert_pem).unwrap().not_after, ca.not_after);

        // It chains to its CA while valid, not to another CA, not after it expires.
        let other = new_authority(now, Duration::from_secs(365 * DAY)).unwrap();
        assert!(chains_to(&leaf.cert_pem, &[&ca.cert_pem], now + 20));
        assert!(chains_to(
            &leaf.cert_pem,
            &[&other.cert_pem, &ca.cert_pem],
            now + 20
        ));
        assert!(!chains_to(&leaf.cert_pem, &[&other.cert_pem], now + 20));
        assert!(!chains_to(
            &leaf.cert_pem,
            &[&ca.cert_pem],
            leaf.not_after + 1
        ));
    }

    #[test]
    fn bundles_split_into_their_certificates() {
        let a = new_authority(1_800_000_000, Duration::from_secs(DAY)).unwrap();
        let b = new_authority(1_800_000_001, Duration::from_secs(DAY)).unwrap();
        let bundle = format!("{}{}", a.cert_pem, b.cert_pem);
        let parts = split_bundle(&bundle);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].trim(), a.cert_pem.trim());
        assert_eq!(parts[1].trim(), b.cert_pem.trim());
        assert!(split_bundle("garbage").is_empty());
        assert!(inspect("garbage").is_err());
    }
}
