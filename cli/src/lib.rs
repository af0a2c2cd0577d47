//! The `primus` command line: argument types and one module per subcommand, over the pure
//! oracle (`primus-oracle`). The edges live here: files and terminals, the Kubernetes API
//! (`primus bench --plan/--report-to`, `primus report`, through `primus-crds`' types), the GPU
//! backends (`primus-bench`, cargo features `rocm` and `cuda`) and the tuning agent's
//! OpenAI-compatible HTTP client ([`agent`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use primus_crds::{Runner, TrainingPlanSpec};
use primus_oracle::error::PlanError;
use primus_oracle::plan::{Plan, read_document};
use primus_oracle::profiles::Catalog;

pub mod agent;
pub mod bench;
pub mod import;
pub mod kube;
pub mod memory;
pub mod profiles;
pub mod project;
pub mod report;
pub mod timeline;
pub mod tune;
pub mod validate;

/// Output format of the reporting subcommands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum Output {
    /// A human table.
    #[default]
    Table,
    /// One JSON object (DESIGN.md section 4).
    Json,
}

/// Options every subcommand that reads a plan shares.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// Extra profiles directory (with `models/` and `hardware/` subdirectories) whose YAML files
    /// add to or override the built-in ones.
    #[arg(long, env = "PRIMUS_PROFILES_DIR", global = true)]
    pub profiles_dir: Option<PathBuf>,
}

/// How a subcommand failed: bad input (exit 2) or a failure while doing the work (exit 1).
#[derive(Debug)]
pub enum CliError {
    /// The user's input is wrong: one line naming the field.
    Input(String),
    /// Something else went wrong.
    Failed(String),
}

impl From<PlanError> for CliError {
    fn from(e: PlanError) -> Self {
        CliError::Input(e.to_string())
    }
}

impl From<primus_oracle::error::FieldError> for CliError {
    fn from(e: primus_oracle::error::FieldError) -> Self {
        CliError::Input(e.to_string())
    }
}

impl CliError {
    /// Print the error as one line on stderr and return the exit code.
    pub fn report(&self) -> ExitCode {
        match self {
            CliError::Input(m) => {
                eprintln!("error: {m}");
                ExitCode::from(2)
            }
            CliError::Failed(m) => {
                eprintln!("error: {m}");
                ExitCode::from(1)
            }
        }
    }
}

/// The built-in catalog plus the user's profiles directory.
pub fn catalog(common: &Common) -> Result<Catalog, CliError> {
    let mut c = Catalog::builtin()?;
    if let Some(dir) = &common.profiles_dir {
        c.load_dir(dir)?;
    }
    Ok(c)
}

/// Load a plan file and check it with the validator the operator and the webhook share
/// ([`TrainingPlanSpec::validate`]; the CLI runs the `agent` searcher itself).
pub fn plan(common: &Common, path: &Path) -> Result<(Catalog, Plan), CliError> {
    let c = catalog(common)?;
    let text = read_input_file(path)?;
    let p = plan_from_text(&text, &path.display().to_string(), &c)?;
    Ok((c, p))
}

/// The text of a document the CLI reads whole (a plan, a calibration report), bounded to
/// [`primus_oracle::bounds::limits::DOCUMENT_BYTES`], its error naming the path.
pub fn read_input_file(path: &Path) -> Result<String, PlanError> {
    primus_oracle::bounds::read_input(path, primus_oracle::bounds::limits::DOCUMENT_BYTES)
}

/// A plan document (YAML or JSON text), checked by the shared validator.
pub fn plan_from_text(text: &str, source: &str, catalog: &Catalog) -> Result<Plan, CliError> {
    let (spec, name) = read_document(text, source)?;
    let spec = TrainingPlanSpec::from_json(spec)?;
    Ok(spec.validate(&name, catalog, Runner::Cli)?)
}

/// Serialize to pretty JSON on stdout.
/// What a scenario runs, in the words every table's headline uses: `MODEL on N x GPU
/// (PRECISION), seq S, global batch B`.
pub fn scenario_headline(s: &primus_oracle::scenario::Scenario) -> String {
    let model = if s.model.name.is_empty() {
        "model"
    } else {
        &s.model.name
    };
    format!(
        "{model} on {} x {} ({}), seq {}, global batch {}",
        s.cluster.gpus,
        s.hardware.name,
        s.training.precision.as_str(),
        s.training.seq_length,
        s.training.global_batch_size,
    )
}

pub fn print_json<T: serde::Serialize>(value: &T) -> Result<(), CliError> {
    let s = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::Failed(format!("JSON output: {e}")))?;
    println!("{s}");
    Ok(())
}
