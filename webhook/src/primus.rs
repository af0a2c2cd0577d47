//! Primus jobs (AMD's training framework over Megatron-LM): a container that runs
//! `primus-cli ... -- train pretrain --config exp.yaml` with `--key value` / `key=value`
//! overrides and `PRIMUS_*` environment variables. [`primus_oracle::primus::read`] turns them
//! into Megatron flags, so the job is checked with the rules of a Megatron job; this module
//! adds what the webhook needs around it: the model from the preset the job names, the layout
//! keys the command line must give (the experiment YAML is in the image, out of sight), and
//! fields named as Primus keys in messages.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;
use primus_crds::annotations;
use primus_oracle::model::ModelCard;
use primus_oracle::primus::{self, Job, assume, keys};
use primus_oracle::profiles::Catalog;

/// The Primus training command a container runs, if any (its command and args, with the
/// literal values of its environment).
pub fn read(c: &Container) -> Option<Job> {
    let words = [&c.command, &c.args]
        .into_iter()
        .flatten()
        .flat_map(|l| l.iter().map(String::as_str));
    let env: Vec<(&str, &str)> = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.as_deref().map(|v| (e.name.as_str(), v)))
        .collect();
    primus::read(words, &env)
}

/// The model of a Primus job: the built-in card of the preset it names (`PRIMUS_MODEL`, or
/// the experiment's file name); `Err(line)` says what to add.
pub fn model(job: &Job, catalog: &Catalog) -> Result<ModelCard, String> {
    match job.card() {
        Some(Ok(card)) => catalog.model(card).cloned().ok_or_else(|| {
            format!("model: the card {card} of the Primus preset is not in the catalog")
        }),
        Some(Err(name)) => Err(format!(
            "model: the Primus preset {name} has no built-in card (presets with one: {}); annotate {} with a preset or {} with a card",
            primus::presets::PRESETS
                .iter()
                .map(|p| p.primus)
                .collect::<Vec<_>>()
                .join(", "),
            annotations::MODEL,
            annotations::MODEL_CARD
        )),
        None => Err(format!(
            "model: the Primus job names no model preset: set {} (e.g. llama3.1_70B), name the experiment after its model (llama3.1_70B-BF16-pretrain.yaml) or annotate {}",
            primus::command::ENV_MODEL,
            annotations::MODEL
        )),
    }
}

/// The layout and training keys the command line leaves to the experiment YAML, which the
/// webhook cannot read (`moe`: the model has experts); keys the operator's annotations give
/// are not needed. `None` when nothing is missing.
pub fn missing_shape(
    job: &Job,
    annotations: &BTreeMap<String, String>,
    moe: bool,
) -> Option<String> {
    let by_layout = annotations.contains_key(annotations::LAYOUT);
    let by_training = annotations.contains_key(annotations::TRAINING);
    let missing: Vec<&str> = assume::missing(&job.overrides, moe)
        .into_iter()
        .filter(|k| match *k {
            "seq_length" | "global_batch_size" => !by_training,
            _ => !by_layout,
        })
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "layout: the Primus command line sets no {} (the experiment YAML is in the image, out of sight): give them as overrides after the experiment (`--{} 8` or `{}=8`) or as PRIMUS_* variables",
            missing.join(", "),
            missing[0],
            missing[0]
        )
    })
}

/// A Megatron flag (or a field named by one) as the Primus key that sets it.
pub fn key(flag_or_field: &str) -> String {
    if flag_or_field.starts_with("--") && !flag_or_field.contains(' ') {
        keys::key_of(flag_or_field)
    } else {
        flag_or_field.to_string()
    }
}

/// Megatron flags in a message (a suggestion such as `--pipeline-model-parallel-size 8
/// --recompute-granularity full`) written as Primus overrides
/// (`--pipeline_model_parallel_size 8 --recompute_granularity full`).
pub fn overrides_text(flags: &str) -> String {
    flags
        .split(' ')
        .map(|w| {
            if w.starts_with("--") {
                format!("--{}", keys::key_of(w))
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::EnvVar;

    fn container(args: &str, env: &[(&str, &str)]) -> Container {
        Container {
            name: "pytorch".into(),
            command: Some(vec!["bash".into(), "-c".into()]),
            args: Some(vec![args.into()]),
            env: Some(
                env.iter()
                    .map(|(n, v)| EnvVar {
                        name: n.to_string(),
                        value: Some(v.to_string()),
                        ..EnvVar::default()
                    })
                    .collect(),
            ),
            ..Container::default()
        }
    }

    #[test]
    fn a_primus_command_gives_flags_a_model_and_what_is_missing() {
        let c = container(
            "primus-cli direct -- train pretrain --config exp/llama3.1_70B-BF16-pretrain.yaml --tensor_model_parallel_size 4 micro_batch_size=2",
            &[("PRIMUS_PP", "2"), ("PRIMUS_SEQ_LENGTH", "8192")],
        );
        let job = read(&c).unwrap();
        let catalog = Catalog::builtin().unwrap();
        assert_eq!(model(&job, &catalog).unwrap().name, "llama3.1-70b");
        let l = job.args.layout(&model(&job, &catalog).unwrap()).unwrap();
        assert_eq!((l.tp, l.pp, l.micro_batch_size), (4, 2, 2));
        let m = missing_shape(&job, &BTreeMap::new(), false).unwrap();
        assert!(m.contains("sets no global_batch_size ("), "{m}");
        assert!(!m.contains("seq_length"), "{m}");
        // Not a Primus command.
        assert!(
            read(&container(
                "torchrun pretrain_gpt.py --tensor-model-parallel-size 2",
                &[]
            ))
            .is_none()
        );
        // No preset: the line says how to name one.
        let c = container("primus-cli direct -- train pretrain --config exp.yaml", &[]);
        let e = model(&read(&c).unwrap(), &catalog).unwrap_err();
        assert!(e.contains("PRIMUS_MODEL"), "{e}");
    }

    #[test]
    fn flags_are_named_as_primus_keys() {
        assert_eq!(
            key("--tensor-model-parallel-size"),
            "tensor_model_parallel_size"
        );
        assert_eq!(
            key("world size (replicas x nprocPerNode)"),
            "world size (replicas x nprocPerNode)"
        );
        assert_eq!(
            overrides_text("--pipeline-model-parallel-size 8 --recompute-granularity full"),
            "--pipeline_model_parallel_size 8 --recompute_granularity full"
        );
    }
}
