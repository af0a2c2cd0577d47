//! `primus bench`: benchmark one node for a plan and post the results.
//!
//! `primus bench -f plan.yaml --backend simulate` prints the results as JSON (or writes them
//! with `-o FILE`). In a benchmark pod the operator runs
//! `primus bench --plan NS/NAME --backend B --report-to NS/REPORT`: the plan is read from the
//! API and the results are written as a `BenchmarkReport` owned by the plan. The GPU backends
//! (`rocm`, `cuda`, crate `primus-bench`) are built with the cargo features of the same names;
//! without the feature, or without a GPU, they fail with one clear line. `--compare` prints the
//! measurements against the analytic model (achieved GEMM TFLOP/s, collective bus bandwidth).

use std::path::PathBuf;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use primus_crds::annotations::{BENCH_MANAGER, MANAGED_BY, PLAN_LABEL, REPORT_SIGNATURE};
use primus_crds::provenance;
use primus_crds::{BenchmarkReport, BenchmarkReportSpec, TrainingPlan};
use primus_oracle::bench::measure::{self, Protocol, Provenance};
use primus_oracle::bench::simulate::SimulatedDevice;
use primus_oracle::calibrate::Calibration;
use primus_oracle::calibrate::finalists::analytic_finalists;
use primus_oracle::hardware::Vendor;
use primus_oracle::layout::Layout;
use primus_oracle::parse::parse_yaml_value;
use primus_oracle::plan::Plan;
use primus_oracle::report::{Backend, BenchmarkResults};

use super::{CliError, Common, catalog};

/// Measurement backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// AMD GPUs (HIP, hipBLASLt, RCCL).
    Rocm,
    /// NVIDIA GPUs (CUDA, cuBLASLt, NCCL).
    Cuda,
    /// No GPU: the analytic model's numbers, marked as simulated.
    Simulate,
}

impl From<BackendArg> for Backend {
    fn from(b: BackendArg) -> Backend {
        match b {
            BackendArg::Rocm => Backend::Rocm,
            BackendArg::Cuda => Backend::Cuda,
            BackendArg::Simulate => Backend::Simulate,
        }
    }
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["file", "plan"])))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// TrainingPlan file (YAML or JSON).
    #[arg(short = 'f', long = "file", value_name = "PLAN")]
    pub file: Option<PathBuf>,
    /// A TrainingPlan in the cluster: NAMESPACE/NAME (or NAME in the kubeconfig's namespace).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub plan: Option<String>,
    /// Measurement backend (default: the plan's `spec.benchmark.backend`, else the GPU
    /// vendor's).
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// Shorthand for `--backend simulate`.
    #[arg(long, conflicts_with = "backend")]
    pub simulate: bool,
    /// Write the results as a BenchmarkReport NAMESPACE/NAME (created or updated).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub report_to: Option<String>,
    /// Make the report owned by this TrainingPlan (in the report's namespace); by default the
    /// `--plan` plan owns it when it lives in the same namespace.
    #[arg(long, value_name = "NAME")]
    pub owner_plan: Option<String>,
    /// Sign the report with this attempt token (the operator hands one to each benchmark pod
    /// through a Secret; the report is trusted only when signed with it).
    #[arg(
        long,
        env = "PRIMUS_REPORT_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub report_token: Option<String>,
    /// The attempt the token belongs to (set by the operator beside the token).
    #[arg(long, env = "PRIMUS_REPORT_ATTEMPT", value_name = "N")]
    pub report_attempt: Option<u32>,
    /// Also write the results as JSON to this file.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Untimed warm-up runs per case (GPU backends).
    #[arg(long, env = "PRIMUS_BENCH_WARMUP", default_value_t = 5)]
    pub warmup: u32,
    /// Timed runs per case (GPU backends); the report keeps their median and spread.
    #[arg(
        long,
        env = "PRIMUS_BENCH_RUNS",
        default_value_t = 20,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub runs: u32,
    /// Print the measurements against the analytic model (stdout with `-o`, else stderr).
    #[arg(long)]
    pub compare: bool,
    /// No per-case progress lines on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Also time the kernels of the K best layouts of an analytic search (the tuner's
    /// finalists) at their own one-node shapes, so the operator ranks them by measured
    /// kernels (at most 8; 0: none).
    #[arg(long, value_name = "K", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=primus_oracle::report::MAX_FINALISTS as i64))]
    pub finalists: u32,
}

/// How long the analytic search for finalists may take.
const FINALIST_SEARCH: std::time::Duration = std::time::Duration::from_secs(120);

/// The finalists `--finalists K` asks for (progress on stderr unless quiet).
fn finalists_of(args: &Args, plan: &Plan) -> Vec<Layout> {
    if args.finalists == 0 {
        return Vec::new();
    }
    let deadline = std::time::Instant::now().checked_add(FINALIST_SEARCH);
    let found = analytic_finalists(plan, args.finalists as usize, deadline);
    if !args.quiet {
        let labels: Vec<String> = found.iter().map(Layout::label).collect();
        eprintln!(
            "bench: {} finalist(s) of the analytic search: {}",
            found.len(),
            labels.join("; ")
        );
    }
    found
}

/// `spec.benchmark.backend` of a TrainingPlan document or spec, when set.
fn spec_backend(spec: &serde_json::Value) -> Result<Option<Backend>, CliError> {
    match spec.get("benchmark").and_then(|b| b.get("backend")) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|_| {
            CliError::Input(format!(
                "spec.benchmark.backend: {v} is not one of rocm, cuda, simulate"
            ))
        }),
    }
}

fn choose_backend(args: &Args, from_spec: Option<Backend>, plan: &Plan) -> Backend {
    if args.simulate {
        return Backend::Simulate;
    }
    if let Some(b) = args.backend {
        return b.into();
    }
    from_spec.unwrap_or(match plan.scenario.hardware.vendor {
        Vendor::Amd => Backend::Rocm,
        Vendor::Nvidia => Backend::Cuda,
    })
}

/// Now, RFC 3339 in UTC.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The node this runs on: `NODE_NAME` (the downward API in a benchmark pod), else the host name.
pub fn node_name() -> String {
    if let Ok(n) = std::env::var("NODE_NAME")
        && !n.trim().is_empty()
    {
        return n.trim().to_string();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "unknown".into())
}

/// Run the benchmark of `plan` with `backend`.
pub fn measure(
    plan: &Plan,
    finalists: &[Layout],
    backend: Backend,
    protocol: &Protocol,
    quiet: bool,
) -> Result<BenchmarkResults, CliError> {
    let provenance = Provenance {
        node: node_name(),
        started_at: now_rfc3339(),
        finished_at: String::new(),
    };
    let mut progress = |line: &str| {
        if !quiet {
            eprintln!("bench: {line}");
        }
    };
    let mut results = match backend {
        Backend::Simulate => {
            let mut device = SimulatedDevice::new(&plan.scenario);
            let once = Protocol { warmup: 0, runs: 1 };
            measure::run(plan, finalists, &mut device, &once, provenance, &mut |_| {})
        }
        Backend::Rocm | Backend::Cuda => primus_bench::run(
            backend,
            plan,
            finalists,
            protocol,
            provenance,
            &mut progress,
        ),
    }
    .map_err(|e| CliError::Failed(e.to_string()))?;
    results.finished_at = now_rfc3339();
    Ok(results)
}

/// The measurements of `results` against the analytic model of `plan`'s GPU profile: every
/// op pass (time, achieved and modelled TFLOP/s, ratio), a FLOP-weighted GEMM summary, and
/// every collective (time, bus bandwidth, factor on the scale-up links).
pub fn comparison(plan: &Plan, results: &BenchmarkResults) -> Result<String, CliError> {
    let c = Calibration::new(&plan.scenario, results)
        .map_err(|e| CliError::Failed(format!("comparison: {e}")))?;
    let backend = match results.backend {
        Backend::Rocm => "rocm",
        Backend::Cuda => "cuda",
        Backend::Simulate => "simulate",
    };
    let mut out = format!(
        "{} on {} ({} GPU(s), node {}), backend {backend}, {} / {}, measured {}{}\n\n",
        results.model,
        results.gpu_product,
        results.gpu_count,
        results.node,
        results.driver_version,
        results.runtime_version,
        results.measured_layout.label(),
        if results.reduced_axes.is_empty() {
            String::new()
        } else {
            format!(" (reduced: {})", results.reduced_axes.join(", "))
        }
    );
    out.push_str(&format!(
        "{:<32} {:<22} {:>5} {:>11} {:>11} {:>9} {:>9} {:>7}\n",
        "OP", "SHAPE", "PREC", "MEASURED ms", "MODEL ms", "MEAS TF/s", "MODEL TF/s", "RATIO"
    ));
    for o in &c.ops {
        let shape = if o.kind == "memory-bound" {
            format!("{:.1} MB moved", o.bytes / 1e6)
        } else {
            o.shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("x")
        };
        let tf = |x: f64| {
            if o.flops > 0.0 {
                format!("{x:.1}")
            } else {
                "-".into()
            }
        };
        out.push_str(&format!(
            "{:<32} {:<22} {:>5} {:>11.4} {:>11.4} {:>9} {:>9} {:>7.3}\n",
            o.name,
            shape,
            o.precision.as_str(),
            o.measured_seconds * 1e3,
            o.analytic_seconds * 1e3,
            tf(o.measured_tflops()),
            tf(o.analytic_tflops()),
            o.ratio()
        ));
    }
    for kind in ["gemm", "grouped-gemm", "attention"] {
        let rows: Vec<_> = c.ops.iter().filter(|o| o.kind == kind).collect();
        if rows.is_empty() {
            continue;
        }
        let flops: f64 = rows.iter().map(|o| o.flops).sum();
        let measured: f64 = rows.iter().map(|o| o.measured_seconds).sum();
        let analytic: f64 = rows.iter().map(|o| o.analytic_seconds).sum();
        out.push_str(&format!(
            "{kind}: {} passes, {:.1} TFLOP/s measured vs {:.1} modelled (time ratio {:.3})\n",
            rows.len(),
            flops / measured / 1e12,
            flops / analytic / 1e12,
            measured / analytic
        ));
    }
    if !c.collectives.is_empty() {
        out.push_str(&format!(
            "\n{:<15} {:>5} {:>10} {:>11} {:>11} {:>14} {:>14} {:>7}\n",
            "COLLECTIVE",
            "GPUS",
            "MB",
            "MEASURED ms",
            "MODEL ms",
            "MEAS busbw GB/s",
            "MODEL busbw",
            "FACTOR"
        ));
        for k in &c.collectives {
            out.push_str(&format!(
                "{:<15} {:>5} {:>10.2} {:>11.4} {:>11.4} {:>14.1} {:>14.1} {:>7.3}\n",
                k.op.name(),
                k.group_size,
                k.bytes / 1e6,
                k.measured_seconds * 1e3,
                k.analytic_seconds * 1e3,
                k.measured_bus_gbps,
                k.analytic_bus_gbps,
                k.factor
            ));
        }
    }
    Ok(out)
}

fn protocol(args: &Args) -> Protocol {
    Protocol {
        warmup: args.warmup,
        runs: args.runs,
    }
}

fn print_comparison(args: &Args, plan: &Plan, results: &BenchmarkResults) -> Result<(), CliError> {
    if !args.compare {
        return Ok(());
    }
    let text = comparison(plan, results)?;
    if args.output.is_some() {
        print!("{text}");
    } else {
        eprint!("{text}");
    }
    Ok(())
}

fn write_output(args: &Args, results: &BenchmarkResults) -> Result<(), CliError> {
    if let Some(path) = &args.output {
        let text = serde_json::to_string_pretty(results)
            .map_err(|e| CliError::Failed(format!("JSON output: {e}")))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

pub fn run(args: &Args) -> Result<(), CliError> {
    if let Some(path) = &args.file {
        let c = catalog(&args.common)?;
        let text = super::read_input_file(path)?;
        let source = path.display().to_string();
        let plan = super::plan_from_text(&text, &source, &c)?;
        let doc = parse_yaml_value(&text, &source)?;
        let spec = doc.get("spec").cloned().unwrap_or(doc);
        let backend = choose_backend(args, spec_backend(&spec)?, &plan);
        let finalists = finalists_of(args, &plan);
        let results = measure(&plan, &finalists, backend, &protocol(args), args.quiet)?;
        write_output(args, &results)?;
        print_comparison(args, &plan, &results)?;
        if args.report_to.is_some() {
            return post(args, &plan, &results);
        }
        if args.output.is_none() {
            super::print_json(&results)?;
        }
        return Ok(());
    }
    from_cluster(args)
}

fn from_cluster(args: &Args) -> Result<(), CliError> {
    let reference = args.plan.as_deref().unwrap_or_default();
    let rt = super::kube::runtime()?;
    rt.block_on(async {
        let client = super::kube::client().await?;
        let (ns, name) = super::kube::split_ref(reference, client.default_namespace(), "--plan")?;
        let object = super::kube::get_plan(&client, &ns, &name).await?;
        let c = catalog(&args.common)?;
        let plan = object
            .spec
            .validate(&name, &c, primus_crds::Runner::Cluster)?;
        let from_spec = object.spec.benchmark.as_ref().and_then(|b| b.backend);
        let backend = choose_backend(args, from_spec, &plan);
        let finalists = finalists_of(args, &plan);
        let results = measure(&plan, &finalists, backend, &protocol(args), args.quiet)?;
        write_output(args, &results)?;
        print_comparison(args, &plan, &results)?;
        if args.report_to.is_some() {
            post_async(args, &client, &plan, Some((&ns, &object)), &results).await
        } else {
            if args.output.is_none() {
                super::print_json(&results)?;
            }
            Ok(())
        }
    })
}

fn post(args: &Args, plan: &Plan, results: &BenchmarkResults) -> Result<(), CliError> {
    let rt = super::kube::runtime()?;
    rt.block_on(async {
        let client = super::kube::client().await?;
        post_async(args, &client, plan, None, results).await
    })
}

/// A controller owner reference to a TrainingPlan (no `blockOwnerDeletion`: that would need
/// update on the plan's finalizers).
pub fn plan_owner_reference(plan: &TrainingPlan) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: TrainingPlan::api_version(&()).into_owned(),
        kind: TrainingPlan::kind(&()).into_owned(),
        name: plan.metadata.name.clone()?,
        uid: plan.metadata.uid.clone()?,
        controller: Some(true),
        ..OwnerReference::default()
    })
}

/// An attempt's token: the report is signed with it (`primus_crds::provenance`).
#[derive(Debug, Clone, Copy)]
pub struct Token<'a> {
    pub value: &'a str,
    pub attempt: u32,
}

/// The BenchmarkReport `primus bench --report-to NAMESPACE/NAME` applies: labelled with the
/// plan (when the name fits a label value), owned by `owner` when given, signed with `token`
/// when given (and owned: the signature binds the owning plan), optional fields absent rather
/// than null (the CRD's schema has no `nullable`).
pub fn report_body(
    namespace: &str,
    name: &str,
    plan: &Plan,
    owner: Option<OwnerReference>,
    results: &BenchmarkResults,
    token: Option<Token<'_>>,
) -> Result<serde_json::Value, CliError> {
    let labels = (plan.name.len() <= 63).then(|| {
        [
            (PLAN_LABEL.to_string(), plan.name.clone()),
            (MANAGED_BY.to_string(), "primus".to_string()),
        ]
        .into()
    });
    let spec = BenchmarkReportSpec {
        plan: plan.name.clone(),
        results: results.clone(),
    };
    let annotations = match (token, &owner) {
        (Some(t), Some(o)) => {
            let subject = provenance::Subject {
                namespace,
                report: name,
                plan_uid: &o.uid,
                attempt: t.attempt,
            };
            let signature = provenance::sign(t.value, &subject, &spec);
            Some([(REPORT_SIGNATURE.to_string(), signature)].into())
        }
        _ => None,
    };
    let report = BenchmarkReport {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels,
            annotations,
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec,
    };
    let mut body = serde_json::to_value(&report)
        .map_err(|e| CliError::Failed(format!("benchmarkreport {namespace}/{name}: {e}")))?;
    super::kube::strip_nulls(&mut body);
    Ok(body)
}

/// Create or update the BenchmarkReport (server-side apply under `primus-bench`).
async fn post_async(
    args: &Args,
    client: &kube::Client,
    plan: &Plan,
    source: Option<(&str, &TrainingPlan)>,
    results: &BenchmarkResults,
) -> Result<(), CliError> {
    use super::kube::{api_error, get_plan, split_ref, timed};
    use kube::api::{Api, Patch, PatchParams};

    let target = args.report_to.as_deref().unwrap_or_default();
    let (ns, name) = split_ref(target, client.default_namespace(), "--report-to")?;
    let owner = match (&args.owner_plan, source) {
        (Some(owner), _) => {
            let o = get_plan(client, &ns, owner).await?;
            plan_owner_reference(&o)
        }
        (None, Some((plan_ns, object))) if plan_ns == ns => plan_owner_reference(object),
        _ => None,
    };
    let token = match (&args.report_token, args.report_attempt) {
        (Some(value), Some(attempt)) => Some(Token { value, attempt }),
        (Some(_), None) => {
            return Err(CliError::Input(
                "--report-token needs --report-attempt (PRIMUS_REPORT_ATTEMPT)".into(),
            ));
        }
        _ => None,
    };
    if token.is_some() && owner.is_none() {
        eprintln!("warning: the report has no owning plan, so it is not signed");
    }
    let body = report_body(&ns, &name, plan, owner, results, token)?;
    let api: Api<BenchmarkReport> = Api::namespaced(client.clone(), &ns);
    let what = format!("benchmarkreport {ns}/{name}");
    timed(
        &what,
        api.patch(
            &name,
            &PatchParams::apply(BENCH_MANAGER).force(),
            &Patch::Apply(&body),
        ),
    )
    .await?
    .map_err(|e| api_error(&what, &e))?;
    eprintln!(
        "{what} written: backend {}, {} ops, {} collectives, node {}",
        match results.backend {
            Backend::Rocm => "rocm",
            Backend::Cuda => "cuda",
            Backend::Simulate => "simulate",
        },
        results.ops.len(),
        results.collectives.len(),
        results.node
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use primus_oracle::plan::parse_plan;
    use primus_oracle::profiles::Catalog;

    fn plan(name: &str) -> Plan {
        let text = format!(
            "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata: {{name: {name}}}\nspec:\n  model: {{preset: llama3.1-8b}}\n  cluster: {{gpu: h100-sxm, gpus: 8}}\n  training: {{seqLength: 4096, globalBatchSize: 32}}\n"
        );
        parse_plan(&text, "p.yaml", &Catalog::builtin().unwrap()).unwrap()
    }

    fn has_null(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Null => true,
            serde_json::Value::Array(a) => a.iter().any(has_null),
            serde_json::Value::Object(m) => m.values().any(has_null),
            _ => false,
        }
    }

    #[test]
    fn the_report_is_labelled_owned_and_free_of_nulls() {
        let p = plan("p");
        let results = primus_oracle::bench::simulate::simulate(&p, Provenance::default());
        let mut owner_plan = TrainingPlan::new(
            "p",
            serde_json::from_value(serde_json::json!({
                "model": {"preset": "llama3.1-8b"},
                "cluster": {"gpu": "h100-sxm", "gpus": 8},
                "training": {"seqLength": 4096, "globalBatchSize": 32},
            }))
            .unwrap(),
        );
        owner_plan.metadata.uid = Some("uid-1".into());
        let owner = plan_owner_reference(&owner_plan);
        let token = Token {
            value: "t0k3n",
            attempt: 3,
        };
        let body = report_body("ns", "p-bench-1", &p, owner, &results, Some(token)).unwrap();
        let sig = body["metadata"]["annotations"][REPORT_SIGNATURE]
            .as_str()
            .unwrap();
        assert!(sig.starts_with("v1.3."), "{sig}");
        assert!(!body.to_string().contains("t0k3n"), "the token stays out");
        assert_eq!(body["apiVersion"], "primus.dev/v1alpha1");
        assert_eq!(body["kind"], "BenchmarkReport");
        assert_eq!(body["metadata"]["namespace"], "ns");
        assert_eq!(body["metadata"]["labels"]["primus.dev/plan"], "p");
        assert_eq!(
            body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "primus"
        );
        let refs = &body["metadata"]["ownerReferences"];
        assert_eq!(refs[0]["kind"], "TrainingPlan");
        assert_eq!(refs[0]["uid"], "uid-1");
        assert_eq!(refs[0]["controller"], true);
        // No blockOwnerDeletion: that would need update on the plan's finalizers (chart RBAC).
        assert!(refs[0].get("blockOwnerDeletion").is_none());
        assert_eq!(body["spec"]["plan"], "p");
        assert!(!has_null(&body), "{body}");
    }

    #[test]
    fn a_plan_name_longer_than_a_label_value_is_not_a_label() {
        let long = "p".repeat(64);
        let p = plan(&long);
        let results = primus_oracle::bench::simulate::simulate(&p, Provenance::default());
        let token = Some(Token {
            value: "t",
            attempt: 1,
        });
        let body = report_body("ns", "r", &p, None, &results, token).unwrap();
        assert!(
            body["metadata"].get("annotations").is_none(),
            "unowned: unsigned"
        );
        assert!(body["metadata"].get("labels").is_none(), "{body}");
        assert!(body["metadata"].get("ownerReferences").is_none());
        assert_eq!(body["spec"]["plan"], long.as_str());
    }
}
