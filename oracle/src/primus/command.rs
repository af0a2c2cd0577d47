//! A Primus command line in a container: `primus-cli [global options] <mode> [mode options]
//! -- train pretrain --config exp.yaml [overrides]` (runner/primus-cli; the slurm and
//! container modes nest more `--` sections before the Primus command), or the Python entry
//! itself (`primus train pretrain ...`, `python primus/cli/main.py train pretrain ...`), and the
//! `PRIMUS_*` environment variables AMD's experiment YAMLs read (`${PRIMUS_TP:1}`).

use serde_json::Value;

use super::overrides::{self, Overrides};
use crate::megatron::shell_words;

/// The Primus training command found in a command line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Command {
    /// `train pretrain` or `train posttrain`.
    pub suite: String,
    /// The experiment YAML (`--config` / `--exp`).
    pub config: Option<String>,
    /// The overrides after the experiment (the last setting of a key wins).
    pub overrides: Overrides,
}

/// Options of `train pretrain` that are not overrides, with whether each takes a value
/// (primus/core/launcher/parser.py).
const TRAIN_OPTIONS: &[&str] = &["--config", "--exp", "--data_path", "--export_config"];
/// `--backend_path` takes an optional value (argparse `nargs='?'`).
const OPTIONAL_VALUE: &str = "--backend_path";

/// Words as a shell would split them: words with whitespace (a `bash -c` script) are split.
pub fn tokens<'a>(words: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out = Vec::new();
    for w in words {
        if w.contains(char::is_whitespace) {
            out.extend(shell_words(w));
        } else {
            out.push(w.to_string());
        }
    }
    out
}

/// Whether a word runs Primus: `primus-cli` (any path), its mode scripts, the `primus`
/// entry point, or Primus's `primus/cli/main.py`.
fn is_launcher(w: &str) -> bool {
    let base = w.rsplit('/').next().unwrap_or(w);
    base == "primus-cli"
        || (base.starts_with("primus-cli-") && base.ends_with(".sh"))
        || base == "primus"
        || w.ends_with("primus/cli/main.py")
        || w == "primus.cli.main"
}

/// The Primus training command in `words` (a container's command and args), if any.
pub fn find<'a>(words: impl IntoIterator<Item = &'a str>) -> Option<Command> {
    let t = tokens(words);
    let launcher = t.iter().position(|w| is_launcher(w))?;
    let at = (launcher + 1..t.len().saturating_sub(1))
        .find(|&i| t[i] == "train" && matches!(t[i + 1].as_str(), "pretrain" | "posttrain"))?;
    let mut cmd = Command {
        suite: format!("train {}", t[at + 1]),
        ..Command::default()
    };
    let mut rest: Vec<String> = Vec::new();
    let mut i = at + 2;
    while i < t.len() {
        let w = t[i].as_str();
        i += 1;
        let (name, inline) = match w.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (w, None),
        };
        if TRAIN_OPTIONS.contains(&name) {
            let value = inline.or_else(|| {
                let v = t.get(i).cloned();
                i += 1;
                v
            });
            if matches!(name, "--config" | "--exp") {
                cmd.config = value;
            }
            continue;
        }
        if name == OPTIONAL_VALUE {
            if inline.is_none() && t.get(i).is_some_and(|n| !n.starts_with('-')) {
                i += 1;
            }
            continue;
        }
        rest.push(w.to_string());
    }
    cmd.overrides = overrides::parse(&rest).0;
    Some(cmd)
}

/// `PRIMUS_*` environment variables AMD's Megatron experiment YAMLs read, and the key each
/// sets there (examples/megatron/configs/*/*.yaml: `tensor_model_parallel_size:
/// ${PRIMUS_TP:1}`; docs/03-configuration-reference/environment-variables.md).
pub const ENV: &[(&str, &str)] = &[
    ("PRIMUS_TP", "tensor_model_parallel_size"),
    ("PRIMUS_PP", "pipeline_model_parallel_size"),
    ("PRIMUS_EP", "expert_model_parallel_size"),
    ("PRIMUS_VP", "virtual_pipeline_model_parallel_size"),
    ("PRIMUS_VPP", "virtual_pipeline_model_parallel_size"),
    ("PRIMUS_SEQ_LENGTH", "seq_length"),
    ("PRIMUS_MICRO_BATCH_SIZE", "micro_batch_size"),
    ("PRIMUS_MBS", "micro_batch_size"),
    ("PRIMUS_GLOBAL_BATCH_SIZE", "global_batch_size"),
    ("PRIMUS_GBS", "global_batch_size"),
    ("PRIMUS_NUM_LAYERS", "num_layers"),
];

/// The environment variable naming the model preset (`model: ${PRIMUS_MODEL:llama3_8B}.yaml`).
pub const ENV_MODEL: &str = "PRIMUS_MODEL";

/// Overrides from `PRIMUS_*` variables (`name`, `value` pairs; others are ignored).
pub fn env_overrides<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Overrides {
    let mut out = Overrides::new();
    for (name, value) in env {
        if let Some((_, key)) = ENV.iter().find(|(n, _)| *n == name) {
            out.insert(key.to_string(), overrides::coerce(value));
        }
    }
    out
}

/// The overrides that reach Megatron: the environment's (through the experiment YAML), then
/// the command line's over them.
pub fn merged(env: Overrides, command: &Command) -> Overrides {
    let mut all = env;
    all.extend(command.overrides.clone());
    all
}

/// A value as text, for messages.
pub fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_command_in_every_launch_form() {
        let forms: [&[&str]; 5] = [
            &[
                "primus-cli",
                "direct",
                "--",
                "train",
                "pretrain",
                "--config",
                "exp.yaml",
                "--micro_batch_size",
                "2",
            ],
            &[
                "bash",
                "-c",
                "cd /workspace/Primus && NNODES=2 ./runner/primus-cli slurm -N 4 -- --image x -- --env A=b -- \\\n train pretrain --exp=exp.yaml micro_batch_size=2",
            ],
            &[
                "primus",
                "train",
                "pretrain",
                "--data_path",
                "/d",
                "--backend_path",
                "--config",
                "exp.yaml",
                "--micro_batch_size=2",
            ],
            &[
                "python3",
                "primus/cli/main.py",
                "train",
                "pretrain",
                "--backend_path",
                "/b",
                "--config",
                "exp.yaml",
                "--micro_batch_size",
                "2",
            ],
            &[
                "/opt/Primus/runner/primus-cli-direct.sh",
                "--",
                "train",
                "pretrain",
                "--config",
                "exp.yaml",
                "--micro_batch_size",
                "2",
            ],
        ];
        for f in forms {
            let c = find(f.iter().copied()).unwrap_or_else(|| panic!("{f:?}"));
            assert_eq!(c.suite, "train pretrain");
            assert_eq!(c.config.as_deref(), Some("exp.yaml"), "{f:?}");
            assert_eq!(
                c.overrides.get("micro_batch_size"),
                Some(&json!(2)),
                "{f:?}"
            );
            assert_eq!(c.overrides.len(), 1, "{f:?}: {:?}", c.overrides);
        }
        assert!(find(["torchrun", "pretrain_gpt.py", "--train-iters", "1"]).is_none());
        assert!(find(["primus-cli", "direct", "--", "benchmark", "gemm"]).is_none());
    }

    #[test]
    fn the_command_line_beats_the_environment() {
        let env = env_overrides([
            ("PRIMUS_TP", "4"),
            ("PRIMUS_PP", "2"),
            ("PRIMUS_GBS", "256"),
            ("HOME", "/root"),
        ]);
        let c = find([
            "primus-cli",
            "direct",
            "--",
            "train",
            "pretrain",
            "--pipeline_model_parallel_size",
            "8",
        ])
        .unwrap();
        let all = merged(env, &c);
        assert_eq!(all["tensor_model_parallel_size"], json!(4));
        assert_eq!(all["pipeline_model_parallel_size"], json!(8));
        assert_eq!(all["global_batch_size"], json!(256));
        assert_eq!(all.len(), 3);
    }
}
