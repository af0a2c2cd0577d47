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
//!   (replacing the same flags from the template, keeping its other arguments), the GPU
//!   resource of the hardware profile (`amd.com/gpu: 8`) in limits and requests, and the
//!   layout's `expandableSegments` in PyTorch's allocator configuration (added to the vendor's
//!   `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_HIP_ALLOC_CONF` when on, removed from any of them
//!   when off), and the switches some options need to run at all: Transformer Engine's
//!   `NVTE_CUTEDSL_FUSED_GROUPED_MLP=1` with the fused grouped MLP, `NVTE_CPU_OFFLOAD_V1=1`
//!   with fine-grained activation offloading, `NCCL_GRAPH_REGISTER=0` with Transformer
//!   Engine's CUDA graphs over expandable segments, and `CUDA_DEVICE_MAX_CONNECTIONS` as
//!   [`max_connections`] picks it when the template does not set it (a template's 1 is raised
//!   under FSDP, which refuses it);
//! - a node selector on the profile's product label unless the template has one for it;
//! - the `primus.dev/*` annotations the admission webhook reads back.
//!
//! Without a template the container runs [`default_image`] with `torchrun pretrain_gpt.py`
//! and mock data: a smoke run, not a training recipe. Give a template for real jobs.
//!
//! With [`JobOptions::launcher`] `primus` the same layout and model are written as Primus
//! overrides ([`primus_oracle::primus::overrides::override_words`]) on a `primus-cli direct --
//! train pretrain --config EXPERIMENT` command: appended to the template's own Primus command
//! when it has one (Primus reads the last setting of a key), else on [`PRIMUS_IMAGE`]'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use primus_oracle::FieldError;
use primus_oracle::hardware::Vendor;
use primus_oracle::layout::CudaGraphImpl;
use primus_oracle::layout::Layout;
use primus_oracle::megatron::{
    ALLOC_CONF_ENV, FINE_GRAINED_OFFLOAD_ENV, FUSED_GROUPED_MLP_ENV, MAX_CONNECTIONS_ENV,
    NCCL_GRAPH_REGISTER_ENV, expandable_segments_in, flag, max_connections, megatron_flags,
    moe_flag, with_expandable_segments,
};
use primus_oracle::scenario::Scenario;
use serde_json::Value;

use super::args::write_args;
use super::template::{self, clean_metadata};
use super::types::{PyTorchJob, ReplicaSpec};
use super::{CONTAINER, DEFAULT_RESTART_POLICY, MASTER, WORKER};
use crate::annotations;
use crate::training_plan::Launcher;
use primus_oracle::primus::overrides::override_words;

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

/// Default image of a Primus job without a template: AMD's Primus release image, the tag the
/// ROCm blog's Primus tuning-agent runs used (docs/mixtral-case-study.md).
pub const PRIMUS_IMAGE: &str = "docker.io/rocm/primus:v26.2";
/// Default experiment of a Primus job: Primus's generic Megatron pretraining experiment (its
/// model and layout come from the overrides; AMD-AGI/Primus `examples/megatron/exp_pretrain.yaml`,
/// present at commit 116c196).
pub const PRIMUS_EXPERIMENT: &str = "examples/megatron/exp_pretrain.yaml";
/// Overrides of the default (template-less) Primus container besides the layout and model: a
/// short run on mock data.
pub const PRIMUS_EXTRA_ARGS: &[&str] = &["--train_iters", "100", "--mock_data", "True"];

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
    /// What the container runs (Megatron flags or Primus overrides).
    pub launcher: Launcher,
    /// The Primus experiment when the container runs no Primus command of its own (default
    /// [`PRIMUS_EXPERIMENT`]).
    pub experiment: Option<String>,
}

impl JobOptions {
    fn experiment(&self) -> &str {
        self.experiment.as_deref().unwrap_or(PRIMUS_EXPERIMENT)
    }
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
) -> Result<PyTorchJob, FieldError> {
    let t = template::parse(template)?;
    let mut job = PyTorchJob {
        metadata: job_metadata(t.metadata, plan_name, namespace, s, l, opts),
        spec: t.spec,
        ..PyTorchJob::default()
    };
    let nodes = s.cluster.nodes().max(1);
    let nproc = s.cluster.gpus.min(s.cluster.gpus_per_node).max(1);
    let flags = megatron_flags(s, l);

    // Master from the template's Master (else its Worker), Worker from its Worker (else its
    // Master); a template with neither gets the default container.
    let replicas_at = format!("{}.pytorchReplicaSpecs", t.spec_at);
    let given = std::mem::take(&mut job.spec.pytorch_replica_specs);
    let mut roles = vec![(MASTER, WORKER, 1)];
    if nodes > 1 {
        roles.push((WORKER, MASTER, nodes - 1));
    }
    for (role, other, count) in roles {
        let (source, mut replica) = match (given.get(role), given.get(other)) {
            (Some(r), _) => (role, r.clone()),
            (None, Some(r)) => (other, r.clone()),
            (None, None) => (role, ReplicaSpec::default()),
        };
        replica.replicas = Some(count as i32);
        replica
            .restart_policy
            .get_or_insert_with(|| DEFAULT_RESTART_POLICY.to_string());
        let pod = replica.template.get_or_insert_default();
        let at = format!("{replicas_at}.{source}.template");
        fill_pod_template(pod, s, &flags, t.from_user, nproc, &at, opts)?;
        set_allocator_env(pod, s.hardware.vendor, l);
        job.spec
            .pytorch_replica_specs
            .insert(role.to_string(), replica);
    }
    job.spec.nproc_per_node = Some(IntOrString::String(nproc.to_string()));
    if opts.suspend {
        job.spec.run_policy.get_or_insert_default().suspend = Some(true);
    }
    Ok(job)
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The job's metadata: the template's, cleaned, with the name, the namespace and the
/// annotations the webhook and the operator read back.
pub(crate) fn job_metadata(
    mut meta: ObjectMeta,
    plan_name: &str,
    namespace: Option<&str>,
    s: &Scenario,
    l: &Layout,
    opts: &JobOptions,
) -> ObjectMeta {
    clean_metadata(&mut meta);
    meta.name = Some(opts.name.clone().unwrap_or_else(|| plan_name.to_string()));
    meta.namespace = namespace.map(str::to_string);
    let ann = meta.annotations.get_or_insert_default();
    let mut set = |key: &str, value: Option<String>| match value {
        Some(v) => {
            ann.insert(key.to_string(), v);
        }
        None => {
            ann.remove(key);
        }
    };
    set(annotations::PLAN, Some(plan_name.to_string()));
    set(annotations::LAYOUT, Some(to_json(l)));
    set(annotations::TRAINING, Some(to_json(&s.training)));
    let card = opts.inline_model_card || s.model.name.is_empty();
    set(annotations::MODEL_CARD, card.then(|| to_json(&s.model)));
    set(annotations::MODEL, (!card).then(|| s.model.name.clone()));
    let gpu = (!s.hardware.name.is_empty()).then(|| s.hardware.name.clone());
    set(annotations::GPU, gpu);
    let projected = opts
        .projected_tokens_per_second
        .filter(|t| t.is_finite())
        .map(|t| format!("{t:.1}"));
    set(annotations::PROJECTED_TOKENS_PER_SECOND, projected);
    meta
}

/// Fill one replica's pod template: node selector, the `pytorch` container (the default one
/// without a user template), its flags, GPU resources and environment.
fn fill_pod_template(
    pod: &mut PodTemplateSpec,
    s: &Scenario,
    flags: &[String],
    from_user: bool,
    nproc: u32,
    at: &str,
    opts: &JobOptions,
) -> Result<(), FieldError> {
    if let Some(m) = &mut pod.metadata {
        clean_metadata(m);
    }
    let spec = pod.spec.get_or_insert_default();
    let k = &s.hardware.kubernetes;
    let selector = spec.node_selector.get_or_insert_default();
    if !selector.contains_key(&k.product_label)
        && let Some(v) = k.product_values.first()
    {
        selector.insert(k.product_label.clone(), v.clone());
    }
    let idx = match spec.containers.iter().position(|c| c.name == CONTAINER) {
        Some(i) => i,
        None => {
            spec.containers.push(Container {
                name: CONTAINER.to_string(),
                ..Container::default()
            });
            spec.containers.len() - 1
        }
    };
    fill_container(
        &mut spec.containers[idx],
        s,
        flags,
        from_user,
        nproc,
        &format!("{at}.spec.containers[{idx}]"),
        opts,
    )
}

/// Fill the training container (a pod's `pytorch` container, a TrainJob's trainer): its image
/// (the default one unless `from_user`; then it must have one: `at` names it), command and
/// the layout's flags or overrides, GPU resources and environment.
pub(crate) fn fill_container(
    container: &mut Container,
    s: &Scenario,
    flags: &[String],
    from_user: bool,
    nproc: u32,
    at: &str,
    opts: &JobOptions,
) -> Result<(), FieldError> {
    if container.image.is_none() {
        if from_user {
            return Err(FieldError::new(
                format!("{at}.image"),
                "missing: the template's training container needs an image",
            ));
        }
        container.image = Some(match opts.launcher {
            Launcher::Megatron => default_image(s.hardware.vendor).to_string(),
            Launcher::Primus => PRIMUS_IMAGE.to_string(),
        });
    }
    match opts.launcher {
        Launcher::Megatron => {
            if !from_user {
                default_command(container, s);
            }
            write_args(container, flags);
        }
        Launcher::Primus => {
            primus_command(container, from_user, opts.experiment());
            write_args(container, &override_words(flags));
        }
    }
    set_gpu_resources(container, &s.hardware.kubernetes.resource, nproc);
    let env = container.env.get_or_insert_default();
    // The fused grouped MLP the plan projected runs only with Transformer Engine's CuTe-DSL
    // switch beside the op-fuser flag (Megatron-Core `moe/experts.py`); fine-grained
    // activation offloading starts only with TE's CPU offload v1 switch (Megatron-LM
    // `arguments.py`, TE >= 2.10). Each is set to 1 over whatever the template said.
    for (switch, env_name) in [
        (moe_flag::TE_OP_FUSER, FUSED_GROUPED_MLP_ENV),
        (flag::FINE_GRAINED_OFFLOAD, FINE_GRAINED_OFFLOAD_ENV),
    ] {
        if flags.iter().any(|f| f == switch) {
            env.retain(|e| e.name != env_name);
            env.push(EnvVar {
                name: env_name.to_string(),
                value: Some("1".to_string()),
                ..EnvVar::default()
            });
        }
    }
    Ok(())
}

/// The allocator environment variable the writer adds for a vendor.
pub fn alloc_conf_env(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Amd => ALLOC_CONF_ENV[1],
        Vendor::Nvidia => ALLOC_CONF_ENV[0],
    }
}

/// `expandable_segments` in the `pytorch` container's allocator configuration as the layout
/// says: every allocator variable of the template is rewritten (the option removed when off,
/// others kept), and with it on the vendor's variable is added when absent.
fn set_allocator_env(pod: &mut PodTemplateSpec, vendor: Vendor, l: &Layout) {
    if let Some(container) = pod
        .spec
        .as_mut()
        .and_then(|spec| spec.containers.iter_mut().find(|c| c.name == CONTAINER))
    {
        set_container_allocator_env(container, vendor, l.expandable_segments);
        set_container_queue_env(container, l);
    }
}

/// The environment Megatron-LM asserts on at start for the layout, in the training container:
/// `CUDA_DEVICE_MAX_CONNECTIONS` ([`max_connections`] when the template does not set it; a
/// template's 1 raised to it under FSDP, which refuses 1) and, with Transformer Engine's CUDA
/// graphs over expandable segments, `NCCL_GRAPH_REGISTER=0`.
pub(crate) fn set_container_queue_env(container: &mut Container, l: &Layout) {
    let env = container.env.get_or_insert_default();
    let want = max_connections(l);
    match env.iter_mut().find(|e| e.name == MAX_CONNECTIONS_ENV) {
        None => env.push(EnvVar {
            name: MAX_CONNECTIONS_ENV.to_string(),
            value: Some(want.to_string()),
            ..EnvVar::default()
        }),
        Some(e) if l.fsdp && e.value.as_deref() == Some("1") => e.value = Some(want.to_string()),
        Some(_) => {}
    }
    if l.expandable_segments && l.cuda_graph.implementation == CudaGraphImpl::TransformerEngine {
        env.retain(|e| e.name != NCCL_GRAPH_REGISTER_ENV);
        env.push(EnvVar {
            name: NCCL_GRAPH_REGISTER_ENV.to_string(),
            value: Some("0".to_string()),
            ..EnvVar::default()
        });
    }
}

/// [`set_allocator_env`] on the training container itself.
pub(crate) fn set_container_allocator_env(container: &mut Container, vendor: Vendor, on: bool) {
    let env = container.env.get_or_insert_default();
    for e in env.iter_mut() {
        if let Some(v) = e.value.as_mut()
            && ALLOC_CONF_ENV.contains(&e.name.as_str())
            && expandable_segments_in(v) != Some(on)
        {
            *v = with_expandable_segments(v, on);
        }
    }
    env.retain(|e| !(ALLOC_CONF_ENV.contains(&e.name.as_str()) && e.value.as_deref() == Some("")));
    let name = alloc_conf_env(vendor);
    if on && !env.iter().any(|e| e.name == name) {
        env.push(EnvVar {
            name: name.to_string(),
            value: Some(with_expandable_segments("", true)),
            ..EnvVar::default()
        });
    }
}

/// The default container's command: `torchrun pretrain_gpt.py` in the image's Megatron-LM
/// directory, on mock data with the null tokenizer.
fn default_command(container: &mut Container, s: &Scenario) {
    container.command = Some(vec!["torchrun".into(), "pretrain_gpt.py".into()]);
    container.working_dir = Some(default_working_dir(s.hardware.vendor).to_string());
    let mut args: Vec<String> = DEFAULT_EXTRA_ARGS.iter().map(|a| a.to_string()).collect();
    // Megatron's NullTokenizer takes its vocabulary size from --vocab-size.
    args.push(flag::VOCAB_ALT.to_string());
    args.push(s.model.vocab_size.to_string());
    args.extend(container.args.take().unwrap_or_default());
    container.args = Some(args);
}

/// A Primus container's command: kept when it runs Primus already, else `primus-cli direct --
/// train pretrain --config EXPERIMENT` (a template's arguments stay after it, as more
/// overrides; the default container gets a short mock-data run).
fn primus_command(container: &mut Container, from_user: bool, experiment: &str) {
    let words = [&container.command, &container.args]
        .into_iter()
        .flatten()
        .flat_map(|l| l.iter().map(String::as_str));
    if primus_oracle::primus::command::find(words).is_some() {
        return;
    }
    container.command = Some(
        [
            "primus-cli",
            "direct",
            "--",
            "train",
            "pretrain",
            "--config",
            experiment,
        ]
        .map(str::to_string)
        .to_vec(),
    );
    if !from_user {
        container.args = Some(PRIMUS_EXTRA_ARGS.iter().map(|a| a.to_string()).collect());
    }
}

/// The GPU resource of the hardware profile in limits and requests.
fn set_gpu_resources(container: &mut Container, resource: &str, count: u32) {
    let res = container
        .resources
        .get_or_insert_with(ResourceRequirements::default);
    for map in [&mut res.limits, &mut res.requests] {
        map.get_or_insert_with(BTreeMap::new)
            .insert(resource.to_string(), Quantity(count.to_string()));
    }
}
