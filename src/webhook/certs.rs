//! The webhook's own certificates: a CA and a serving certificate it signs, generated with
//! rcgen and kept in a Secret so that every replica and every restart serves the same ones.
//!
//! The CA lives ten years and its certificate is what the webhook configurations carry as
//! `caBundle`; the serving certificate lives one year and is re-issued by the same CA a month
//! before it expires (or when the names it must cover change), so a renewal never touches the
//! `caBundle` and never fails a request in flight.
//!
//! A new CA (the old one near its end, or the Secret deleted or unreadable) is a rotation:
//! replicas still serve certificates the old CA signed until they move, so the Secret keeps what
//! the `caBundle` trusted before under `ca-previous.crt` for `PREVIOUS_CA_GRACE`, and the
//! `caBundle` is both (`ca_bundle`). Replicas switch to the new serving certificate only once
//! that bundle is published (`serve`); the previous CAs are dropped when the grace is over.

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
pub(crate) const RENEW_BEFORE_DAYS: i64 = 30;
/// How long the CAs trusted before a rotation stay in `caBundle`. Replicas watch the Secret and
/// move within seconds; an hour covers one whose watch was cut for a while, and keeps a CA whose
/// key may have leaked (a reason to delete the Secret) trusted no longer than that.
pub(crate) const PREVIOUS_CA_GRACE: SignedDuration = SignedDuration::from_hours(1);
/// At most this many previous CAs are kept (rotations in a row within the grace).
const MAX_PREVIOUS_CAS: usize = 3;

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const CA_PREVIOUS: &str = "ca-previous.crt";
/// Annotations recording what the certificates are, so deciding needs no X.509 parsing.
const NOT_AFTER: &str = "kruise-rs.io/serving-not-after";
const CA_NOT_AFTER: &str = "kruise-rs.io/ca-not-after";
const NAMES: &str = "kruise-rs.io/serving-names";
const CA_PREVIOUS_UNTIL: &str = "kruise-rs.io/ca-previous-until";

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
    /// The CAs `caBundle` trusted before this CA, kept in it until `until`.
    pub previous: Option<PreviousCas>,
}

/// CAs of before a rotation (PEM, one or more certificates) and when they may be dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreviousCas {
    pub pem: String,
    pub until: Timestamp,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificates")
            .field("not_after", &self.not_after)
            .field("ca_not_after", &self.ca_not_after)
            .field("names", &self.names)
            .field("previous_until", &self.previous.as_ref().map(|p| p.until))
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
    /// The previous CAs' grace is over: the same certificates without them.
    DropPrevious,
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
    if existing.previous.as_ref().is_some_and(|p| p.until <= now) {
        return Decision::DropPrevious;
    }
    Decision::Keep
}

/// `certs` without their previous CAs.
pub(crate) fn drop_previous(certs: &Certificates) -> Certificates {
    Certificates {
        previous: None,
        ..certs.clone()
    }
}

/// What the webhook configurations carry as `caBundle`: the CA, then the previous ones.
pub(crate) fn ca_bundle(certs: &Certificates) -> String {
    let mut bundle = pem_certificates(&certs.ca_cert);
    if let Some(previous) = &certs.previous {
        for cert in pem_certificates(&previous.pem) {
            if !bundle.contains(&cert) {
                bundle.push(cert);
            }
        }
    }
    bundle.concat()
}

/// The certificates of a PEM bundle, each ending in a newline (other text dropped).
pub(crate) fn pem_certificates(bundle: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut certs = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        certs.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    certs
}

/// Whether `bundle` holds every certificate of `cert` (and `cert` has one).
pub(crate) fn bundle_trusts(bundle: &str, cert: &str) -> bool {
    let wanted = pem_certificates(cert);
    let held = pem_certificates(bundle);
    !wanted.is_empty() && wanted.iter().all(|c| held.contains(c))
}

/// Whether a replica serving a certificate of `served_ca` may serve one of `next_ca` now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Serve {
    Now,
    /// Once the published `caBundle` has had this long to reach the apiservers.
    After(std::time::Duration),
    /// Not before a `caBundle` holding `next_ca` is published.
    NotPublished,
}

/// How long the apiservers may take to use a `caBundle` once written: they read webhook
/// configurations through a watch, which delivers within a second when healthy.
pub(crate) const CA_BUNDLE_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Decides [`Serve`]: the same CA is already trusted; a new one only once `published` (the
/// bundle this replica wrote, `published_for` ago) holds it and [`CA_BUNDLE_SETTLE`] has passed.
pub(crate) fn serve(
    served_ca: &str,
    next_ca: &str,
    published: Option<&str>,
    published_for: std::time::Duration,
) -> Serve {
    if pem_certificates(served_ca) == pem_certificates(next_ca) {
        return Serve::Now;
    }
    match published {
        Some(bundle) if bundle_trusts(bundle, next_ca) => {
            match CA_BUNDLE_SETTLE.checked_sub(published_for) {
                Some(left) if !left.is_zero() => Serve::After(left),
                _ => Serve::Now,
            }
        }
        _ => Serve::NotPublished,
    }
}

/// A new CA and a serving certificate signed by it. `trusted_before` (PEM) is the `caBundle`
/// replicas may still be serving under: kept as the previous CAs for [`PREVIOUS_CA_GRACE`].
pub(crate) fn new_ca(
    names: &ServingNames,
    now: Timestamp,
    trusted_before: Option<&str>,
) -> Result<Certificates, CertError> {
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
    let previous = trusted_before
        .map(|pem| {
            let mut certs: Vec<String> = Vec::new();
            for cert in pem_certificates(pem) {
                if !certs.contains(&cert) {
                    certs.push(cert);
                }
            }
            certs.truncate(MAX_PREVIOUS_CAS);
            certs.concat()
        })
        .filter(|pem| !pem.is_empty())
        .map(|pem| -> Result<PreviousCas, CertError> {
            Ok(PreviousCas {
                pem,
                until: now
                    .checked_add(PREVIOUS_CA_GRACE)
                    .map_err(|_| CertError::Time(now))?,
            })
        })
        .transpose()?;
    renew_serving_with(
        ca_cert.pem(),
        ca_key.serialize_pem(),
        ca_not_after,
        names,
        now,
        previous,
    )
}

/// A new serving certificate signed by the CA of `existing`.
pub(crate) fn renew_serving(
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
        existing.previous.clone(),
    )
}

fn renew_serving_with(
    ca_cert: String,
    ca_key: String,
    ca_not_after: Timestamp,
    names: &ServingNames,
    now: Timestamp,
    previous: Option<PreviousCas>,
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
        previous,
    })
}

/// The Secret holding `certs`.
pub(crate) fn to_secret(certs: &Certificates, name: &str, namespace: &str) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let mut annotations = BTreeMap::from([
        (NOT_AFTER.to_owned(), certs.not_after.to_string()),
        (CA_NOT_AFTER.to_owned(), certs.ca_not_after.to_string()),
        (NAMES.to_owned(), certs.names.clone()),
    ]);
    let mut data = BTreeMap::from([
        (CA_CERT.to_owned(), bytes(&certs.ca_cert)),
        (CA_KEY.to_owned(), bytes(&certs.ca_key)),
        (TLS_CERT.to_owned(), bytes(&certs.cert)),
        (TLS_KEY.to_owned(), bytes(&certs.key)),
    ]);
    if let Some(previous) = &certs.previous {
        annotations.insert(CA_PREVIOUS_UNTIL.to_owned(), previous.until.to_string());
        data.insert(CA_PREVIOUS.to_owned(), bytes(&previous.pem));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The certificates in `secret`, or `None` when anything is missing or unreadable (the caller
/// then generates new ones). Previous CAs without a readable end date are left out (and so
/// dropped from `caBundle` at the next write).
pub(crate) fn from_secret(secret: &Secret) -> Option<Certificates> {
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
        previous: text(CA_PREVIOUS)
            .zip(time(CA_PREVIOUS_UNTIL))
            .map(|(pem, until)| PreviousCas { pem, until }),
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
        let certs = new_ca(&names(), now(), None).unwrap();
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
        let certs = new_ca(&names(), now(), None).unwrap();
        let other = ServingNames::for_service("other", "kruise-system");
        assert_eq!(decide(Some(&certs), &other, now()), Decision::RenewServing);
    }

    #[test]
    fn renewal_keeps_the_ca() {
        let certs = new_ca(&names(), now(), None).unwrap();
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

    fn later(at: Timestamp, hours: i64) -> Timestamp {
        at.checked_add(SignedDuration::from_hours(hours)).unwrap()
    }

    #[test]
    fn the_bundle_is_the_ca_alone_without_a_rotation() {
        let certs = new_ca(&names(), now(), None).unwrap();
        assert_eq!(ca_bundle(&certs), certs.ca_cert);
        assert!(bundle_trusts(&ca_bundle(&certs), &certs.ca_cert));
    }

    #[test]
    fn a_new_ca_keeps_what_was_trusted_before_for_the_grace() {
        let old = new_ca(&names(), now(), None).unwrap();
        let new = new_ca(&names(), now(), Some(&ca_bundle(&old))).unwrap();
        let previous = new.previous.clone().expect("the old CA kept");
        assert_eq!(previous.pem, old.ca_cert);
        assert_eq!(
            previous.until,
            now().checked_add(PREVIOUS_CA_GRACE).unwrap()
        );
        // New CA first, then the old: both trusted.
        let bundle = ca_bundle(&new);
        assert_eq!(bundle, format!("{}{}", new.ca_cert, old.ca_cert));
        assert!(bundle_trusts(&bundle, &old.ca_cert));
        assert!(bundle_trusts(&bundle, &new.ca_cert));
    }

    #[test]
    fn previous_cas_are_capped_and_text_without_certificates_is_none() {
        let cas: Vec<Certificates> = (0..5)
            .map(|_| new_ca(&names(), now(), None).unwrap())
            .collect();
        let trusted: String = cas.iter().map(|c| c.ca_cert.clone()).collect();
        let new = new_ca(&names(), now(), Some(&trusted)).unwrap();
        let kept = pem_certificates(&new.previous.unwrap().pem);
        assert_eq!(kept.len(), MAX_PREVIOUS_CAS);
        assert_eq!(kept[0], cas[0].ca_cert, "the first (newest) are kept");
        for nothing in [
            "",
            "not a certificate",
            "-----BEGIN CERTIFICATE-----\nno end",
        ] {
            let new = new_ca(&names(), now(), Some(nothing)).unwrap();
            assert_eq!(new.previous, None, "{nothing:?}");
            assert_eq!(ca_bundle(&new), new.ca_cert);
        }
    }

    #[test]
    fn the_bundle_lists_a_certificate_once() {
        let old = new_ca(&names(), now(), None).unwrap();
        let twice = format!("{}\n{}", old.ca_cert, old.ca_cert);
        let new = new_ca(&names(), now(), Some(&twice)).unwrap();
        assert_eq!(ca_bundle(&new), format!("{}{}", new.ca_cert, old.ca_cert));
    }

    #[test]
    fn previous_cas_are_dropped_once_their_grace_is_over() {
        let old = new_ca(&names(), now(), None).unwrap();
        let new = new_ca(&names(), now(), Some(&old.ca_cert)).unwrap();
        let until = new.previous.as_ref().unwrap().until;
        let just_before = until.checked_sub(SignedDuration::from_secs(1)).unwrap();
        assert_eq!(decide(Some(&new), &names(), just_before), Decision::Keep);
        assert_eq!(decide(Some(&new), &names(), until), Decision::DropPrevious);
        let dropped = drop_previous(&new);
        assert_eq!(dropped.previous, None);
        assert_eq!((&dropped.cert, &dropped.ca_cert), (&new.cert, &new.ca_cert));
        assert_eq!(ca_bundle(&dropped), new.ca_cert);
        assert_eq!(decide(Some(&dropped), &names(), until), Decision::Keep);
    }

    #[test]
    fn renewing_or_replacing_comes_before_dropping() {
        let old = new_ca(&names(), now(), None).unwrap();
        let new = new_ca(&names(), now(), Some(&old.ca_cert)).unwrap();
        let after_grace = later(now(), 2);
        let other = ServingNames::for_service("other", "kruise-system");
        assert_eq!(
            decide(Some(&new), &other, after_grace),
            Decision::RenewServing
        );
        // A renewal by the same CA keeps the previous CAs (dropped at the next check).
        let renewed = renew_serving(&new, &other, after_grace).unwrap();
        assert_eq!(renewed.previous, new.previous);
        assert_eq!(
            decide(Some(&renewed), &other, after_grace),
            Decision::DropPrevious
        );
        let ca_end = later(new.ca_not_after, -24);
        assert_eq!(decide(Some(&new), &names(), ca_end), Decision::NewCa);
    }

    #[test]
    fn the_same_ca_is_served_at_once() {
        let certs = new_ca(&names(), now(), None).unwrap();
        let zero = std::time::Duration::ZERO;
        assert_eq!(
            serve(&certs.ca_cert, &certs.ca_cert, None, zero),
            Serve::Now
        );
    }

    #[test]
    fn a_new_ca_is_served_only_once_a_bundle_holding_it_has_settled() {
        let old = new_ca(&names(), now(), None).unwrap();
        let new = new_ca(&names(), now(), Some(&old.ca_cert)).unwrap();
        let secs = std::time::Duration::from_secs;
        assert_eq!(
            serve(&old.ca_cert, &new.ca_cert, None, secs(60)),
            Serve::NotPublished
        );
        assert_eq!(
            serve(&old.ca_cert, &new.ca_cert, Some(&old.ca_cert), secs(60)),
            Serve::NotPublished,
            "the published bundle does not hold the new CA"
        );
        let bundle = ca_bundle(&new);
        assert_eq!(
            serve(&old.ca_cert, &new.ca_cert, Some(&bundle), secs(0)),
            Serve::After(CA_BUNDLE_SETTLE)
        );
        assert_eq!(
            serve(&old.ca_cert, &new.ca_cert, Some(&bundle), secs(4)),
            Serve::After(CA_BUNDLE_SETTLE - secs(4))
        );
        assert_eq!(
            serve(&old.ca_cert, &new.ca_cert, Some(&bundle), CA_BUNDLE_SETTLE),
            Serve::Now
        );
        assert_eq!(
            serve(&old.ca_cert, &new.ca_cert, Some(&bundle), secs(3600)),
            Serve::Now
        );
    }

    #[test]
    fn previous_cas_round_trip_through_the_secret() {
        let old = new_ca(&names(), now(), None).unwrap();
        let new = new_ca(&names(), now(), Some(&old.ca_cert)).unwrap();
        let secret = to_secret(&new, "s", "ns");
        assert_eq!(from_secret(&secret), Some(new.clone()));
        let mut no_date = secret.clone();
        no_date
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(CA_PREVIOUS_UNTIL.to_owned(), "soon".to_owned());
        let read = from_secret(&no_date).expect("the current certificates still read");
        assert_eq!((read.previous, read.cert), (None, new.cert.clone()));
    }

    #[test]
    fn the_rotation_bundle_verifies_the_old_and_the_new_serving_certificates() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
        let old = new_ca(&names(), Timestamp::now(), None).unwrap();
        let new = new_ca(&names(), Timestamp::now(), Some(&old.ca_cert)).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_bundle(&new).as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            provider,
        )
        .build()
        .unwrap();
        let server = ServerName::try_from("kruise-rs-webhook.kruise-system.svc").unwrap();
        for certs in [&old, &new] {
            let leaf = CertificateDer::from_pem_slice(certs.cert.as_bytes()).unwrap();
            verifier
                .verify_server_cert(&leaf, &[], &server, &[], UnixTime::now())
                .unwrap();
        }
    }

    #[test]
    fn the_secret_round_trips() {
        let certs = new_ca(&names(), now(), None).unwrap();
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
        let certs = new_ca(&names(), Timestamp::now(), None).unwrap();
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
