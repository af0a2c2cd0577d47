//! `primus`: plan a distributed training job from a laptop. Project memory and step time of a
//! layout, tune the layout, validate the oracle against published runs.
//!
//! Options that describe the environment rather than the job also read environment variables
//! (`--help` lists them): `PRIMUS_PROFILES_DIR`, the agent's `PRIMUS_AGENT_*` and the
//! benchmark protocol's `PRIMUS_BENCH_WARMUP` / `PRIMUS_BENCH_RUNS`. What a command reads and
//! writes (plan files, `--plan`, `--report-to`, `-o`) is given on the command line only.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use primus_cli as cli;

#[derive(Debug, Parser)]
#[command(name = "primus", version, about = "Project, tune and validate Megatron-style training layouts", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the built-in (and --profiles-dir) model cards and hardware profiles.
    Profiles(cli::profiles::Args),
    /// Per-stage, per-GPU memory of the plan's layout (weights, gradients, optimizer,
    /// activations, other) against the GPU's capacity.
    Memory(cli::memory::Args),
    /// Benchmark one node for a plan (or simulate it) and print the results or post them as a
    /// BenchmarkReport.
    Bench(cli::bench::Args),
    /// Project step time, throughput, MFU and memory of the plan's layout (`spec.parallelism`).
    Project(cli::project::Args),
    /// Project every row of a published-measurements CSV and report the errors.
    Validate(cli::validate::Args),
    /// Draw the pipeline schedule of the plan's layout as an SVG.
    Timeline(cli::timeline::Args),
    /// Turn a Primus experiment YAML (with overrides) or a Megatron command line into a
    /// TrainingPlan.
    Import(cli::import::Args),
    /// Report measured throughput of a running job to its TrainingPlan (`status.measured`).
    Report(cli::report::Args),
    /// Search the plan's layouts (memory pre-filter, then projection) and report the best, or
    /// print it as a PyTorchJob or a TrainJob (`--emit pytorchjob|trainjob`).
    Tune(cli::tune::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Profiles(a) => cli::profiles::run(a),
        Command::Memory(a) => cli::memory::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Report(a) => cli::report::run(a),
        Command::Project(a) => cli::project::run(a),
        Command::Validate(a) => cli::validate::run(a),
        Command::Timeline(a) => cli::timeline::run(a),
        Command::Tune(a) => cli::tune::run(a),
        Command::Import(a) => cli::import::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(),
    }
}
