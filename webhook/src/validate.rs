//! The decisions: what to answer for one PyTorchJob or TrainingPlan, as a [`Verdict`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use primus_crds::annotations;
use primus_crds::pytorchjob::{PyTorchJobSpec, from_json_at};
use primus_oracle::layout::Layout;
use primus_oracle::memory::{self, Band, Verdict as MemoryVerdict};
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::Scenario;
use primus_oracle::units::gib;
use serde_json::Value;

use crate::pytorchjob::{self, DeriveError, DerivedJob, LayoutSource};
use crate::suggest;
use crate::trainjob;
use primus_crds::JobKind;

/// Why the webhook decided what it did (a metrics label and a log field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The predicted peak fits below the headroom.
    Fits,
    /// The predicted peak fits, but within the headroom or the error band of usable memory:
    /// allowed with a warning.
    Headroom,
    /// The predicted peak exceeds usable memory, but by less than the model's error band:
    /// allowed with a warning.
    WithinBand,
    /// The predicted peak exceeds usable memory by more than the model's error band: denied.
    Oom,
    /// The predicted peak exceeds usable memory by more than the band, but the job carries a
    /// memory-relevant flag the model does not model: allowed with a warning naming it.
    Unmodelled,
    /// Model, GPU, training settings or world size could not be derived.
    Underivable,
    /// A field of the job is wrong (a flag value, an annotation, an illegal layout).
    InvalidJob,
    /// The object carries `primus.dev/skip-validation: "true"`.
    Skipped,
    /// An update that only flips `spec.runPolicy.suspend`.
    SuspendOnly,
    /// An update that changes only metadata (or status).
    MetadataOnly,
    /// An operation the webhook does not check (DELETE, CONNECT, a subresource).
    NotApplicable,
    /// A TrainingPlan that passes the semantic rules.
    PlanValid,
    /// A TrainingPlan that breaks one.
    PlanInvalid,
    /// The request is not a readable AdmissionReview.
    Malformed,
    /// The request is for a kind this endpoint does not validate.
    WrongKind,
    /// The check panicked or overran its budget (a bug): failed open.
    Internal,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Fits => "fits",
            Reason::Headroom => "headroom",
            Reason::WithinBand => "within-band",
            Reason::Oom => "oom",
            Reason::Unmodelled => "unmodelled",
            Reason::Underivable => "underivable",
            Reason::InvalidJob => "invalid-job",
            Reason::Skipped => "skipped",
            Reason::SuspendOnly => "suspend-only",
            Reason::MetadataOnly => "metadata-only",
            Reason::NotApplicable => "not-applicable",
            Reason::PlanValid => "plan-valid",
            Reason::PlanInvalid => "plan-invalid",
            Reason::Malformed => "malformed",
            Reason::WrongKind => "wrong-kind",
            Reason::Internal => "internal",
        }
    }
}

/// One decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub allowed: bool,
    pub reason: Reason,
    /// The denial message (empty when allowed).
    pub message: String,
    /// HTTP-style code of the denial's Status (403 forbidden, 422 invalid).
    pub code: u16,
    /// Warnings kubectl prints (allowed or not).
    pub warnings: Vec<String>,
    /// Audit annotations (predicted GiB, layout) for the API server's audit log.
    pub audit: BTreeMap<String, String>,
}

impl Verdict {
    pub fn allow(reason: Reason) -> Verdict {
        Verdict {
            allowed: true,
            reason,
            message: String::new(),
            code: 0,
            warnings: Vec::new(),
            audit: BTreeMap::new(),
        }
    }

    pub fn deny(reason: Reason, code: u16, message: impl Into<String>) -> Verdict {
        Verdict {
            allowed: false,
            reason,
            message: message.into(),
            code,
            warnings: Vec::new(),
            audit: BTreeMap::new(),
        }
    }

    fn warn(mut self, w: impl Into<String>) -> Verdict {
        self.warnings.push(w.into());
        self
    }

    /// `allow`, `warn` (allowed with warnings) or `deny`: the metrics' decision label.
    pub fn decision(&self) -> &'static str {
        match (self.allowed, self.warnings.is_empty()) {
            (false, _) => "deny",
            (true, true) => "allow",
            (true, false) => "warn",
        }
    }
}

/// Settings of the webhook.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Fraction of usable memory above which an admitted job gets a warning (default 0.92).
    pub headroom: f64,
    /// Deny jobs that cannot be derived (instead of allowing them with a warning).
    pub strict: bool,
    /// Time the nearest-layout search may take.
    pub suggest_budget: Duration,
    /// Suggestions in a denial.
    pub max_suggestions: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            headroom: primus_oracle::plan::DEFAULT_MEMORY_HEADROOM,
            strict: false,
            suggest_budget: Duration::from_millis(250),
            max_suggestions: 3,
        }
    }
}

/// What the admission request says about a job.
#[derive(Debug, Clone, Copy)]
pub struct JobRequest<'a> {
    pub labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
    /// The object without metadata.
    pub data: &'a Value,
    /// The previous object on UPDATE.
    pub old: Option<&'a Value>,
}

/// The decisions, with the catalog they are made against.
#[derive(Debug, Clone)]
pub struct Validator {
    pub catalog: Catalog,
    pub settings: Settings,
}

/// Format bytes as GiB with one decimal.
pub fn gib1(bytes: f64) -> String {
    format!("{:.1}", gib(bytes))
}

/// The GPU's display name in messages, e.g. `MI300X`.
fn gpu_name(s: &Scenario) -> String {
    s.hardware.name.to_uppercase()
}

/// Warnings are printed one per line by kubectl: keep them on one line.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// The result of projecting one job's memory.
pub struct MemoryCheck {
    pub report: memory::MemoryReport,
    pub peak_bytes: f64,
    pub stage: u64,
    pub usable_bytes: f64,
}

impl Validator {
    pub fn new(catalog: Catalog, settings: Settings) -> Validator {
        Validator { catalog, settings }
    }

    /// Project memory for a derived job.
    pub fn project(&self, job: &DerivedJob) -> MemoryCheck {
        let report = memory::estimate(&job.scenario, &job.layout);
        let peak_bytes = report.peak_bytes;
        let stage = u64::from(report.bottleneck_stage);
        MemoryCheck {
            report,
            peak_bytes,
            stage,
            usable_bytes: job.scenario.hardware.usable_bytes(),
        }
    }

    /// `(weights 38.1, grads 19.0, optimizer 28.6, activations 121.7, other 4.0)` of the
    /// bottleneck stage.
    fn breakdown(m: &MemoryCheck) -> String {
        match m
            .report
            .stages
            .iter()
            .find(|st| u64::from(st.stage) == m.stage)
        {
            Some(st) => format!(
                "(weights {}, grads {}, optimizer {}, activations {}, other {})",
                gib1(st.weights_bytes),
                gib1(st.gradients_bytes),
                gib1(st.optimizer_bytes),
                gib1(st.activations_bytes),
                gib1(st.other_bytes)
            ),
            None => String::new(),
        }
    }

    fn suggestions(
        &self,
        s: &Scenario,
        l: &Layout,
        limit: f64,
        deadline: Instant,
    ) -> suggest::SearchOutcome {
        suggest::search(s, l, limit, deadline, self.settings.max_suggestions)
    }

    fn suggestion_text(out: &suggest::SearchOutcome) -> String {
        out.suggestions
            .iter()
            .map(|sg| format!("{} ({} GiB)", sg.flags(), gib1(sg.peak_bytes)))
            .collect::<Vec<_>>()
            .join(", or ")
    }

    fn cannot_check(&self, strict: bool, reason: Reason, lines: Vec<String>) -> Verdict {
        if strict {
            Verdict::deny(
                reason,
                403,
                format!(
                    "strict admission (namespace label {}=strict or --strict): cannot check GPU memory: {}",
                    annotations::ADMISSION_MODE,
                    lines.join("; ")
                ),
            )
        } else {
            let mut v = Verdict::allow(reason);
            for l in lines {
                v = v.warn(one_line(&format!("primus: cannot check GPU memory: {l}")));
            }
            v
        }
    }

    /// Decide a PyTorchJob CREATE or UPDATE. `old` is the previous object on UPDATE.
    pub fn pytorchjob(
        &self,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
        data: &Value,
        old: Option<&Value>,
        strict: bool,
        deadline: Instant,
    ) -> Verdict {
        let job = JobRequest {
            labels,
            annotations,
            data,
            old,
        };
        self.job(JobKind::PyTorchJob, &job, strict, deadline)
    }

    /// Decide a CREATE or UPDATE of a job of either kind (PyTorchJob, TrainJob).
    pub fn job(&self, kind: JobKind, req: &JobRequest, strict: bool, deadline: Instant) -> Verdict {
        let JobRequest {
            labels,
            annotations,
            data,
            old,
        } = *req;
        let strict = strict || self.settings.strict;
        if labels
            .get(annotations::SKIP_VALIDATION)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        {
            return Verdict::allow(Reason::Skipped);
        }
        if let Some(old) = old {
            let unchanged = match kind {
                JobKind::PyTorchJob => unchanged_but_suspend(old, data),
                JobKind::TrainJob if old.get("spec") == data.get("spec") => {
                    Some(Reason::MetadataOnly)
                }
                JobKind::TrainJob => {
                    trainjob::unchanged_but_suspend(old, data).then_some(Reason::SuspendOnly)
                }
            };
            if let Some(r) = unchanged {
                return Verdict::allow(r);
            }
        }
        let derived = match kind {
            JobKind::PyTorchJob => pytorchjob::derive(data, annotations, &self.catalog),
            JobKind::TrainJob => trainjob::derive(data, annotations, &self.catalog),
        };
        let job = match derived {
            Ok(job) => job,
            Err(DeriveError::Missing(lines)) => {
                return self.cannot_check(strict, Reason::Underivable, lines);
            }
            Err(DeriveError::Invalid(e)) => {
                return self.cannot_check(strict, Reason::InvalidJob, vec![e.to_string()]);
            }
        };
        let v = self.judge(&job, deadline);
        if strict && v.reason == Reason::Internal {
            return Verdict::deny(
                Reason::Internal,
                500,
                format!("strict admission: {}", v.warnings.join("; ")),
            );
        }
        v
    }

    /// Project a derived job and decide: deny only when the prediction exceeds usable memory
    /// by more than the model's measured error band for the job's kind
    /// ([`primus_oracle::memory::band`]), and never for a job carrying a memory-relevant flag
    /// the model does not model; warn between the band and the headroom.
    pub fn judge(&self, job: &DerivedJob, deadline: Instant) -> Verdict {
        let s = &job.scenario;
        let m = self.project(job);
        if !m.peak_bytes.is_finite() {
            let mut v = Verdict::allow(Reason::Internal);
            v.warnings.push(format!(
                "primus: cannot check GPU memory: the memory model gave no finite prediction for {}",
                job.layout.label()
            ));
            return v;
        }
        let band = Band::of(s);
        let verdict =
            MemoryVerdict::of(m.peak_bytes, m.usable_bytes, self.settings.headroom, &band);
        let search_deadline = deadline.min(Instant::now() + self.settings.suggest_budget);
        let mut v = match verdict {
            MemoryVerdict::Exceeds if job.unmodelled.is_empty() => {
                self.deny_oom(s, &job.layout, &m, &band, search_deadline)
            }
            MemoryVerdict::Exceeds => self.admit_unmodelled(s, &m, &band, &job.unmodelled),
            MemoryVerdict::WithinBand => {
                self.warn_within_band(s, &job.layout, &m, &band, search_deadline)
            }
            MemoryVerdict::AtRisk => self.warn_headroom(s, &job.layout, &m, &band, search_deadline),
            MemoryVerdict::Fits => Verdict::allow(Reason::Fits),
        };
        // A job that fits gets the fixed-segment warning (a job near or over usable memory is
        // warned already, fragmentation named).
        if verdict == MemoryVerdict::Fits && m.report.fixed_segments_at_risk(&job.layout) {
            v = v.warn(format!(
                "primus: without expandable segments the caching allocator's fixed-size segments can fragment: the predicted allocated peak {} GiB times {} (the worst reserved-over-allocated measured, memory.csv MB-L1) is over the {} GiB usable; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                gib1(m.report.allocated_peak_bytes()),
                memory::allocator::FIXED_SEGMENTS_WORST_RESERVED_RATIO,
                gib1(m.usable_bytes),
            ));
        }
        // Settings that only add memory the model does not count: named whatever the verdict
        // (a denial stands: the real peak is higher still).
        for (setting, what) in &job.adds_memory {
            v = v.warn(format!(
                "primus: the job sets {setting} ({what}), memory the model does not count: the peak can be higher than predicted"
            ));
        }
        if verdict != MemoryVerdict::Exceeds {
            for (flag, what) in &job.unmodelled {
                v = v.warn(format!(
                    "primus: the job sets {flag} ({what}), which the memory model does not model: the prediction may be off"
                ));
            }
        }
        if job.layout_source == LayoutSource::Primus {
            // A Primus job is changed through its overrides: name them so.
            v.message = crate::primus::overrides_text(&v.message);
            for w in &mut v.warnings {
                *w = crate::primus::overrides_text(w);
            }
        }
        for n in &job.notes {
            v = v.warn(one_line(&format!("primus: {n}")));
        }
        v.audit = Self::audit(job, &m, &band);
        v
    }

    /// Audit annotations of a decision.
    fn audit(job: &DerivedJob, m: &MemoryCheck, band: &Band) -> BTreeMap<String, String> {
        let mut audit = BTreeMap::new();
        audit.insert("predicted-gib".to_string(), gib1(m.peak_bytes));
        audit.insert("usable-gib".to_string(), gib1(m.usable_bytes));
        audit.insert("error-band".to_string(), band.describe());
        audit.insert("layout".to_string(), job.layout.label());
        audit.insert("gpu".to_string(), job.scenario.hardware.name.clone());
        audit.insert(
            "layout-source".to_string(),
            job.layout_source.as_str().to_string(),
        );
        audit
    }

    /// Over usable by more than the band: denied, with the nearest layouts that fit.
    fn deny_oom(
        &self,
        s: &Scenario,
        l: &Layout,
        m: &MemoryCheck,
        band: &Band,
        deadline: Instant,
    ) -> Verdict {
        let out = self.suggestions(s, l, self.settings.headroom * m.usable_bytes, deadline);
        let fix = if out.suggestions.is_empty() {
            format!(
                "no layout within two flag changes fits ({} searched{}): use more GPUs or GPUs with more memory",
                out.evaluated,
                if out.timed_out {
                    ", search budget spent"
                } else {
                    ""
                }
            )
        } else {
            format!("fits with {}", Self::suggestion_text(&out))
        };
        Verdict::deny(
            Reason::Oom,
            403,
            format!(
                "predicted {} GiB on pipeline stage {} > {} GiB usable on {} {}, beyond the memory model's measured error band {} (denied above {} GiB); {fix}",
                gib1(m.peak_bytes),
                m.stage,
                gib1(m.usable_bytes),
                gpu_name(s),
                Self::breakdown(m),
                band.describe(),
                gib1(band.deny_above(m.usable_bytes)),
            ),
        )
    }

    /// Over usable by more than the band, but with a flag the model does not model: admitted.
    fn admit_unmodelled(
        &self,
        s: &Scenario,
        m: &MemoryCheck,
        band: &Band,
        unmodelled: &[(String, &'static str)],
    ) -> Verdict {
        let flags: Vec<String> = unmodelled
            .iter()
            .map(|(f, what)| format!("{f} ({what})"))
            .collect();
        Verdict::allow(Reason::Unmodelled).warn(format!(
            "primus: predicted {} GiB on pipeline stage {} > {} GiB usable on {}, beyond the error band {}, but the job sets {}, which the memory model does not model: admitted; it may run out of memory",
            gib1(m.peak_bytes),
            m.stage,
            gib1(m.usable_bytes),
            gpu_name(s),
            band.describe(),
            flags.join(", ")
        ))
    }

    /// Over usable within the band: admitted with a warning (and a layout with more room).
    fn warn_within_band(
        &self,
        s: &Scenario,
        l: &Layout,
        m: &MemoryCheck,
        band: &Band,
        deadline: Instant,
    ) -> Verdict {
        let more = self.more_room(s, l, m, deadline);
        Verdict::allow(Reason::WithinBand).warn(format!(
            "primus: predicted {} GiB on pipeline stage {} > {} GiB usable on {}, within the memory model's measured error band {} (denied above {} GiB): it may run out of memory{more}",
            gib1(m.peak_bytes),
            m.stage,
            gib1(m.usable_bytes),
            gpu_name(s),
            band.describe(),
            gib1(band.deny_above(m.usable_bytes)),
        ))
    }

    /// Below usable but within the headroom or the band's under-prediction of it: admitted
    /// with a warning.
    fn warn_headroom(
        &self,
        s: &Scenario,
        l: &Layout,
        m: &MemoryCheck,
        band: &Band,
        deadline: Instant,
    ) -> Verdict {
        let more = self.more_room(s, l, m, deadline);
        Verdict::allow(Reason::Headroom).warn(format!(
            "primus: predicted {} GiB on pipeline stage {} is within {:.0}% of the {} GiB usable on {} (error band {}): fragmentation or a longer sequence may OOM{more}",
            gib1(m.peak_bytes),
            m.stage,
            ((1.0 - m.peak_bytes / m.usable_bytes) * 100.0).max(0.0).ceil(),
            gib1(m.usable_bytes),
            gpu_name(s),
            band.describe(),
        ))
    }

    /// `; more room with --flags (X GiB)` when a nearby layout fits within the headroom.
    fn more_room(&self, s: &Scenario, l: &Layout, m: &MemoryCheck, deadline: Instant) -> String {
        let out = self.suggestions(s, l, self.settings.headroom * m.usable_bytes, deadline);
        match out.suggestions.first() {
            Some(sg) => format!(
                "; more room with {} ({} GiB)",
                sg.flags(),
                gib1(sg.peak_bytes)
            ),
            None => String::new(),
        }
    }
}

/// On UPDATE: `Some(reason)` when the new object differs from the old one only in metadata,
/// status or `spec.runPolicy.suspend` (queue managers flip it), so no projection is needed.
pub fn unchanged_but_suspend(old: &Value, new: &Value) -> Option<Reason> {
    let old_spec = old.get("spec");
    let new_spec = new.get("spec");
    if old_spec == new_spec {
        return Some(Reason::MetadataOnly);
    }
    let (a, b) = (without_suspend(old_spec?), without_suspend(new_spec?));
    (a == b).then_some(Reason::SuspendOnly)
}

/// A job spec without `runPolicy.suspend`, for comparing.
#[derive(Debug, PartialEq)]
enum Unsuspended {
    /// Read as the typed spec.
    Typed(Box<PyTorchJobSpec>),
    /// A spec the types cannot read (a pod template the vendored CRD did not validate),
    /// compared as JSON: an update of such a job that only flips suspend still needs no
    /// projection.
    Json(Value),
}

fn without_suspend(spec: &Value) -> Unsuspended {
    if let Ok(s) = from_json_at::<PyTorchJobSpec>(spec, "spec") {
        return Unsuspended::Typed(Box::new(s.without_suspend()));
    }
    let mut spec = spec.clone();
    if let Some(rp) = spec.get_mut("runPolicy").and_then(Value::as_object_mut) {
        rp.remove("suspend");
        if rp.is_empty()
            && let Some(s) = spec.as_object_mut()
        {
            s.remove("runPolicy");
        }
    }
    Unsuspended::Json(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn suspend_flips_are_found_in_typed_and_untyped_specs() {
        for template in [
            json!({"spec": {"containers": [{"name": "pytorch", "image": "i"}]}}),
            // A pod template the types cannot read (the vendored CRD keeps it unvalidated).
            json!({"spec": {"containers": "x"}}),
        ] {
            let old = json!({"spec": {"pytorchReplicaSpecs": {"Master": {"template": template}}}});
            let mut new = old.clone();
            new["spec"]["runPolicy"] = json!({"suspend": true});
            assert_eq!(unchanged_but_suspend(&old, &new), Some(Reason::SuspendOnly));
            assert_eq!(
                unchanged_but_suspend(&new, &new),
                Some(Reason::MetadataOnly)
            );
            let mut changed = new.clone();
            changed["spec"]["nprocPerNode"] = json!("4");
            assert_eq!(unchanged_but_suspend(&old, &changed), None);
        }
    }
}
