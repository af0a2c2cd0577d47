//! `primus timeline -f PLAN -o FILE.svg`: the pipeline schedule as an SVG.

use std::path::PathBuf;

use super::{CliError, Common};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// The TrainingPlan (YAML or JSON); its `spec.parallelism` is the layout to draw.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Where to write the SVG.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

pub fn run(_args: &Args) -> Result<(), CliError> {
    Err(CliError::Failed("not yet".into()))
}
