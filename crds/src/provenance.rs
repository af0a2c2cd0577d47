//! Where a BenchmarkReport comes from. Kubernetes does not record who wrote an object, and the
//! namespace's benchmark service account runs whatever image a plan names, so a report is
//! trusted only when it proves it was written by the benchmark pod the operator started for it:
//!
//! - the operator holds a secret key (a Secret in its own namespace) and derives one token per
//!   attempt: `HMAC-SHA256(key, "primus-bench-token/v1" | namespace | plan uid | report |
//!   attempt)`. It hands the token to that attempt's pod only, through a Secret the pod's
//!   environment reads (`PRIMUS_REPORT_TOKEN`, with `PRIMUS_REPORT_ATTEMPT`);
//! - the pod signs what it posts: `HMAC-SHA256(token, "primus-bench-report/v1" | namespace |
//!   report | plan uid | attempt | the report's spec as JSON)`, in the annotation
//!   [`REPORT_SIGNATURE`] as `v1.<attempt>.<hex>`;
//! - the operator derives the token again from the report's controlling owner (the plan) and
//!   checks the signature. A report without one, with another plan's token, renamed, or changed
//!   after signing fails; the token never appears in a report.
//!
//! The spec is signed as this crate serializes it (field order of the types, shortest float
//! form), so the bytes are the same after the API server stored and returned it.

use ring::hmac;

use crate::annotations::REPORT_SIGNATURE;
use crate::benchmark_report::BenchmarkReportSpec;

/// Environment variable of the benchmark container holding its attempt's token.
pub const TOKEN_ENV: &str = "PRIMUS_REPORT_TOKEN";
/// Environment variable of the benchmark container holding its attempt number.
pub const ATTEMPT_ENV: &str = "PRIMUS_REPORT_ATTEMPT";
/// Key of the token in the per-attempt Secret.
pub const TOKEN_KEY: &str = "token";
/// Key of the operator's secret key in its Secret.
pub const KEY_KEY: &str = "key";
/// Bytes of a fresh operator key.
pub const KEY_BYTES: usize = 32;

/// What a signature is about: the report and the attempt of the plan that wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject<'a> {
    pub namespace: &'a str,
    pub report: &'a str,
    pub plan_uid: &'a str,
    pub attempt: u32,
}

/// Why a report's signature is not accepted, in words a condition can carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    #[error("it is not signed by a benchmark pod (no annotation {REPORT_SIGNATURE})")]
    Unsigned,
    #[error("its signature annotation {REPORT_SIGNATURE} is malformed")]
    Malformed,
    #[error(
        "its signature does not match: it was not written (or was changed since) by the benchmark pod of attempt {0} of the plan that owns it"
    )]
    Mismatch(u32),
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// Fields joined with NUL bytes (none of them can hold one).
fn message(tag: &str, fields: &[&str]) -> Vec<u8> {
    let mut m = tag.as_bytes().to_vec();
    for f in fields {
        m.push(0);
        m.extend_from_slice(f.as_bytes());
    }
    m
}

/// The token of one attempt, derived from the operator's `key` (hex).
pub fn token(key: &[u8], namespace: &str, plan_uid: &str, report: &str, attempt: u32) -> String {
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    let a = attempt.to_string();
    let m = message("primus-bench-token/v1", &[namespace, plan_uid, report, &a]);
    hex(hmac::sign(&k, &m).as_ref())
}

fn signed_bytes(subject: &Subject<'_>, spec: &BenchmarkReportSpec) -> Vec<u8> {
    let a = subject.attempt.to_string();
    let mut m = message(
        "primus-bench-report/v1",
        &[subject.namespace, subject.report, subject.plan_uid, &a],
    );
    m.push(0);
    // Serializing a typed value cannot fail (no maps with non-string keys, no NaN in JSON:
    // serde_json writes a non-finite float as null, the same on both sides).
    m.extend(serde_json::to_vec(spec).unwrap_or_default());
    m
}

/// The annotation value a benchmark pod writes: `v1.<attempt>.<hex HMAC>`.
pub fn sign(token: &str, subject: &Subject<'_>, spec: &BenchmarkReportSpec) -> String {
    let k = hmac::Key::new(hmac::HMAC_SHA256, token.as_bytes());
    let tag = hmac::sign(&k, &signed_bytes(subject, spec));
    format!("v1.{}.{}", subject.attempt, hex(tag.as_ref()))
}

/// The attempt an annotation value claims, and its MAC.
pub fn parse(annotation: &str) -> Result<(u32, Vec<u8>), Untrusted> {
    let mut parts = annotation.splitn(3, '.');
    let (Some("v1"), Some(attempt), Some(mac)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(Untrusted::Malformed);
    };
    let attempt = attempt.parse().map_err(|_| Untrusted::Malformed)?;
    let mac = unhex(mac)
        .filter(|m| m.len() == 32)
        .ok_or(Untrusted::Malformed)?;
    Ok((attempt, mac))
}

/// Check a report's signature annotation (`None`: absent) against the operator's `key`: the
/// token is derived for the report's namespace, name, owning plan and claimed attempt.
pub fn verify(
    key: &[u8],
    namespace: &str,
    report: &str,
    plan_uid: &str,
    annotation: Option<&str>,
    spec: &BenchmarkReportSpec,
) -> Result<u32, Untrusted> {
    let (attempt, mac) = parse(annotation.ok_or(Untrusted::Unsigned)?)?;
    let token = token(key, namespace, plan_uid, report, attempt);
    let subject = Subject {
        namespace,
        report,
        plan_uid,
        attempt,
    };
    let k = hmac::Key::new(hmac::HMAC_SHA256, token.as_bytes());
    hmac::verify(&k, &signed_bytes(&subject, spec), &mac)
        .map_err(|_| Untrusted::Mismatch(attempt))?;
    Ok(attempt)
}

/// A fresh random operator key.
pub fn new_key() -> Result<Vec<u8>, ring::error::Unspecified> {
    use ring::rand::SecureRandom;
    let mut k = vec![0u8; KEY_BYTES];
    ring::rand::SystemRandom::new().fill(&mut k)?;
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use primus_oracle::plan::parse_plan;
    use primus_oracle::profiles::Catalog;

    fn spec() -> BenchmarkReportSpec {
        let text = "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata: {name: p}\nspec:\n  model: {preset: llama3.1-8b}\n  cluster: {gpu: h100-sxm, gpus: 8}\n  training: {seqLength: 4096, globalBatchSize: 32}\n";
        let plan = parse_plan(text, "p.yaml", &Catalog::builtin().unwrap()).unwrap();
        BenchmarkReportSpec {
            plan: "p".into(),
            results: primus_oracle::bench::simulate::simulate(&plan, Default::default()),
        }
    }

    #[test]
    fn a_report_signed_with_its_attempts_token_verifies_and_nothing_else_does() {
        let key = new_key().unwrap();
        let s = spec();
        let t = token(&key, "team", "uid-p", "p-bench-1", 2);
        let subject = Subject {
            namespace: "team",
            report: "p-bench-1",
            plan_uid: "uid-p",
            attempt: 2,
        };
        let sig = sign(&t, &subject, &s);
        assert!(sig.starts_with("v1.2."), "{sig}");
        assert!(!sig.contains(&t), "the token is not in the signature");
        let ok = |ns, report, uid, sig: Option<&str>, spec: &BenchmarkReportSpec| {
            verify(&key, ns, report, uid, sig, spec)
        };
        assert_eq!(ok("team", "p-bench-1", "uid-p", Some(&sig), &s), Ok(2));
        // Through JSON and back (what the API server returns): the same bytes are signed.
        let back: BenchmarkReportSpec =
            serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(ok("team", "p-bench-1", "uid-p", Some(&sig), &back), Ok(2));
        // Through JSON text: every float parses back to the same bits (serde_json's
        // float_roundtrip; without it some measured times come back one ulp off).
        let text: BenchmarkReportSpec =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(ok("team", "p-bench-1", "uid-p", Some(&sig), &text), Ok(2));
        // Unsigned, another report name, another plan, another namespace, changed content.
        assert_eq!(
            ok("team", "p-bench-1", "uid-p", None, &s),
            Err(Untrusted::Unsigned)
        );
        assert_eq!(
            ok("team", "q-bench-1", "uid-p", Some(&sig), &s),
            Err(Untrusted::Mismatch(2))
        );
        assert!(ok("team", "p-bench-1", "uid-q", Some(&sig), &s).is_err());
        assert!(ok("other", "p-bench-1", "uid-p", Some(&sig), &s).is_err());
        let mut skewed = s.clone();
        skewed.results.ops[0].median_seconds *= 1000.0;
        assert!(ok("team", "p-bench-1", "uid-p", Some(&sig), &skewed).is_err());
        // A token of another plan's attempt signs nothing for this one.
        let other = token(&key, "team", "uid-q", "q-bench-1", 1);
        let forged = sign(&other, &subject, &s);
        assert!(ok("team", "p-bench-1", "uid-p", Some(&forged), &s).is_err());
        // Another operator key.
        let key2 = new_key().unwrap();
        assert!(verify(&key2, "team", "p-bench-1", "uid-p", Some(&sig), &s).is_err());
        for bad in ["", "v1", "v2.1.00", "v1.x.00", "v1.1.zz", "v1.1.00"] {
            assert_eq!(
                ok("team", "p-bench-1", "uid-p", Some(bad), &s),
                Err(Untrusted::Malformed),
                "{bad}"
            );
        }
    }
}
