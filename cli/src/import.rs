//! `primus import FILE [OVERRIDES...] [--gpu G] [--gpus N] [--name NAME] [-o OUT]`: an
//! existing recipe as a TrainingPlan, in one command. FILE is a Primus experiment YAML
//! (`modules: {pre_trainer: {model: llama3.1_70B.yaml, overrides: {...}}}`; `${PRIMUS_*}`
//! references read from the environment; OVERRIDES after it as on a `primus-cli` command
//! line, `--key value` or `key=value`) or a Megatron command line (a script with
//! `pretrain_gpt.py --tensor-model-parallel-size ...`). The plan has the recipe's model (the
//! preset's built-in card, else the architecture flags inline), training settings and layout
//! (`spec.parallelism`, the reference the tuner compares against); an experiment also gets
//! `spec.job: {launcher: primus, experiment: FILE}` so the job runs it with the chosen layout.

use std::path::PathBuf;

use primus_oracle::layout::Layout;
use primus_oracle::megatron::{MegatronArgs, shell_words};
use primus_oracle::model::ModelCard;
use primus_oracle::primus::{self, experiment, overrides};
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::Training;
use serde_json::{Value, json};

use super::{CliError, Common, catalog};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// A Primus experiment YAML or a file with a Megatron command line.
    pub file: PathBuf,
    /// Primus overrides after the experiment (`--tensor_model_parallel_size 8`,
    /// `micro_batch_size=2`), as on a `primus-cli` command line.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub overrides: Vec<String>,
    /// GPU profile (default: a directory of the file's path named after one, e.g. MI300X/).
    #[arg(long)]
    pub gpu: Option<String>,
    /// Total GPUs (default: one node of the profile).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Plan name (default: the file's stem, made a Kubernetes name).
    #[arg(long)]
    pub name: Option<String>,
    /// Write the plan here instead of standard output.
    #[arg(short = 'o', long)]
    pub out: Option<PathBuf>,
}

/// What a recipe says.
struct Recipe {
    args: MegatronArgs,
    /// Card name of the preset the recipe names, if any.
    preset: Option<&'static str>,
    /// The experiment path, for a Primus recipe.
    experiment: Option<String>,
    notes: Vec<String>,
}

/// The most bytes read from a recipe file.
const MAX_FILE: u64 = 4 << 20;

fn read_recipe(a: &Args) -> Result<Recipe, CliError> {
    let shown = a.file.display().to_string();
    let meta = std::fs::metadata(&a.file).map_err(|e| CliError::Input(format!("{shown}: {e}")))?;
    if meta.len() > MAX_FILE {
        return Err(CliError::Input(format!(
            "{shown}: {} bytes is more than a recipe (at most {MAX_FILE})",
            meta.len()
        )));
    }
    // Bounded as it is read: a device or pipe has no length to check beforehand.
    let text = primus_oracle::bounds::read_text_file(&a.file, MAX_FILE)
        .map_err(|e| CliError::Input(format!("{shown}: {e}")))?;
    let is_experiment = primus_oracle::parse::parse_yaml_value(&text, &shown)
        .ok()
        .is_some_and(|v| v.get("modules").is_some());
    if !is_experiment {
        let mut words = shell_words(&text);
        words.extend(a.overrides.iter().cloned());
        return Ok(Recipe {
            args: MegatronArgs::parse(words.iter().map(String::as_str)),
            preset: None,
            experiment: None,
            notes: Vec::new(),
        });
    }
    let env = |name: &str| std::env::var(name).ok();
    let e = experiment::parse(&text, &shown, &env)?;
    let mut all = e.overrides.clone();
    let (given, skipped) = overrides::parse(&a.overrides);
    all.extend(given);
    let (words, mut notes) = overrides::to_megatron(&all);
    if !skipped.is_empty() {
        notes.push(format!("not overrides, ignored: {}", skipped.join(" ")));
    }
    if let Some(m) = &e.model
        && e.card().is_none()
    {
        notes.push(format!(
            "the preset {m} has no built-in card: the architecture must come from the overrides"
        ));
    }
    Ok(Recipe {
        args: MegatronArgs::parse(words.iter().map(String::as_str)),
        preset: e.card(),
        experiment: Some(shown),
        notes,
    })
}

/// The GPU profile: `--gpu`, else a directory of the path named after a profile.
fn gpu_of(a: &Args, c: &Catalog) -> Result<String, CliError> {
    if let Some(g) = &a.gpu {
        return Ok(g.clone());
    }
    let names = c.hardware_names();
    a.file
        .components()
        .filter_map(|p| p.as_os_str().to_str())
        .find_map(|dir| {
            names
                .iter()
                .find(|n| n.eq_ignore_ascii_case(dir))
                .map(|n| n.to_string())
        })
        .ok_or_else(|| {
            CliError::Input(format!(
                "--gpu: missing, and no directory of {} names a GPU profile ({})",
                a.file.display(),
                names.join(", ")
            ))
        })
}

/// A Kubernetes name from a file stem (`llama3.1_70B-BF16-pretrain` -> `llama3-1-70b-bf16-pretrain`).
fn kube_name(stem: &str) -> String {
    let mut out = String::new();
    for ch in stem.chars().flat_map(char::to_lowercase) {
        if ch.is_ascii_alphanumeric() {
            out.push(ch);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out: String = out.trim_matches('-').chars().take(63).collect();
    if out.is_empty() {
        "imported".into()
    } else {
        out.trim_end_matches('-').to_string()
    }
}

/// The model: the preset's card (architecture overrides applied), else the flags' card.
fn model_of(r: &Recipe, c: &Catalog) -> Result<(Value, ModelCard), CliError> {
    if let Some(name) = r.preset {
        let card = c
            .model(name)
            .cloned()
            .ok_or_else(|| CliError::Input(format!("model card {name} is not in the catalog")))?;
        let changed = primus::presets::with_architecture(card.clone(), &r.args)?;
        if changed == card {
            return Ok((json!({"preset": name}), card));
        }
        return Ok((json!({"card": changed}), changed));
    }
    match r.args.model_card()? {
        Some(card) => Ok((json!({"card": card}), card)),
        None => Err(CliError::Input(
            "model: the recipe names no preset with a built-in card and gives no complete architecture (--num-layers --hidden-size --num-attention-heads --vocab-size)".into(),
        )),
    }
}

/// The plan of a recipe (a TrainingPlan as JSON) and notes for the user.
pub fn plan(a: &Args, c: &Catalog) -> Result<(Value, Vec<String>), CliError> {
    let r = read_recipe(a)?;
    let (model, card) = model_of(&r, c)?;
    let training: Training = r.args.training()?.ok_or_else(|| {
        CliError::Input(
            "training: the recipe sets no sequence length and global batch size (seq_length, global_batch_size)".into(),
        )
    })?;
    let layout: Layout = r.args.layout(&card)?;
    let gpu = gpu_of(a, c)?;
    let per_node = c
        .hardware(&gpu)
        .ok_or_else(|| CliError::Input(format!("--gpu: unknown GPU profile {gpu}")))?
        .gpus_per_node;
    let gpus = a.gpus.unwrap_or(per_node);
    let stem = a
        .file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("plan");
    let name = a.name.clone().unwrap_or_else(|| kube_name(stem));
    let mut spec = json!({
        "model": model,
        "cluster": {"gpu": gpu, "gpus": gpus, "gpusPerNode": per_node.min(gpus)},
        "training": training,
        "parallelism": layout,
    });
    if let Some(exp) = &r.experiment {
        spec["job"] = json!({"launcher": "primus", "experiment": exp});
    }
    let plan = json!({
        "apiVersion": "primus.dev/v1alpha1",
        "kind": "TrainingPlan",
        "metadata": {"name": name},
        "spec": spec,
    });
    Ok((plan, r.notes))
}

pub fn run(a: &Args) -> Result<(), CliError> {
    let c = catalog(&a.common)?;
    let (plan, notes) = plan(a, &c)?;
    let yaml = serde_saphyr::to_string(&plan)
        .map_err(|e| CliError::Failed(format!("writing the plan: {e}")))?;
    let text = format!(
        "# Imported by `primus import {}`: the recipe's model, training and layout.\n{yaml}",
        a.file.display()
    );
    for n in &notes {
        eprintln!("primus import: {n}");
    }
    match &a.out {
        Some(p) => {
            std::fs::write(p, text).map_err(|e| CliError::Failed(format!("{}: {e}", p.display())))
        }
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_stems_become_kubernetes_names() {
        assert_eq!(
            kube_name("llama3.1_70B-BF16-pretrain"),
            "llama3-1-70b-bf16-pretrain"
        );
        assert_eq!(kube_name("__"), "imported");
    }
}
