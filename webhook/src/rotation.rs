//! Rotation of the self-signed CA and serving certificate that every webhook replica shares
//! through one Secret, as a pure function of what the Secret holds and the time.
//!
//! The Secret ([`Material`]) holds the CA that signs (`signer`), the serving certificate it
//! signed, and, during a CA rotation, a second CA. The webhook configuration's caBundle is
//! always [`Material::bundle`]: every CA of the Secret. A CA rotation takes three writes, each
//! `overlap` apart, so no replica ever serves a certificate the API server does not trust:
//!
//! 1. **stage**: a new CA joins the Secret (and so the bundle) but signs nothing yet;
//! 2. **promote**: once the bundle in the configuration holds it, the new CA signs a new serving
//!    certificate; the old CA stays in the bundle (replicas still serving its certificate);
//! 3. **retire**: the old CA leaves the Secret and the bundle.
//!
//! Serving certificates are renewed by the signer alone (the bundle does not change). Timing:
//! a CA is staged when a third of its life is left, a serving certificate is renewed when a
//! third of its life is left (cert-manager's default of renewing at two thirds).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::pki::{self, Authority, Leaf};
use crate::tls::TlsError;

/// Keys of the Secret's `data`.
pub mod keys {
    /// Every trusted CA (the caBundle), for people and other tools; derived, never read back.
    pub const BUNDLE: &str = "ca.crt";
    pub const SIGNER_CERT: &str = "signer.crt";
    pub const SIGNER_KEY: &str = "signer.key";
    pub const NEXT_CERT: &str = "next.crt";
    pub const NEXT_KEY: &str = "next.key";
    /// Unix seconds at which the next CA was staged.
    pub const NEXT_SINCE: &str = "next.since";
    pub const PREVIOUS_CERT: &str = "previous.crt";
    /// Unix seconds at which the previous CA stopped signing.
    pub const PREVIOUS_SINCE: &str = "previous.since";
    pub const TLS_CERT: &str = "tls.crt";
    pub const TLS_KEY: &str = "tls.key";
}

/// Lifetimes and the overlap of a CA rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub ca_validity: Duration,
    pub cert_validity: Duration,
    /// Time between the writes of a CA rotation: every replica re-reads the Secret and the API
    /// server sees the new caBundle within it.
    pub overlap: Duration,
}

impl Policy {
    /// Check the lifetimes against each other and against the replicas' re-read interval,
    /// naming the flags in the error.
    pub fn check(&self, reload: Duration) -> Result<(), String> {
        if self.ca_validity < self.cert_validity * 3 {
            return Err(format!(
                "--ca-validity-seconds ({}) must be at least 3 x --cert-validity-seconds ({}): a serving certificate must not need to outlive its CA",
                self.ca_validity.as_secs_f64(),
                self.cert_validity.as_secs_f64()
            ));
        }
        if self.overlap * 6 > self.ca_validity {
            return Err(format!(
                "--ca-overlap-seconds ({}) must be at most a sixth of --ca-validity-seconds ({}): a CA rotation (two overlaps) must end in the last third of the CA's life",
                self.overlap.as_secs_f64(),
                self.ca_validity.as_secs_f64()
            ));
        }
        if self.overlap < reload * 2 {
            return Err(format!(
                "--ca-overlap-seconds ({}) must be at least 2 x --cert-reload-interval-seconds ({}): every replica must re-read the Secret within each overlap",
                self.overlap.as_secs_f64(),
                reload.as_secs_f64()
            ));
        }
        if self.cert_validity < reload * 6 {
            return Err(format!(
                "--cert-validity-seconds ({}) must be at least 6 x --cert-reload-interval-seconds ({}): replicas must pick up a renewed certificate well before the old one expires",
                self.cert_validity.as_secs_f64(),
                reload.as_secs_f64()
            ));
        }
        Ok(())
    }
}

/// A CA staged for the next rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    pub ca: Authority,
    pub since: i64,
}

/// A CA that no longer signs, still trusted for `overlap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retiring {
    pub cert_pem: String,
    pub not_after: i64,
    pub since: i64,
}

impl Retiring {
    /// Whether its overlap is over at `now`: every replica has re-read the Secret since the CA
    /// stopped signing, so it leaves the trusted bundle (retired, and never trusted again).
    fn overlap_over(&self, now: i64, p: &Policy) -> bool {
        now - self.since >= secs(p.overlap)
    }
}

/// What the shared Secret holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Material {
    pub signer: Authority,
    pub next: Option<Staged>,
    pub previous: Option<Retiring>,
    pub serving: Leaf,
}

/// One write to the Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A new CA and serving certificate (the Secret is empty, unreadable, or its CA expired).
    Create,
    /// Write back what this replica last read (the Secret was emptied, e.g. by a sync that
    /// replaced it), so the CA the API server trusts stays.
    Restore,
    /// A new serving certificate from the signer.
    RenewServing,
    /// Rotation step 1: a new CA joins the bundle.
    StageCa,
    /// Rotation step 2: the staged CA signs.
    PromoteCa,
    /// Rotation step 3: the old CA leaves the bundle.
    RetireCa,
}

impl Step {
    /// The label of the step in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Create => "create",
            Step::Restore => "restore",
            Step::RenewServing => "renew-serving",
            Step::StageCa => "stage-ca",
            Step::PromoteCa => "promote-ca",
            Step::RetireCa => "retire-ca",
        }
    }
}

fn secs(d: Duration) -> i64 {
    d.as_secs().min(i64::MAX as u64 / 4) as i64
}

/// What the webhook must serve and trust.
#[derive(Debug, Clone)]
pub struct Want<'a> {
    pub policy: Policy,
    pub sans: &'a [String],
    pub now: i64,
}

impl Material {
    /// Every trusted CA certificate, in a canonical order (the same set gives the same bytes,
    /// whichever replica writes it).
    pub fn trusted(&self) -> Vec<&str> {
        let mut v = vec![self.signer.cert_pem.as_str()];
        if let Some(n) = &self.next {
            v.push(&n.ca.cert_pem);
        }
        if let Some(p) = &self.previous {
            v.push(&p.cert_pem);
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The caBundle: [`Material::trusted`] concatenated.
    pub fn bundle(&self) -> String {
        self.trusted()
            .iter()
            .map(|p| {
                if p.ends_with('\n') {
                    p.to_string()
                } else {
                    format!("{p}\n")
                }
            })
            .collect()
    }

    /// The Secret's `data`.
    pub fn to_data(&self) -> BTreeMap<String, Vec<u8>> {
        let mut d = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            d.insert(k.to_string(), v.as_bytes().to_vec());
        };
        put(keys::BUNDLE, &self.bundle());
        put(keys::SIGNER_CERT, &self.signer.cert_pem);
        put(keys::SIGNER_KEY, &self.signer.key_pem);
        put(keys::TLS_CERT, &self.serving.cert_pem);
        put(keys::TLS_KEY, &self.serving.key_pem);
        if let Some(n) = &self.next {
            put(keys::NEXT_CERT, &n.ca.cert_pem);
            put(keys::NEXT_KEY, &n.ca.key_pem);
            put(keys::NEXT_SINCE, &n.since.to_string());
        }
        if let Some(p) = &self.previous {
            put(keys::PREVIOUS_CERT, &p.cert_pem);
            put(keys::PREVIOUS_SINCE, &p.since.to_string());
        }
        d
    }

    /// Read a Secret's `data`: `Ok(None)` when it holds no signer yet (as the chart creates it),
    /// an error naming the key when what it holds does not make a consistent set.
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<Option<Material>, TlsError> {
        if !data.contains_key(keys::SIGNER_CERT) {
            return Ok(None);
        }
        let text = |k: &str| -> Result<String, TlsError> {
            let v = data
                .get(k)
                .ok_or_else(|| TlsError::BadCertificate(format!("the Secret has no {k}")))?;
            String::from_utf8(v.clone())
                .map_err(|_| TlsError::BadCertificate(format!("{k} is not text")))
        };
        let since = |k: &str| -> Result<i64, TlsError> {
            text(k)?
                .trim()
                .parse()
                .map_err(|_| TlsError::BadCertificate(format!("{k} is not a number of seconds")))
        };
        let authority = |cert: &str, key: &str| -> Result<Authority, TlsError> {
            let cert_pem = text(cert)?;
            let info = pki::inspect(&cert_pem)
                .map_err(|e| TlsError::BadCertificate(format!("{cert}: {e}")))?;
            if !info.is_ca {
                return Err(TlsError::BadCertificate(format!("{cert} is not a CA")));
            }
            Ok(Authority {
                cert_pem,
                key_pem: text(key)?,
                not_after: info.not_after,
            })
        };
        let signer = authority(keys::SIGNER_CERT, keys::SIGNER_KEY)?;
        let next = match data.contains_key(keys::NEXT_CERT) {
            true => Some(Staged {
                ca: authority(keys::NEXT_CERT, keys::NEXT_KEY)?,
                since: since(keys::NEXT_SINCE)?,
            }),
            false => None,
        };
        let previous = match data.contains_key(keys::PREVIOUS_CERT) {
            true => {
                let cert_pem = text(keys::PREVIOUS_CERT)?;
                let not_after = pki::inspect(&cert_pem)
                    .map_err(|e| TlsError::BadCertificate(format!("{}: {e}", keys::PREVIOUS_CERT)))?
                    .not_after;
                Some(Retiring {
                    cert_pem,
                    not_after,
                    since: since(keys::PREVIOUS_SINCE)?,
                })
            }
            false => None,
        };
        let cert_pem = text(keys::TLS_CERT)?;
        let key_pem = text(keys::TLS_KEY)?;
        // The pair must make a key rustls can serve.
        crate::tls::certified_key(
            cert_pem.as_bytes(),
            key_pem.as_bytes(),
            keys::TLS_CERT,
            keys::TLS_KEY,
        )?;
        let info = pki::inspect(&cert_pem)
            .map_err(|e| TlsError::BadCertificate(format!("{}: {e}", keys::TLS_CERT)))?;
        Ok(Some(Material {
            signer,
            next,
            previous,
            serving: Leaf {
                cert_pem,
                key_pem,
                not_after: info.not_after,
                sans: info.sans,
            },
        }))
    }

    /// Whether the serving certificate is for exactly `sans`, valid at `now`, and chains to
    /// the bundle.
    pub fn serves(&self, sans: &[String], now: i64) -> bool {
        let mut have = self.serving.sans.clone();
        let mut want = sans.to_vec();
        have.sort();
        want.sort();
        have == want && pki::chains_to(&self.serving.cert_pem, &self.trusted(), now)
    }
}

/// The write the Secret needs next, if any. `secret` is what it holds now (`None`: nothing
/// usable), `remembered` what this replica last read from it, `bundle_in_step` whether the
/// webhook configuration's caBundle is [`Material::bundle`] of `secret` (a staged CA is
/// promoted only then).
pub fn next_step(
    secret: Option<&Material>,
    remembered: Option<&Material>,
    want: &Want<'_>,
    bundle_in_step: bool,
) -> Option<Step> {
    let now = want.now;
    let p = &want.policy;
    let Some(m) = secret else {
        return Some(match remembered {
            Some(r) if r.signer.not_after > now && r.serves(want.sans, now) => Step::Restore,
            _ => Step::Create,
        });
    };
    if m.signer.not_after <= now {
        return Some(Step::Create);
    }
    if m.previous
        .as_ref()
        .is_some_and(|prev| prev.overlap_over(now, p))
    {
        return Some(Step::RetireCa);
    }
    if let Some(next) = &m.next
        && now - next.since >= secs(p.overlap)
        && bundle_in_step
    {
        return Some(Step::PromoteCa);
    }
    if m.next.is_none()
        && m.previous.is_none()
        && m.signer.not_after - now <= secs(p.ca_validity) / 3
    {
        return Some(Step::StageCa);
    }
    let renewed_until = (now + secs(p.cert_validity)).min(m.signer.not_after);
    let due = m.serving.not_after - now <= secs(p.cert_validity) / 3
        && renewed_until > m.serving.not_after;
    if due || !m.serves(want.sans, now) {
        return Some(Step::RenewServing);
    }
    None
}

/// The Secret's contents after `step`.
pub fn apply(
    step: Step,
    secret: Option<&Material>,
    remembered: Option<&Material>,
    want: &Want<'_>,
) -> Result<Material, TlsError> {
    let now = want.now;
    let p = &want.policy;
    let fresh = || -> Result<Material, TlsError> {
        let signer = pki::new_authority(now, p.ca_validity)?;
        let serving = pki::issue(&signer, want.sans, now, p.cert_validity)?;
        Ok(Material {
            signer,
            next: None,
            previous: None,
            serving,
        })
    };
    let Some(m) = secret else {
        return match (step, remembered) {
            // A remembered CA whose overlap is over stays retired (the replica may remember the
            // Secret from before another one retired it): restoring it would trust it again and
            // retire it a second time.
            (Step::Restore, Some(r)) => {
                let mut r = r.clone();
                if r.previous
                    .as_ref()
                    .is_some_and(|prev| prev.overlap_over(now, p))
                {
                    r.previous = None;
                }
                Ok(r)
            }
            _ => fresh(),
        };
    };
    let mut m = m.clone();
    match step {
        Step::Create => return fresh(),
        Step::Restore => {}
        Step::RenewServing => m.serving = pki::issue(&m.signer, want.sans, now, p.cert_validity)?,
        Step::StageCa => {
            m.next = Some(Staged {
                ca: pki::new_authority(now, p.ca_validity)?,
                since: now,
            })
        }
        Step::PromoteCa => {
            if let Some(next) = m.next.take() {
                let old = std::mem::replace(&mut m.signer, next.ca);
                m.previous = Some(Retiring {
                    cert_pem: old.cert_pem,
                    not_after: old.not_after,
                    since: now,
                });
                m.serving = pki::issue(&m.signer, want.sans, now, p.cert_validity)?;
            }
        }
        Step::RetireCa => m.previous = None,
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        ca_validity: Duration::from_secs(900),
        cert_validity: Duration::from_secs(300),
        overlap: Duration::from_secs(60),
    };

    fn sans() -> Vec<String> {
        vec!["svc.ns.svc".into(), "127.0.0.1".into()]
    }

    /// Run the Secret forward second by second from `start` to `end` as the replicas would:
    /// the caBundle follows the Secret one second late, one replica serves what the Secret
    /// held a second ago and another what it held `LAG` seconds ago (a slow re-read, less than
    /// the overlap). At every second both serving certificates must chain to the bundle the
    /// API server holds. Returns the steps taken.
    fn simulate(start: i64, end: i64) -> Vec<(i64, Step)> {
        const LAG: i64 = 30;
        let sans = sans();
        let mut secret: Option<Material> = None;
        let mut api_bundle: Vec<String> = Vec::new();
        let mut served: Vec<(i64, String)> = Vec::new();
        let mut steps = Vec::new();
        for now in start..end {
            let want = Want {
                policy: POLICY,
                sans: &sans,
                now,
            };
            let in_step = secret.as_ref().is_some_and(|m| {
                m.trusted()
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    == api_bundle
            });
            if let Some(step) = next_step(secret.as_ref(), None, &want, in_step) {
                secret = Some(apply(step, secret.as_ref(), None, &want).unwrap());
                steps.push((now, step));
            }
            let m = secret.as_ref().unwrap();
            let roots: Vec<&str> = api_bundle.iter().map(String::as_str).collect();
            for lag in [1, LAG] {
                // What a replica that re-read the Secret `lag` seconds ago serves.
                let Some((_, pem)) = served.iter().rev().find(|(t, _)| *t <= now - lag) else {
                    continue;
                };
                assert!(
                    pki::chains_to(pem, &roots, now),
                    "at {now}: a replica {lag} s behind serves a certificate the caBundle does not trust ({steps:?})"
                );
            }
            served.push((now, m.serving.cert_pem.clone()));
            api_bundle = m.trusted().iter().map(|s| s.to_string()).collect();
        }
        steps
    }

    #[test]
    fn a_ca_rotation_stages_promotes_and_retires_without_an_untrusted_moment() {
        let t0 = 1_800_000_000;
        let steps = simulate(t0, t0 + 1000);
        let at = |s: Step| {
            steps
                .iter()
                .filter(|(_, x)| *x == s)
                .map(|(t, _)| t - t0)
                .collect::<Vec<_>>()
        };
        assert_eq!(at(Step::Create), [0]);
        // A third of the CA's 900 s left: staged at 600, promoted and retired 60 s apart.
        assert_eq!(at(Step::StageCa), [600]);
        assert_eq!(at(Step::PromoteCa), [660]);
        assert_eq!(at(Step::RetireCa), [720]);
        // Serving certificates: renewed when a third of 300 s is left.
        // Serving certificates: renewed when a third of 300 s is left (at 600 the CA is staged
        // first, the certificate follows a second later; from 660 the new CA signs).
        assert_eq!(at(Step::RenewServing), [200, 400, 601, 860]);
    }

    #[test]
    fn a_restore_from_before_a_retire_keeps_the_old_ca_retired() {
        let sans = sans();
        let t0 = 1_800_000_000;
        let want = |now| Want {
            policy: POLICY,
            sans: &sans,
            now,
        };
        // A rotation promoted at t0 + 10: the old CA is trusted until its overlap ends.
        let m = apply(Step::Create, None, None, &want(t0)).unwrap();
        let staged = apply(Step::StageCa, Some(&m), None, &want(t0)).unwrap();
        let promoted = apply(Step::PromoteCa, Some(&staged), None, &want(t0 + 10)).unwrap();
        assert!(promoted.previous.is_some());
        // Within the overlap a restore keeps it; after, the Secret comes back without it, so
        // nothing is retired twice.
        let within = apply(Step::Restore, None, Some(&promoted), &want(t0 + 20)).unwrap();
        assert!(within.previous.is_some());
        let after = apply(Step::Restore, None, Some(&promoted), &want(t0 + 80)).unwrap();
        assert!(after.previous.is_none());
        assert_eq!(after.signer, promoted.signer);
        assert_eq!(next_step(Some(&after), None, &want(t0 + 80), true), None);
    }

    #[test]
    fn an_emptied_secret_is_restored_and_an_expired_ca_replaced() {
        let sans = sans();
        let now = 1_800_000_000;
        let want = Want {
            policy: POLICY,
            sans: &sans,
            now,
        };
        let m = apply(Step::Create, None, None, &want).unwrap();
        assert_eq!(next_step(Some(&m), None, &want, true), None);
        assert_eq!(next_step(None, Some(&m), &want, true), Some(Step::Restore));
        assert_eq!(apply(Step::Restore, None, Some(&m), &want).unwrap(), m);
        let late = Want {
            now: m.signer.not_after,
            ..want.clone()
        };
        assert_eq!(next_step(None, Some(&m), &late, true), Some(Step::Create));
        assert_eq!(next_step(Some(&m), None, &late, true), Some(Step::Create));
        // Other names: a new serving certificate.
        let other = vec!["other.ns.svc".to_string()];
        let renamed = Want {
            sans: &other,
            ..want.clone()
        };
        assert_eq!(
            next_step(Some(&m), None, &renamed, true),
            Some(Step::RenewServing)
        );
    }

    #[test]
    fn a_staged_ca_waits_for_the_overlap_and_the_bundle() {
        let sans = sans();
        let t0 = 1_800_000_000;
        let want = |now| Want {
            policy: POLICY,
            sans: &sans,
            now,
        };
        let m = apply(Step::Create, None, None, &want(t0)).unwrap();
        let m = apply(Step::RenewServing, Some(&m), None, &want(t0 + 590)).unwrap();
        let m = apply(Step::StageCa, Some(&m), None, &want(t0 + 600)).unwrap();
        assert_eq!(next_step(Some(&m), None, &want(t0 + 650), true), None);
        assert_eq!(next_step(Some(&m), None, &want(t0 + 665), false), None);
        assert_eq!(
            next_step(Some(&m), None, &want(t0 + 665), true),
            Some(Step::PromoteCa)
        );
    }

    #[test]
    fn data_round_trips_and_bad_data_names_the_key() {
        let sans = sans();
        let t0 = 1_800_000_000;
        let want = |now| Want {
            policy: POLICY,
            sans: &sans,
            now,
        };
        let m = apply(Step::Create, None, None, &want(t0)).unwrap();
        let m = apply(Step::StageCa, Some(&m), None, &want(t0 + 600)).unwrap();
        let data = m.to_data();
        assert_eq!(Material::from_data(&data).unwrap(), Some(m.clone()));
        assert_eq!(
            pki::split_bundle(&String::from_utf8(data[keys::BUNDLE].clone()).unwrap()).len(),
            2
        );
        let promoted = apply(Step::PromoteCa, Some(&m), None, &want(t0 + 660)).unwrap();
        assert_eq!(
            Material::from_data(&promoted.to_data()).unwrap(),
            Some(promoted.clone())
        );
        assert_eq!(Material::from_data(&BTreeMap::new()).unwrap(), None);
        let mut bad = data.clone();
        bad.remove(keys::TLS_KEY);
        assert!(
            Material::from_data(&bad)
                .unwrap_err()
                .to_string()
                .contains("tls.key")
        );
        let mut bad = data;
        bad.insert(keys::NEXT_SINCE.into(), b"soon".to_vec());
        assert!(
            Material::from_data(&bad)
                .unwrap_err()
                .to_string()
                .contains("next.since")
        );
    }

    #[test]
    fn inconsistent_lifetimes_are_refused_naming_the_flags() {
        let reload = Duration::from_secs(10);
        assert!(POLICY.check(Duration::from_secs(10)).is_ok());
        let short_ca = Policy {
            ca_validity: Duration::from_secs(600),
            ..POLICY
        };
        assert!(
            short_ca
                .check(reload)
                .unwrap_err()
                .contains("--ca-validity-seconds")
        );
        let long_overlap = Policy {
            overlap: Duration::from_secs(200),
            ..POLICY
        };
        assert!(
            long_overlap
                .check(reload)
                .unwrap_err()
                .contains("--ca-overlap-seconds")
        );
        assert!(
            POLICY
                .check(Duration::from_secs(31))
                .unwrap_err()
                .contains("--cert-reload-interval-seconds")
        );
    }
}
