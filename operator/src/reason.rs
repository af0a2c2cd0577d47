//! Condition and Event reasons: one enum with the CamelCase word written to the API and the
//! severity that gives an Event its type, so the type is never guessed from the word.

use kube::runtime::events::EventType;

/// How an Event about a reason is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Progress, or a state a user chose (benchmark disabled, no auto-submit).
    Normal,
    /// Something a user must look at: a failure, a stall, a limit.
    Warning,
}

impl Severity {
    pub fn event_type(self) -> EventType {
        match self {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        }
    }
}

/// Why a condition has its status (or, for the last three, what an Event announces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    // Benchmarked.
    /// This plan's benchmark report arrived.
    ReportReceived,
    /// A recent matching report was reused.
    ReportReused,
    /// A benchmark pod runs (also Ready's reason meanwhile).
    Benchmarking,
    /// Every attempt failed.
    BenchmarkFailed,
    /// `spec.benchmark.enabled` is false.
    Disabled,
    /// A later step waits for the benchmark.
    WaitingForBenchmark,
    /// The report's measurements were beyond their band and clamped.
    RatiosClamped,
    /// `spec.benchmark.image` is not in the operator's allow-list.
    ImageNotAllowed,
    /// A report named for the plan was not believed (Event).
    ReportIgnored,
    // Projected and Tuned.
    Projected,
    Tuned,
    /// Searcher `none`: `spec.parallelism` as given.
    LayoutGiven,
    /// The tuner is still searching.
    Searching,
    /// Searcher `agent` without a working LLM endpoint: the exhaustive search's answer.
    AgentUnavailable,
    NoFeasibleLayout,
    // JobCreated.
    Created,
    Started,
    /// Suspended by the plan (`spec.job.suspend: true`): waiting for a review.
    Suspended,
    /// Suspended, not by the plan: waiting for a queue (Kueue, Volcano) to admit it.
    Queued,
    /// The job had not started and runs another layout: it is being replaced.
    Replacing,
    /// The job started with another layout and is left alone.
    LayoutDiffers,
    AutoSubmitDisabled,
    PyTorchJobCrdMissing,
    /// `spec.job.kind: TrainJob` and Kubeflow Trainer v2's TrainJob CRD is not installed.
    TrainJobCrdMissing,
    JobNameTaken,
    // DriftWithinTolerance.
    WithinTolerance,
    OutsideTolerance,
    NoMeasurement,
    QueryFailed,
    /// `spec.drift.prometheus.url` is not in the operator's allow-list.
    UrlNotAllowed,
    // Ready, Reconciling, Stalled.
    Ready,
    Progressing,
    /// The tuner is searching (Ready and Reconciling).
    Tuning,
    /// Ready's reason while the job is being replaced.
    Reconciling,
    /// Reconciling's reason while the job is being replaced.
    ReplacingJob,
    InvalidSpec,
    // Writes the API server refused (Benchmarked, JobCreated, and Ready/Stalled for the status).
    BenchmarkPodRefused,
    JobRefused,
    StatusWriteRefused,
    // Events of actions taken.
    BenchmarkStarted,
    JobCreated,
    JobReplaced,
}

impl Reason {
    /// The word written to the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::ReportReceived => "ReportReceived",
            Reason::ReportReused => "ReportReused",
            Reason::Benchmarking => "Benchmarking",
            Reason::BenchmarkFailed => "BenchmarkFailed",
            Reason::Disabled => "Disabled",
            Reason::WaitingForBenchmark => "WaitingForBenchmark",
            Reason::RatiosClamped => "RatiosClamped",
            Reason::ImageNotAllowed => "ImageNotAllowed",
            Reason::ReportIgnored => "ReportIgnored",
            Reason::Projected => "Projected",
            Reason::Tuned => "Tuned",
            Reason::LayoutGiven => "LayoutGiven",
            Reason::Searching => "Searching",
            Reason::AgentUnavailable => "AgentUnavailable",
            Reason::NoFeasibleLayout => "NoFeasibleLayout",
            Reason::Created => "Created",
            Reason::Started => "Started",
            Reason::Suspended => "Suspended",
            Reason::Queued => "Queued",
            Reason::Replacing => "Replacing",
            Reason::LayoutDiffers => "LayoutDiffers",
            Reason::AutoSubmitDisabled => "AutoSubmitDisabled",
            Reason::PyTorchJobCrdMissing => "PyTorchJobCRDMissing",
            Reason::TrainJobCrdMissing => "TrainJobCRDMissing",
            Reason::JobNameTaken => "JobNameTaken",
            Reason::WithinTolerance => "WithinTolerance",
            Reason::OutsideTolerance => "OutsideTolerance",
            Reason::NoMeasurement => "NoMeasurement",
            Reason::QueryFailed => "QueryFailed",
            Reason::UrlNotAllowed => "URLNotAllowed",
            Reason::Ready => "Ready",
            Reason::Progressing => "Progressing",
            Reason::Tuning => "Tuning",
            Reason::Reconciling => "Reconciling",
            Reason::ReplacingJob => "ReplacingJob",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::BenchmarkPodRefused => "BenchmarkPodRefused",
            Reason::JobRefused => "JobRefused",
            Reason::StatusWriteRefused => "StatusWriteRefused",
            Reason::BenchmarkStarted => "BenchmarkStarted",
            Reason::JobCreated => "JobCreated",
            Reason::JobReplaced => "JobReplaced",
        }
    }

    /// The type of an Event about this reason. (`Tuning` warns: a plan that was Ready turns
    /// not-Ready while a new generation is searched; kept as the operator always did.)
    pub fn severity(self) -> Severity {
        match self {
            Reason::BenchmarkFailed
            | Reason::NoFeasibleLayout
            | Reason::PyTorchJobCrdMissing
            | Reason::TrainJobCrdMissing
            | Reason::JobNameTaken
            | Reason::OutsideTolerance
            | Reason::QueryFailed
            | Reason::UrlNotAllowed
            | Reason::RatiosClamped
            | Reason::ImageNotAllowed
            | Reason::ReportIgnored
            | Reason::InvalidSpec
            | Reason::BenchmarkPodRefused
            | Reason::JobRefused
            | Reason::StatusWriteRefused
            | Reason::AgentUnavailable
            | Reason::Tuning => Severity::Warning,
            _ => Severity::Normal,
        }
    }

    /// What a stalled plan waits for.
    pub fn waiting_for(self) -> &'static str {
        match self {
            Reason::PyTorchJobCrdMissing
            | Reason::TrainJobCrdMissing
            | Reason::JobNameTaken
            | Reason::BenchmarkPodRefused
            | Reason::JobRefused
            | Reason::StatusWriteRefused => "waiting for an outside change",
            _ => "waiting for a spec change",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
