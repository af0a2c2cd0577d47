//! The Megatron flags of a layout written into a container's command line: flags the writer
//! owns are removed from the template's arguments (with their values) and the layout's are
//! appended, in an argument list or at the end of a `bash -c` script alike.

use k8s_openapi::api::core::v1::Container;
use primus_oracle::megatron::flag;

/// Flags the writer owns: removed from the template's arguments before ours are appended, with
/// whether each takes a value.
fn owned_flags() -> Vec<(&'static str, bool)> {
    let valued = [
        flag::TP,
        flag::PP,
        flag::VPP_LAYERS,
        flag::VPP_SIZE,
        flag::CP,
        flag::EP,
        flag::ETP,
        flag::MBS,
        flag::GBS,
        flag::SEQ,
        flag::RECOMPUTE_GRANULARITY,
        flag::RECOMPUTE_METHOD,
        flag::RECOMPUTE_NUM_LAYERS,
        flag::RECOMPUTE_MODULES,
        flag::FIRST_STAGE_LAYERS,
        flag::LAST_STAGE_LAYERS,
        flag::PIPELINE_LAYOUT,
        flag::VPP_STAGES,
        flag::CE_FUSION_IMPL,
        flag::FP8_FORMAT,
        flag::NUM_LAYERS,
        flag::HIDDEN,
        flag::FFN_HIDDEN,
        flag::HEADS,
        flag::QUERY_GROUPS,
        flag::KV_CHANNELS,
        flag::VOCAB,
        flag::NORMALIZATION,
        flag::NUM_EXPERTS,
        flag::MOE_TOPK,
        flag::MOE_FFN_HIDDEN,
        flag::MOE_SHARED_FFN,
        flag::MOE_FIRST_DENSE,
        flag::MOE_CAPACITY,
        flag::Q_LORA,
        flag::KV_LORA,
        flag::QK_HEAD_DIM,
        flag::QK_POS_HEAD_DIM,
        flag::V_HEAD_DIM,
        flag::MTP_LAYERS,
        flag::ATTENTION_DROPOUT,
        flag::HIDDEN_DROPOUT,
        flag::MAIN_GRADS_DTYPE,
        flag::MAIN_PARAMS_DTYPE,
        flag::EXP_AVG_DTYPE,
        flag::EXP_AVG_SQ_DTYPE,
        flag::OPTIMIZER_OFFLOAD_FRACTION,
        flag::CPU_OFFLOADING_NUM_LAYERS,
    ];
    let switches = [
        flag::GRAD_REDUCE_IN_BF16,
        flag::PRECISION_AWARE_OPTIMIZER,
        flag::OPTIMIZER_CPU_OFFLOAD,
        flag::FP8_PARAM_GATHER,
        flag::DIST_OPT,
        flag::SP,
        flag::FSDP,
        flag::ZERO_BUBBLE,
        flag::ACCOUNT_EMBEDDING,
        flag::ACCOUNT_LOSS,
        flag::CE_FUSION,
        flag::TP_COMM_OVERLAP,
        flag::OVERLAP_GRAD_REDUCE,
        flag::OVERLAP_PARAM_GATHER,
        flag::BF16,
        "--fp16",
        flag::GQA,
        flag::SWIGLU,
        flag::UNTIE,
        flag::QK_LAYERNORM,
        flag::MLA,
    ];
    valued
        .iter()
        .map(|f| (*f, true))
        .chain(switches.iter().map(|f| (*f, false)))
        .chain(primus_oracle::megatron::option_flags())
        .collect()
}

/// The owned flags plus every flag in `ours` (what the writer is about to append), with
/// whether each takes a value.
fn owned_with(ours: &[String]) -> Vec<(&str, bool)> {
    let mut owned = owned_flags();
    for (i, w) in ours.iter().enumerate() {
        if w.starts_with("--") && !owned.iter().any(|(f, _)| *f == w.as_str()) {
            let takes_value = ours.get(i + 1).is_some_and(|n| !n.starts_with("--"));
            owned.push((w.as_str(), takes_value));
        }
    }
    owned
}

/// Owned flags that take a list (every word up to the next flag): the oracle's list.
const LIST_FLAGS: &[&str] = primus_oracle::megatron::LISTS;

/// Indices of the words to keep after removing the owned flags (and their values; all of them
/// for a list flag).
fn kept_words<S: AsRef<str>>(words: &[S], owned: &[(&str, bool)]) -> Vec<usize> {
    let mut keep = Vec::new();
    let mut skip_value = false;
    let mut skip_list = false;
    for (i, w) in words.iter().enumerate() {
        let w = w.as_ref();
        if skip_list && !w.starts_with("--") {
            continue;
        }
        skip_list = false;
        if std::mem::take(&mut skip_value) && !w.starts_with("--") {
            continue;
        }
        let name = w.split_once('=').map(|(k, _)| k).unwrap_or(w);
        match owned.iter().find(|(f, _)| *f == name) {
            Some(_) if LIST_FLAGS.contains(&name) => skip_list = !w.contains('='),
            Some((_, takes_value)) => skip_value = *takes_value && !w.contains('='),
            None => keep.push(i),
        }
    }
    keep
}

/// Quote a word for a POSIX shell when it needs it.
fn shell_quote(w: &str) -> String {
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=./:,+@%".contains(c));
    if plain {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

/// Rewrite a shell script: drop owned flags (whitespace-separated tokens; all other text,
/// including line continuations and separators, is kept) and append ours at the end.
fn rewrite_script(script: &str, flags: &[String]) -> String {
    // (whitespace before, word) runs, so the script's layout survives.
    let mut pieces: Vec<(String, String)> = Vec::new();
    let mut ws = String::new();
    let mut word = String::new();
    for c in script.chars() {
        if c.is_whitespace() {
            if !word.is_empty() {
                pieces.push((std::mem::take(&mut ws), std::mem::take(&mut word)));
            }
            ws.push(c);
        } else {
            word.push(c);
        }
    }
    if !word.is_empty() {
        pieces.push((ws, word));
    }
    let words: Vec<&str> = pieces.iter().map(|(_, w)| w.as_str()).collect();
    let mut out = String::new();
    for i in kept_words(&words, &owned_with(flags)) {
        out.push_str(&pieces[i].0);
        out.push_str(&pieces[i].1);
    }
    // A trailing line continuation would swallow what we append.
    let trimmed = out.trim_end();
    let mut out = trimmed
        .strip_suffix('\\')
        .unwrap_or(trimmed)
        .trim_end()
        .to_string();
    for f in flags {
        out.push(' ');
        out.push_str(&shell_quote(f));
    }
    out.push('\n');
    out
}

/// Whether a command runs a shell script (`sh|bash|dash|zsh ... -c`).
fn is_shell(command: &[String]) -> bool {
    let Some(first) = command.first() else {
        return false;
    };
    let base = first.rsplit('/').next().unwrap_or(first);
    matches!(base, "sh" | "bash" | "dash" | "zsh") && command.iter().any(|w| w == "-c")
}

/// Put the Megatron flags into the container's command line: into its script when it runs a
/// shell (`command: [bash, -c]` with the script in `args[0]`, or the script at the end of
/// `command` itself), else at the end of `args`.
pub fn write_args(container: &mut Container, flags: &[String]) {
    let command = container.command.clone().unwrap_or_default();
    let args = container.args.clone().unwrap_or_default();
    if is_shell(&command) {
        if let Some(script) = args.first() {
            let mut new_args = args.clone();
            new_args[0] = rewrite_script(script, flags);
            container.args = Some(new_args);
            return;
        }
        if let Some(last) = command.last().filter(|s| *s != "-c") {
            let mut new_command = command.clone();
            let at = new_command.len() - 1;
            new_command[at] = rewrite_script(last, flags);
            container.command = Some(new_command);
            return;
        }
    }
    let mut new_args: Vec<String> = kept_words(&args, &owned_with(flags))
        .into_iter()
        .map(|i| args[i].clone())
        .collect();
    new_args.extend(flags.iter().cloned());
    container.args = Some(new_args);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn owned_flags_and_their_values_are_replaced() {
        let mut c = Container {
            args: Some(words(
                "--tensor-model-parallel-size 2 --lr 3e-4 --micro-batch-size=7 --sequence-parallel --x",
            )),
            ..Container::default()
        };
        write_args(
            &mut c,
            &words("--tensor-model-parallel-size 8 --new-flag v"),
        );
        assert_eq!(
            c.args.unwrap(),
            words("--lr 3e-4 --x --tensor-model-parallel-size 8 --new-flag v")
        );
    }

    /// A template that splits its layers with Megatron's accounting flags (the
    /// Megatron-MoE-ModelZoo configs do) loses them, and its virtual-stage count, when the
    /// writer writes the plan's layout: Megatron refuses a layout beside either flag.
    #[test]
    fn the_template_pipeline_split_gives_way_to_the_plan_layout() {
        let mut c = Container {
            args: Some(words(
                "--account-for-embedding-in-pipeline-split --num-virtual-stages-per-pipeline-rank 3 \
                 --account-for-loss-in-pipeline-split --lr 3e-4",
            )),
            ..Container::default()
        };
        write_args(&mut c, &words("--pipeline-model-parallel-layout Et|tL"));
        assert_eq!(
            c.args.unwrap(),
            words("--lr 3e-4 --pipeline-model-parallel-layout Et|tL")
        );
    }

    #[test]
    fn a_script_keeps_its_layout_and_gets_quoted_flags_at_the_end() {
        let mut c = Container {
            command: Some(words("/bin/bash -c")),
            args: Some(vec![
                "cd /w && \\\n  torchrun x.py --pipeline-model-parallel-size 4 \\\n".into(),
            ]),
            ..Container::default()
        };
        write_args(
            &mut c,
            &words("--pipeline-model-parallel-size 2 --layout E|t"),
        );
        assert_eq!(
            c.args.unwrap()[0],
            "cd /w && \\\n  torchrun x.py --pipeline-model-parallel-size 2 --layout 'E|t'\n"
        );
        // The script at the end of `command` itself.
        let mut c = Container {
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                "run --tensor-model-parallel-size 1".into(),
            ]),
            ..Container::default()
        };
        write_args(&mut c, &words("--tensor-model-parallel-size 4"));
        assert_eq!(
            c.command.unwrap()[2],
            "run --tensor-model-parallel-size 4\n"
        );
        assert!(c.args.is_none());
    }
}
