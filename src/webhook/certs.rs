//! The webhook's own certificates: a CA and a serving certificate it signs, generated with
//! rcgen and kept in a Secret so that every replica and every restart serves the same ones.
//!
//! The CA lives ten years and its certificate is what the webhook configurations carry as
//! `caBundle`; the serving certificate lives one year and is re-issued by the same CA a month
//! before it expires (or when the names it must cover change), so a rotation never touches the
//! `caBundle` and never fails a request in flight. Only when the CA itself nears its end is
//! everything generated anew (and the `caBundle` patched).

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp, tz::TimeZone};
use kube::api::ObjectMeta;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// Lifetime of the CA.
const CA_DAYS: i64 = 3650;
/// Lifetime of a serving certificate.
const SERVING_DAYS: i64 = 365;
/// Re-issue this long before the end.
const RENEW_BEFORE_DAYS: i64 = 30;

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
/// Annotations recording what the certificates are, so deciding needs no X.509 parsing.
const NOT_AFTER: &str = "kruise-rs.io/serving-not-after";
const CA_NOT_AFTER: &str = "kruise-rs.io/ca-not-after";
const NAMES: &str = "kruise-rs.io/serving-names";

/// The names the serving certificate must cover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServingNames {
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl ServingNames {
    /// The names of a Service `name` in `namespace`, plus loopback.
    pub fn for_service(name: &str, namespace: &str) -> Self {
        Self {
            dns: vec![
                name.to_owned(),
                format!("{name}.{namespace}"),
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
                "localhost".to_owned(),
            ],
            ips: vec![IpAddr::from([127, 0, 0, 1])],
        }
    }

    fn key(&self) -> String {
        let mut names: Vec<String> = self.dns.clone();
        names.extend(self.ips.iter().map(IpAddr::to_string));
        names.join(",")
    }
}

/// PEM-encoded CA and serving certificate with their keys.
#[derive(Clone, PartialEq, Eq)]
pub struct Certificates {
    pub ca_cert: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
    pub not_after: Timestamp,
    pub ca_not_after: Timestamp,
    /// What [`ServingNames`] the serving certificate covers.
    names: String,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificates")
            .field("not_after", &self.not_after)
            .field("ca_not_after", &self.ca_not_after)
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot generate the webhook certificates")]
    Generate(#[from] rcgen::Error),
    #[error("the time {0} is outside what a certificate can express")]
    Time(Timestamp),
}

/// What to do with the certificates found (if any).
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Keep,
    /// A new serving certificate from the same CA.
    RenewServing,
    /// A new CA and serving certificate (and a new `caBundle`).
    NewCa,
}

/// Decides from the recorded dates and names, at `now`.
pub fn decide(existing: Option<&Certificates>, names: &ServingNames, now: Timestamp) -> Decision {
    let margin = SignedDuration::from_hours(24 * RENEW_BEFORE_DAYS);
    let Some(existing) = existing else {
        return Decision::NewCa;
    };
    if existing.ca_not_after.duration_since(now) < margin {
        return Decision::NewCa;
    }
    if existing.not_after.duration_since(now) < margin || existing.names != names.key() {
        return Decision::RenewServing;
    }
    Decision::Keep
}

/// A new CA and a serving certificate signed by it.
pub fn new_ca(names: &ServingNames, now: Timestamp) -> Result<Certificates, CertError> {
    let ca_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(DnType::CommonName, "kruise-rs webhook CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_not_after = days_after(now, CA_DAYS)?;
    set_validity(&mut params, days_after(now, -1)?, ca_not_after)?;
    let ca_cert = params.self_signed(&ca_key)?;
    renew_serving_with(
        ca_cert.pem(),
        ca_key.serialize_pem(),
        ca_not_after,
        names,
        now,
    )
}

/// A new serving certificate signed by the CA of `existing`.
pub fn renew_serving(
    existing: &Certificates,
    names: &ServingNames,
    now: Timestamp,
) -> Result<Certificates, CertError> {
    renew_serving_with(
        existing.ca_cert.clone(),
        existing.ca_key.clone(),
        existing.ca_not_after,
        names,
        now,
    )
}

fn renew_serving_with(
    ca_cert: String,
    ca_key: String,
    ca_not_after: Timestamp,
    names: &ServingNames,
    now: Timestamp,
) -> Result<Certificates, CertError> {
    let issuer = Issuer::from_ca_cert_pem(&ca_cert, KeyPair::from_pem(&ca_key)?)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.dns.clone())?;
    params
        .subject_alt_names
        .extend(names.ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params
        .distinguished_name
        .push(DnType::CommonName, "kruise-rs webhook");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // Never past the CA's own end.
    let not_after = days_after(now, SERVING_DAYS)?.min(ca_not_after);
    set_validity(&mut params, days_after(now, -1)?, not_after)?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Certificates {
        ca_cert,
        ca_key,
        cert: cert.pem(),
        key: key.serialize_pem(),
        not_after,
        ca_not_after,
        names: names.key(),
    })
}

/// The Secret holding `certs`.
pub fn to_secret(certs: &Certificates, name: &str, namespace: &str) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            annotations: Some(BTreeMap::from([
                (NOT_AFTER.to_owned(), certs.not_after.to_string()),
                (CA_NOT_AFTER.to_owned(), certs.ca_not_after.to_string()),
                (NAMES.to_owned(), certs.names.clone()),
            ])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(BTreeMap::from([
            (CA_CERT.to_owned(), bytes(&certs.ca_cert)),
            (CA_KEY.to_owned(), bytes(&certs.ca_key)),
            (TLS_CERT.to_owned(), bytes(&certs.cert)),
            (TLS_KEY.to_owned(), bytes(&certs.key)),
        ])),
        ..Secret::default()
    }
}

/// The certificates in `secret`, or `None` when anything is missing or unreadable (the caller
/// then generates new ones).
pub fn from_secret(secret: &Secret) -> Option<Certificates> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
    let annotations = secret.metadata.annotations.as_ref()?;
    let time = |key: &str| annotations.get(key)?.parse::<Timestamp>().ok();
    Some(Certificates {
        ca_cert: text(CA_CERT)?,
        ca_key: text(CA_KEY)?,
        cert: text(TLS_CERT)?,
        key: text(TLS_KEY)?,
        not_after: time(NOT_AFTER)?,
        ca_not_after: time(CA_NOT_AFTER)?,
        names: annotations.get(NAMES)?.clone(),
    })
}

fn days_after(now: Timestamp, days: i64) -> Result<Timestamp, CertError> {
    now.checked_add(SignedDuration::from_hours(24 * days))
        .map_err(|_| CertError::Time(now))
}

/// Sets the validity of `params` to the days of `from` and `to` (rcgen takes whole days, UTC).
fn set_validity(
    params: &mut CertificateParams,
    from: Timestamp,
    to: Timestamp,
) -> Result<(), CertError> {
    let ymd = |at: Timestamp| -> Result<(i32, u8, u8), CertError> {
        let day = at.to_zoned(TimeZone::UTC).date();
        let month = u8::try_from(day.month()).map_err(|_| CertError::Time(at))?;
        let dom = u8::try_from(day.day()).map_err(|_| CertError::Time(at))?;
        Ok((i32::from(day.year()), month, dom))
    };
    let (y, m, d) = ymd(from)?;
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = ymd(to)?;
    params.not_after = rcgen::date_time_ymd(y, m, d);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> ServingNames {
        ServingNames::for_service("kruise-rs-webhook", "kruise-system")
    }

    fn now() -> Timestamp {
        "2026-11-29T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn nothing_found_means_a_new_ca() {
        assert_eq!(decide(None, &names(), now()), Decision::NewCa);
    }

    #[test]
    fn fresh_certificates_are_kept_until_a_month_before_their_end() {
        let certs = new_ca(&names(), now()).unwrap();
        assert_eq!(decide(Some(&certs), &names(), now()), Decision::Keep);
        let later = certs
            .not_after
            .checked_sub(SignedDuration::from_hours(24 * 31))
            .unwrap();
        assert_eq!(decide(Some(&certs), &names(), later), Decision::Keep);
        let soon = certs
            .not_after
            .checked_sub(SignedDuration::from_hours(24 * 29))
            .unwrap();
        assert_eq!(decide(Some(&certs), &names(), soon), Decision::RenewServing);
        let ca_end = certs
            .ca_not_after
            .checked_sub(SignedDuration::from_hours(24))
            .unwrap();
        assert_eq!(decide(Some(&certs), &names(), ca_end), Decision::NewCa);
    }

    #[test]
    fn other_names_mean_a_new_serving_certificate() {
        let certs = new_ca(&names(), now()).unwrap();
        let other = ServingNames::for_service("other", "kruise-system");
        assert_eq!(decide(Some(&certs), &other, now()), Decision::RenewServing);
    }

    #[test]
    fn renewal_keeps_the_ca() {
        let certs = new_ca(&names(), now()).unwrap();
        let later = certs
            .not_after
            .checked_sub(SignedDuration::from_hours(24 * 10))
            .unwrap();
        let renewed = renew_serving(&certs, &names(), later).unwrap();
        assert_eq!(renewed.ca_cert, certs.ca_cert);
        assert_ne!(renewed.cert, certs.cert);
        assert!(renewed.not_after > certs.not_after);
        assert_eq!(decide(Some(&renewed), &names(), later), Decision::Keep);
    }

    #[test]
    fn the_secret_round_trips() {
        let certs = new_ca(&names(), now()).unwrap();
        let secret = to_secret(&certs, "s", "ns");
        assert_eq!(from_secret(&secret), Some(certs));
        let mut broken = secret.clone();
        broken.data.as_mut().unwrap().remove(TLS_KEY);
        assert_eq!(from_secret(&broken), None);
    }

    #[test]
    fn the_serving_certificate_chains_to_the_ca_for_its_names() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
        let certs = new_ca(&names(), Timestamp::now()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(certs.ca_cert.as_bytes()).unwrap())
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            provider,
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(certs.cert.as_bytes()).unwrap();
        for name in ["kruise-rs-webhook.kruise-system.svc", "127.0.0.1"] {
            let server = ServerName::try_from(name).unwrap();
            verifier
                .verify_server_cert(&leaf, &[], &server, &[], UnixTime::now())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let wrong = ServerName::try_from("elsewhere.example").unwrap();
        assert!(
            verifier
                .verify_server_cert(&leaf, &[], &wrong, &[], UnixTime::now())
                .is_err()
        );
    }
}
