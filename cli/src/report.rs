//! `primus report --plan [NAMESPACE/]NAME --tokens-per-second X`: a training script tells the
//! plan what it measures. Writes `status.measured` of the TrainingPlan through the status
//! subresource with server-side apply under the field manager `primus-report`, which owns that
//! field alone (the operator applies the rest of the status under its own manager and compares
//! the two to compute drift).

use primus_oracle::bounds::limits;

use super::CliError;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The TrainingPlan: NAMESPACE/NAME, or NAME in the kubeconfig's (or pod's) namespace.
    #[arg(long, value_name = "[NAMESPACE/]NAME")]
    pub plan: String,
    /// Measured training throughput, tokens per second per GPU.
    #[arg(long, value_name = "X")]
    pub tokens_per_second: f64,
    /// Who measured it (default `primus report`).
    #[arg(long, default_value = "primus report")]
    pub source: String,
}

/// Check the measured value: a positive, finite number no real run exceeds
/// ([`limits::TOKENS_PER_SECOND_PER_GPU`]).
pub fn check_tokens_per_second(x: f64) -> Result<f64, CliError> {
    if !(x.is_finite() && x > 0.0) {
        return Err(CliError::Input(format!(
            "--tokens-per-second: must be a positive number, got {x}"
        )));
    }
    if x > limits::TOKENS_PER_SECOND_PER_GPU {
        return Err(CliError::Input(format!(
            "--tokens-per-second: {x:e} is beyond any real run (at most {:e} per GPU)",
            limits::TOKENS_PER_SECOND_PER_GPU
        )));
    }
    Ok(x)
}

/// The status patch `primus report` applies.
pub fn measured_patch(tokens_per_second: f64, source: &str, at: &str) -> serde_json::Value {
    use kube::Resource;
    use primus_crds::TrainingPlan;
    serde_json::json!({
        "apiVersion": TrainingPlan::api_version(&()),
        "kind": TrainingPlan::kind(&()),
        "status": {
            "measured": {
                "tokensPerSecondPerGpu": tokens_per_second,
                "reportedAt": at,
                "source": source,
            }
        }
    })
}

pub fn run(args: &Args) -> Result<(), CliError> {
    use super::kube::{api_error, client, runtime, split_ref, timed};
    use kube::api::{Api, Patch, PatchParams};
    use primus_crds::TrainingPlan;
    use primus_crds::annotations::REPORT_MANAGER;

    let x = check_tokens_per_second(args.tokens_per_second)?;
    let rt = runtime()?;
    rt.block_on(async {
        let client = client().await?;
        let (ns, name) = split_ref(&args.plan, client.default_namespace(), "--plan")?;
        let api: Api<TrainingPlan> = Api::namespaced(client, &ns);
        let what = format!("trainingplan {ns}/{name}");
        let patch = measured_patch(x, &args.source, &super::bench::now_rfc3339());
        timed(
            &what,
            api.patch_status(
                &name,
                &PatchParams::apply(REPORT_MANAGER).force(),
                &Patch::Apply(&patch),
            ),
        )
        .await?
        .map_err(|e| api_error(&what, &e))?;
        println!("{what}: measured {x} tokens/s/GPU reported");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_positive_finite_throughput_is_accepted() {
        assert!(check_tokens_per_second(1234.5).is_ok());
        assert!(check_tokens_per_second(limits::TOKENS_PER_SECOND_PER_GPU).is_ok());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e308, 1.01e8] {
            let e = check_tokens_per_second(bad).unwrap_err();
            assert!(matches!(e, CliError::Input(m) if m.starts_with("--tokens-per-second")));
        }
    }

    #[test]
    fn the_patch_touches_only_status_measured() {
        let p = measured_patch(100.0, "primus report", "2026-01-01T00:00:00Z");
        let status = p["status"].as_object().unwrap();
        assert_eq!(status.keys().collect::<Vec<_>>(), vec!["measured"]);
        assert_eq!(p["status"]["measured"]["tokensPerSecondPerGpu"], 100.0);
        assert!(p.get("spec").is_none());
        assert_eq!(p["apiVersion"], "primus.dev/v1alpha1");
        assert_eq!(p["kind"], "TrainingPlan");
    }
}
