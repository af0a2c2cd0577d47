//! The PyTorchJob writer: a chosen layout as a complete kubeflow.org/v1 `PyTorchJob`, built from
//! the plan's `spec.job.template` when there is one. `primus tune --emit pytorchjob` prints it
//! and the operator creates it, so both write exactly the same object.
//!
//! What the writer sets, whatever the template says:
//! - `spec.pytorchReplicaSpecs.Master` (1 replica) and `Worker` (nodes - 1 replicas; no
//!   `Worker` for a one-node job), both from the template's pod template;
//! - `spec.nprocPerNode` (a string, as the CRD's schema has it) = GPUs per node;
//! - `spec.runPolicy.suspend` when [`JobOptions::suspend`] is set;
//! - in the container named `pytorch`: the Megatron layout and model flags appended to `args`
//!   (replacing the same flags from the template, keeping its other arguments), and the GPU
//!   resource of the hardware profile (`amd.com/gpu: 8`) in limits and requests;
//! - a node selector on the profile's product label unless the template has one for it;
//! - the `primus.dev/*` annotations the admission webhook reads back.
//!
//! Without a template the container runs [`default_image`] with `torchrun pretrain_gpt.py`
//! and mock data: a smoke run, not a training recipe. Give a template for real jobs.

use serde_json::{Map, Value, json};

use crate::error::FieldError;
use crate::hardware::Vendor;
use crate::layout::Layout;
use crate::megatron::flag;
use crate::plan::Scenario;

/// Annotation keys of the jobs the writer builds; `primus_crds::annotations` re-exports them
/// for the operator and the webhook (the oracle cannot depend on the crds crate).
pub mod annotation {
    /// The TrainingPlan that created the job.
    pub const PLAN: &str = "primus.dev/plan";
    /// The layout (JSON of `spec.parallelism`) the job runs.
    pub const LAYOUT: &str = "primus.dev/layout";
    /// Projected tokens/s per GPU of that layout.
    pub const PROJECTED_TOKENS_PER_SECOND: &str = "primus.dev/projected-tokens-per-second";
    /// Model preset name.
    pub const MODEL: &str = "primus.dev/model";
    /// Inline model card (JSON), when the plan did not use a preset.
    pub const MODEL_CARD: &str = "primus.dev/model-card";
    /// Hardware profile name.
    pub const GPU: &str = "primus.dev/gpu";
    /// Training settings (JSON: seqLength, globalBatchSize, precision).
    pub const TRAINING: &str = "primus.dev/training";
}

/// Name of the training container in every replica (the Kubeflow training operator's
/// convention for PyTorchJob).
pub const CONTAINER: &str = "pytorch";

/// Default image when the template gives none: AMD's ROCm Megatron-LM image for AMD GPUs and
/// NVIDIA's NeMo framework image (which ships Megatron-LM) for NVIDIA GPUs.
pub fn default_image(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Amd => "docker.io/rocm/megatron-lm:latest",
        Vendor::Nvidia => "nvcr.io/nvidia/nemo:25.02",
    }
}

/// Where `pretrain_gpt.py` lives in the default image.
pub fn default_working_dir(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Amd => "/workspace/Megatron-LM",
        Vendor::Nvidia => "/opt/megatron-lm",
    }
}

/// Arguments of the default (template-less) container besides the layout and model flags (and
/// `--vocab-size` for the null tokenizer): a short run on mock data so that the job is complete
/// and starts.
pub const DEFAULT_EXTRA_ARGS: &[&str] = &[
    "--use-mcore-models",
    "--mock-data",
    "--tokenizer-type",
    "NullTokenizer",
    "--train-iters",
    "100",
    "--lr",
    "1.0e-4",
    "--log-interval",
    "1",
];

/// Options of the writer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobOptions {
    /// Job name; defaults to the plan name.
    pub name: Option<String>,
    /// Create the job suspended (`spec.runPolicy.suspend: true`).
    pub suspend: bool,
    /// Projected tokens/s per GPU, written as an annotation.
    pub projected_tokens_per_second: Option<f64>,
    /// The plan gave the model inline (not a preset): annotate the card instead of its name.
    pub inline_model_card: bool,
}

/// Labels and annotations that belong to a GitOps tool tracking the template's owner; copying
/// them would make Argo CD adopt (and prune) the job.
fn is_tracking_key(key: &str) -> bool {
    key == "app.kubernetes.io/instance" || key.starts_with("argocd.argoproj.io/")
}

/// Metadata fields the API server owns.
const SERVER_METADATA: &[&str] = &[
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "ownerReferences",
    "generateName",
];

/// The mapping under `key` (created when absent or null).
fn child<'a>(
    obj: &'a mut Map<String, Value>,
    key: &str,
    field: &str,
) -> Result<&'a mut Map<String, Value>, FieldError> {
    let entry = obj
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if entry.is_null() {
        *entry = Value::Object(Map::new());
    }
    entry
        .as_object_mut()
        .ok_or_else(|| FieldError::new(format!("{field}.{key}"), "must be a mapping"))
}

fn clean_metadata(meta: &mut Map<String, Value>, field: &str) -> Result<(), FieldError> {
    for k in SERVER_METADATA {
        meta.remove(*k);
    }
    for key in ["labels", "annotations"] {
        match meta.get_mut(key) {
            None | Some(Value::Null) => {
                meta.remove(key);
            }
            Some(Value::Object(m)) => m.retain(|k, _| !is_tracking_key(k)),
            Some(_) => {
                return Err(FieldError::new(
                    format!("{field}.{key}"),
                    "must be a mapping",
                ));
            }
        }
    }
    Ok(())
}

/// Split a template into (job metadata, job spec). Accepts a whole PyTorchJob (with `spec`) or
/// just its spec.
fn split_template(template: Option<&Value>) -> Result<(Map<String, Value>, Value), FieldError> {
    const AT: &str = "spec.job.template";
    let Some(t) = template else {
        return Ok((Map::new(), Value::Object(Map::new())));
    };
    let Value::Object(obj) = t else {
        return Err(FieldError::new(
            AT,
            "must be a PyTorchJob or its spec (a mapping)",
        ));
    };
    if let Some(kind) = obj.get("kind")
        && kind != "PyTorchJob"
    {
        return Err(FieldError::new(
            format!("{AT}.kind"),
            format!("expected PyTorchJob, got {kind}"),
        ));
    }
    if let Some(api) = obj.get("apiVersion")
        && api != "kubeflow.org/v1"
    {
        return Err(FieldError::new(
            format!("{AT}.apiVersion"),
            format!("expected kubeflow.org/v1, got {api}"),
        ));
    }
    let whole = obj.contains_key("spec") && !obj.contains_key("pytorchReplicaSpecs");
    if whole {
        let meta = match obj.get("metadata") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => {
                return Err(FieldError::new(
                    format!("{AT}.metadata"),
                    "must be a mapping",
                ));
            }
        };
        let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
        if !spec.is_object() {
            return Err(FieldError::new(format!("{AT}.spec"), "must be a mapping"));
        }
        Ok((meta, spec))
    } else {
        Ok((Map::new(), t.clone()))
    }
}

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
    ];
    let switches = [
        flag::DIST_OPT,
        flag::SP,
        flag::FSDP,
        flag::ZERO_BUBBLE,
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

/// Owned flags that take a list (every word up to the next flag).
const LIST_FLAGS: &[&str] = &[flag::RECOMPUTE_MODULES];

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

fn string_list(v: &Value, field: &str) -> Result<Vec<String>, FieldError> {
    match v {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| FieldError::new(format!("{field}[{i}]"), "must be a string"))
            })
            .collect(),
        Value::Null => Ok(Vec::new()),
        _ => Err(FieldError::new(field, "must be a list of strings")),
    }
}

fn is_shell(command: &[String]) -> bool {
    let Some(first) = command.first() else {
        return false;
    };
    let base = first.rsplit('/').next().unwrap_or(first);
    matches!(base, "sh" | "bash" | "dash" | "zsh") && command.iter().any(|w| w == "-c")
}

/// Put the Megatron flags into the container's command line.
fn write_args(
    container: &mut Map<String, Value>,
    flags: &[String],
    field: &str,
) -> Result<(), FieldError> {
    let command = string_list(
        container.get("command").unwrap_or(&Value::Null),
        &format!("{field}.command"),
    )?;
    let args = string_list(
        container.get("args").unwrap_or(&Value::Null),
        &format!("{field}.args"),
    )?;
    if is_shell(&command) {
        // `command: [bash, -c]` with the script in args[0], or the script at the end of
        // `command` itself.
        if let Some(script) = args.first() {
            let mut new_args = args.clone();
            new_args[0] = rewrite_script(script, flags);
            container.insert("args".into(), json!(new_args));
            return Ok(());
        }
        if command.last().is_some_and(|s| s != "-c") {
            let mut new_command = command.clone();
            let last = new_command.len() - 1;
            new_command[last] = rewrite_script(&command[last], flags);
            container.insert("command".into(), json!(new_command));
            return Ok(());
        }
    }
    let mut new_args: Vec<String> = kept_words(&args, &owned_with(flags))
        .into_iter()
        .map(|i| args[i].clone())
        .collect();
    new_args.extend(flags.iter().cloned());
    container.insert("args".into(), json!(new_args));
    Ok(())
}

fn set_gpu_resources(
    container: &mut Map<String, Value>,
    resource: &str,
    count: u32,
    field: &str,
) -> Result<(), FieldError> {
    let res_field = format!("{field}.resources");
    let res = child(container, "resources", field)?;
    for key in ["limits", "requests"] {
        child(res, key, &res_field)?.insert(resource.to_string(), Value::String(count.to_string()));
    }
    Ok(())
}

/// Fill one replica's pod template.
fn fill_pod_template(
    template: &mut Map<String, Value>,
    s: &Scenario,
    flags: &[String],
    from_user: bool,
    nproc: u32,
    field: &str,
) -> Result<(), FieldError> {
    match template.get_mut("metadata") {
        None => {}
        Some(Value::Object(m)) => clean_metadata(m, &format!("{field}.metadata"))?,
        Some(Value::Null) => {
            template.remove("metadata");
        }
        Some(_) => {
            return Err(FieldError::new(
                format!("{field}.metadata"),
                "must be a mapping",
            ));
        }
    }
    let spec_field = format!("{field}.spec");
    let spec = child(template, "spec", field)?;
    let k = &s.hardware.kubernetes;
    let selector = child(spec, "nodeSelector", &spec_field)?;
    if !selector.contains_key(&k.product_label)
        && let Some(v) = k.product_values.first()
    {
        selector.insert(k.product_label.clone(), Value::String(v.clone()));
    }
    let containers_field = format!("{spec_field}.containers");
    let containers = spec
        .entry("containers")
        .or_insert_with(|| Value::Array(Vec::new()));
    if containers.is_null() {
        *containers = Value::Array(Vec::new());
    }
    let Value::Array(list) = containers else {
        return Err(FieldError::new(containers_field, "must be a list"));
    };
    let idx = match list
        .iter()
        .position(|c| c.get("name").and_then(Value::as_str) == Some(CONTAINER))
    {
        Some(i) => i,
        None => {
            list.push(json!({ "name": CONTAINER }));
            list.len() - 1
        }
    };
    let cfield = format!("{containers_field}[{idx}]");
    let Value::Object(container) = &mut list[idx] else {
        return Err(FieldError::new(cfield, "must be a mapping"));
    };
    if !container.contains_key("image") {
        if from_user {
            return Err(FieldError::new(
                format!("{cfield}.image"),
                "missing: the template's `pytorch` container needs an image",
            ));
        }
        container.insert(
            "image".into(),
            Value::String(default_image(s.hardware.vendor).into()),
        );
    }
    if !from_user {
        container.insert("command".into(), json!(["torchrun", "pretrain_gpt.py"]));
        container.insert(
            "workingDir".into(),
            Value::String(default_working_dir(s.hardware.vendor).into()),
        );
        let mut args: Vec<String> = DEFAULT_EXTRA_ARGS.iter().map(|a| a.to_string()).collect();
        // Megatron's NullTokenizer takes its vocabulary size from --vocab-size.
        args.push(flag::VOCAB_ALT.to_string());
        args.push(s.model.vocab_size.to_string());
        args.extend(string_list(
            container.get("args").unwrap_or(&Value::Null),
            &format!("{cfield}.args"),
        )?);
        container.insert("args".into(), json!(args));
    }
    write_args(container, flags, &cfield)?;
    set_gpu_resources(container, &k.resource, nproc, &cfield)?;
    // Megatron wants one hardware queue per device for its TP/SP communication overlap.
    match container.entry("env").or_insert_with(|| json!([])) {
        Value::Array(env) => {
            let set = env.iter().any(|e| {
                e.get("name").and_then(Value::as_str) == Some("CUDA_DEVICE_MAX_CONNECTIONS")
            });
            if !set {
                env.push(json!({"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"}));
            }
        }
        _ => return Err(FieldError::new(format!("{cfield}.env"), "must be a list")),
    }
    Ok(())
}

pub use crate::megatron::megatron_flags;

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A complete kubeflow.org/v1 PyTorchJob running layout `l` of scenario `s`.
///
/// `template` is the plan's `spec.job.template` (a whole PyTorchJob or just its `spec`); errors
/// name the template field that is wrong.
pub fn pytorchjob(
    plan_name: &str,
    namespace: Option<&str>,
    s: &Scenario,
    l: &Layout,
    template: Option<&Value>,
    opts: &JobOptions,
) -> Result<Value, FieldError> {
    const AT: &str = "spec.job.template";
    let (mut meta, spec) = split_template(template)?;
    let whole =
        template.is_some_and(|t| t.get("spec").is_some() && t.get("pytorchReplicaSpecs").is_none());
    let spec_at = if whole {
        format!("{AT}.spec")
    } else {
        AT.to_string()
    };
    let Value::Object(mut spec) = spec else {
        return Err(FieldError::new(spec_at, "must be a mapping"));
    };
    clean_metadata(&mut meta, &format!("{AT}.metadata"))?;
    meta.remove("namespace");
    meta.insert(
        "name".into(),
        Value::String(opts.name.clone().unwrap_or_else(|| plan_name.to_string())),
    );
    if let Some(ns) = namespace {
        meta.insert("namespace".into(), Value::String(ns.to_string()));
    }

    // Annotations the webhook and the operator read back.
    let ann = child(&mut meta, "annotations", &format!("{AT}.metadata"))?;
    ann.insert(annotation::PLAN.into(), Value::String(plan_name.into()));
    ann.insert(annotation::LAYOUT.into(), Value::String(to_json(l)));
    ann.insert(
        annotation::TRAINING.into(),
        Value::String(to_json(&s.training)),
    );
    if opts.inline_model_card || s.model.name.is_empty() {
        ann.remove(annotation::MODEL);
        ann.insert(
            annotation::MODEL_CARD.into(),
            Value::String(to_json(&s.model)),
        );
    } else {
        ann.remove(annotation::MODEL_CARD);
        ann.insert(
            annotation::MODEL.into(),
            Value::String(s.model.name.clone()),
        );
    }
    if s.hardware.name.is_empty() {
        ann.remove(annotation::GPU);
    } else {
        ann.insert(
            annotation::GPU.into(),
            Value::String(s.hardware.name.clone()),
        );
    }
    match opts.projected_tokens_per_second {
        Some(t) if t.is_finite() => {
            ann.insert(
                annotation::PROJECTED_TOKENS_PER_SECOND.into(),
                Value::String(format!("{t:.1}")),
            );
        }
        _ => {
            ann.remove(annotation::PROJECTED_TOKENS_PER_SECOND);
        }
    }

    let nodes = s.cluster.nodes().max(1);
    let nproc = s.cluster.gpus.min(s.cluster.gpus_per_node).max(1);
    let flags = megatron_flags(s, l);

    // Master from the template's Master (else its Worker), Worker from its Worker (else its
    // Master); a template with neither gets the default container.
    let replicas_at = format!("{spec_at}.pytorchReplicaSpecs");
    let given = match spec.remove("pytorchReplicaSpecs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(FieldError::new(replicas_at, "must be a mapping")),
    };
    for (k, v) in &given {
        if !v.is_object() {
            return Err(FieldError::new(
                format!("{replicas_at}.{k}"),
                "must be a mapping",
            ));
        }
    }
    let from_user = given
        .values()
        .any(|r| r.get("template").is_some_and(|t| !t.is_null()));
    let mut roles = vec![("Master", "Worker", 1)];
    if nodes > 1 {
        roles.push(("Worker", "Master", nodes - 1));
    }
    let mut replica_specs = Map::new();
    for (role, other, count) in roles {
        let (source, mut replica) = match (given.get(role), given.get(other)) {
            (Some(r), _) => (role, r.clone()),
            (None, Some(r)) => (other, r.clone()),
            (None, None) => (role, json!({})),
        };
        let rfield = format!("{replicas_at}.{source}");
        let obj = replica.as_object_mut().expect("checked to be a mapping");
        obj.insert("replicas".into(), json!(count));
        obj.entry("restartPolicy")
            .or_insert_with(|| Value::String("OnFailure".into()));
        let template = child(obj, "template", &rfield)?;
        fill_pod_template(
            template,
            s,
            &flags,
            from_user,
            nproc,
            &format!("{rfield}.template"),
        )?;
        replica_specs.insert(role.to_string(), replica);
    }
    spec.insert("pytorchReplicaSpecs".into(), Value::Object(replica_specs));
    spec.insert("nprocPerNode".into(), Value::String(nproc.to_string()));
    if opts.suspend {
        child(&mut spec, "runPolicy", &spec_at)?.insert("suspend".into(), json!(true));
    }
    Ok(json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": meta,
        "spec": spec,
    }))
}
