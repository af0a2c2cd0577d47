//! Primus (AMD's training framework over Megatron-LM, github.com/AMD-AGI/Primus) in and out:
//! its config keys for the Megatron flags ([`keys`]), its overrides ([`overrides`]), its
//! command line and `PRIMUS_*` environment ([`command`]), its experiment YAMLs
//! ([`experiment`]), its model presets mapped to the built-in cards ([`presets`]), and what
//! a job's memory check assumes for the settings only its experiment YAML holds ([`assume`]).
//!
//! [`read`] turns a container's command line and environment into the Megatron flags the
//! rest of the oracle reads, so a Primus job is checked with the same rules as a Megatron one.

pub mod assume;
pub mod command;
pub mod experiment;
pub mod keys;
pub mod overrides;
pub mod presets;

pub use command::Command;
pub use experiment::Experiment;
pub use overrides::Overrides;
pub use presets::Preset;

use crate::megatron::{MegatronArgs, flag};

/// How a job's model preset was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresetSource {
    /// `PRIMUS_MODEL` in the container's environment.
    Environment,
    /// The experiment file's name (`llama3.1_70B-BF16-pretrain.yaml`).
    FileName,
}

/// A Primus training command and what it says.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub command: Command,
    /// The overrides that reach Megatron from the command line and the environment.
    pub overrides: Overrides,
    /// The same as Megatron flags.
    pub args: MegatronArgs,
    /// The model preset, when one was named, and how it was found.
    pub preset: Option<(String, PresetSource)>,
    /// Things to tell the user (keys Primus ignores, settings read from a file name).
    pub notes: Vec<String>,
}

impl Job {
    /// The built-in card of the job's preset, `Err(name)` for a preset without one.
    pub fn card(&self) -> Option<Result<&'static str, String>> {
        let (name, _) = self.preset.as_ref()?;
        Some(
            presets::by_primus(name)
                .map(|p| p.card)
                .ok_or_else(|| name.clone()),
        )
    }
}

/// Read the Primus training command in a container's `words` (command, then args) with its
/// environment `env` (`name`, `value`); `None` when the container does not run one.
pub fn read<'a>(words: impl IntoIterator<Item = &'a str>, env: &[(&str, &str)]) -> Option<Job> {
    let command = command::find(words)?;
    let overrides = command::merged(command::env_overrides(env.iter().copied()), &command);
    let (mut words, mut notes) = overrides::to_megatron(&overrides);
    let config = command.config.as_deref().unwrap_or_default();
    if !overrides.contains_key("fp8") && presets::fp8_in_file_name(config) {
        words.extend([flag::FP8_FORMAT.to_string(), "hybrid".to_string()]);
        notes.push(format!(
            "FP8 training read from the experiment's file name ({config})"
        ));
    }
    let env_model = env
        .iter()
        .find(|(n, _)| *n == command::ENV_MODEL)
        .map(|(_, v)| presets::stem(v).to_string())
        .filter(|v| !v.is_empty());
    let preset = match env_model {
        Some(m) => Some((m, PresetSource::Environment)),
        None => {
            presets::in_file_name(config).map(|p| (p.primus.to_string(), PresetSource::FileName))
        }
    };
    if let Some(p) = preset.as_ref().and_then(|(n, _)| presets::by_primus(n))
        && let Some(d) = p.differs
    {
        notes.push(format!("model {} as card {}: {d}", p.primus, p.card));
    }
    let args = MegatronArgs::parse(words.iter().map(String::as_str));
    Some(Job {
        command,
        overrides,
        args,
        preset,
        notes,
    })
}
