//! Derive what the memory model needs from a kubeflow.org/v1 PyTorchJob: the model, the
//! training settings, the parallel layout, the world size and the GPU kind.
//!
//! Sources, in order: the operator's annotations (`primus.dev/layout`, `primus.dev/model`,
//! `primus.dev/model-card`, `primus.dev/gpu`, `primus.dev/training`), then the Megatron flags of
//! the `pytorch` container (command, args and env values), the replica counts and
//! `nprocPerNode` (or the GPU limits), and the node selector / required node affinity on the
//! GPU product label. What cannot be found is reported as [`DeriveError::Missing`], one line
//! per missing piece, so a warning (or a strict-mode denial) says what to add.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use primus_crds::annotations;
use primus_crds::pytorchjob::{PyTorchJobSpec, from_json_at};
use primus_oracle::FieldError;
use primus_oracle::bounds::{self, limits};
use primus_oracle::layout::Layout;
use primus_oracle::megatron::{ALLOC_CONF_ENV, MegatronArgs, expandable_segments_in, flag};
use primus_oracle::model::ModelCard;
use primus_oracle::parse::{from_value_at, quote};
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::{Cluster, Scenario, Training};
use serde_json::Value;

use crate::gpu;

/// Where the layout came from: decides how a bad field is named in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutSource {
    /// The `primus.dev/layout` annotation.
    Annotation,
    /// The Megatron flags of the `pytorch` container.
    Flags,
    /// The Primus overrides of the `pytorch` container (`primus-cli ... -- train pretrain`).
    Primus,
}

impl LayoutSource {
    /// As the audit annotation says it.
    pub fn as_str(self) -> &'static str {
        match self {
            LayoutSource::Annotation => "annotation",
            LayoutSource::Flags => "flags",
            LayoutSource::Primus => "primus",
        }
    }
}

/// Everything the memory model needs, derived from one job.
#[derive(Debug, Clone)]
pub struct DerivedJob {
    pub scenario: Scenario,
    pub layout: Layout,
    pub layout_source: LayoutSource,
    /// How the GPU kind was found, e.g. `nodeSelector amd.com/gpu.product-name=AMD_Instinct_MI300X`.
    pub gpu_source: String,
    /// Things worth telling the user although the job could be derived (e.g. a GPU kind
    /// inferred from the resource name alone).
    pub notes: Vec<String>,
    /// Memory-relevant flags of the job the memory model does not model, with what each
    /// changes ([`primus_oracle::megatron::UNMODELLED_MEMORY_FLAGS`]): the job is never denied on
    /// memory while it carries one.
    pub unmodelled: Vec<(String, &'static str)>,
    /// Memory-relevant environment settings the memory model does not count and that can only
    /// add memory ([`primus_oracle::megatron::UNMODELLED_MEMORY_ENV`]): named in a warning
    /// whatever the verdict; unlike [`DerivedJob::unmodelled`] they do not stop a denial (with
    /// them the prediction is a lower bound of the peak).
    pub adds_memory: Vec<(String, &'static str)>,
}

/// Why a job could not be derived.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeriveError {
    /// Pieces the job does not say (one line each, naming what to add).
    #[error("cannot check GPU memory: {}", .0.join("; "))]
    Missing(Vec<String>),
    /// A field the job does say is wrong (a flag value, an annotation's JSON, an illegal
    /// layout).
    #[error("{0}")]
    Invalid(FieldError),
}

impl DeriveError {
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        DeriveError::Invalid(FieldError::new(field, message))
    }
}

/// The path of an annotation, as messages name it.
pub fn annotation_field(key: &str) -> String {
    format!("metadata.annotations[{key}]")
}

/// One replica type of the job (Master, Worker).
struct Replica<'a> {
    name: &'a str,
    replicas: u64,
    pod_spec: Option<&'a PodSpec>,
    container: Option<&'a Container>,
}

fn replicas_of(spec: &PyTorchJobSpec) -> Result<Vec<Replica<'_>>, DeriveError> {
    spec.replicas_in_order()
        .into_iter()
        .map(|(name, r)| {
            let replicas = match r.replicas {
                None => 1,
                Some(n) => u64::try_from(n).map_err(|_| {
                    DeriveError::invalid(
                        format!("spec.pytorchReplicaSpecs.{name}.replicas"),
                        format!("{n} is not a non-negative integer"),
                    )
                })?,
            };
            Ok(Replica {
                name,
                replicas,
                pod_spec: r.pod_spec(),
                container: r.training_container(),
            })
        })
        .collect()
}

/// The words Megatron flags are read from: command, args, then env values.
fn container_words(c: &Container) -> Vec<&str> {
    let mut words: Vec<&str> = Vec::new();
    for list in [&c.command, &c.args].into_iter().flatten() {
        words.extend(list.iter().map(String::as_str));
    }
    for e in c.env.iter().flatten() {
        words.extend(e.value.as_deref());
    }
    words
}

/// Whether the container's environment turns PyTorch's expandable segments on or off
/// (`PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_HIP_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`; the last one
/// that mentions them wins, as the names are read in that order).
fn expandable_segments_env(c: &Container) -> Option<bool> {
    let env = c.env.as_ref()?;
    ALLOC_CONF_ENV
        .iter()
        .filter_map(|name| {
            env.iter()
                .find(|e| e.name == *name)
                .and_then(|e| e.value.as_deref())
                .and_then(expandable_segments_in)
        })
        .next_back()
}

/// GPUs a container asks for: (resource name, count) from limits, else requests.
fn gpu_limit(c: &Container, resources: &[String]) -> Result<Option<(String, u64)>, DeriveError> {
    let Some(r) = &c.resources else {
        return Ok(None);
    };
    for (section, map) in [("limits", &r.limits), ("requests", &r.requests)] {
        let Some(map) = map else { continue };
        for res in resources {
            if let Some(q) = map.get(res.as_str()) {
                return match q.0.trim().parse::<u64>() {
                    Ok(n) => Ok(Some((res.clone(), n))),
                    Err(_) => Err(DeriveError::invalid(
                        format!("containers[{}].resources.{section}[{res}]", c.name),
                        format!("{} is not a whole number of GPUs", quote(&q.0)),
                    )),
                };
            }
        }
    }
    Ok(None)
}

/// Processes per replica: `nprocPerNode` (an integer, or `gpu`/`auto` = the GPU limit), else
/// `elasticPolicy.nProcPerNode`, else the GPU limit.
fn procs_per_replica(
    spec: &PyTorchJobSpec,
    gpus: Option<u64>,
    replica: &str,
) -> Result<Result<u64, String>, DeriveError> {
    let from_gpus = |why: &str| -> Result<u64, String> {
        gpus.filter(|&g| g > 0).ok_or_else(|| {
            format!(
                "GPUs per {replica} replica: {why}, and the pytorch container has no GPU limit (amd.com/gpu or nvidia.com/gpu)"
            )
        })
    };
    match &spec.nproc_per_node {
        Some(IntOrString::String(s)) => {
            let s = s.trim();
            match s {
                "gpu" | "auto" => Ok(from_gpus(&format!("nprocPerNode is {}", quote(s)))),
                "cpu" => Ok(Err("nprocPerNode is \"cpu\": not a GPU job".to_string())),
                n => match n.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(Ok(n)),
                    _ => Err(DeriveError::invalid(
                        "spec.nprocPerNode",
                        format!("{} is not auto, cpu, gpu or a positive integer", quote(s)),
                    )),
                },
            }
        }
        Some(IntOrString::Int(n)) => match u64::try_from(*n) {
            Ok(n) if n > 0 => Ok(Ok(n)),
            _ => Err(DeriveError::invalid(
                "spec.nprocPerNode",
                format!("{n} is not a positive integer"),
            )),
        },
        None => match spec.elastic_policy.as_ref().and_then(|e| e.n_proc_per_node) {
            Some(n) if n > 0 => Ok(Ok(n as u64)),
            _ => Ok(from_gpus("no nprocPerNode")),
        },
    }
}

/// The Megatron flag that sets a layout field (by its name in `spec.parallelism`).
pub fn flag_for_field(field: &str) -> Option<&'static str> {
    Some(match field {
        "tp" => flag::TP,
        "pp" => flag::PP,
        "vpp" => flag::VPP_SIZE,
        "cp" => flag::CP,
        "ep" => flag::EP,
        "etp" => flag::ETP,
        "microBatchSize" => flag::MBS,
        "recompute" => flag::RECOMPUTE_GRANULARITY,
        "recomputeLayers" => flag::RECOMPUTE_NUM_LAYERS,
        "recomputeModules" => flag::RECOMPUTE_MODULES,
        "sequenceParallel" => flag::SP,
        "distributedOptimizer" => flag::DIST_OPT,
        "fsdp" => flag::FSDP,
        "schedule" => flag::VPP_SIZE,
        "firstStageLayers" => flag::FIRST_STAGE_LAYERS,
        "lastStageLayers" => flag::LAST_STAGE_LAYERS,
        "pipelineLayout" => "--pipeline-model-parallel-layout",
        "attentionDropout" => flag::ATTENTION_DROPOUT,
        "hiddenDropout" => flag::HIDDEN_DROPOUT,
        "precisionAwareOptimizer" => flag::PRECISION_AWARE_OPTIMIZER,
        "mainGradsDtype" => flag::MAIN_GRADS_DTYPE,
        "mainParamsDtype" => flag::MAIN_PARAMS_DTYPE,
        "expAvgDtype" => flag::EXP_AVG_DTYPE,
        "expAvgSqDtype" => flag::EXP_AVG_SQ_DTYPE,
        "optimizerCpuOffload" => flag::OPTIMIZER_CPU_OFFLOAD,
        "optimizerOffloadFraction" => flag::OPTIMIZER_OFFLOAD_FRACTION,
        "activationOffloadLayers" => flag::CPU_OFFLOADING_NUM_LAYERS,
        "offloadModules" => flag::OFFLOAD_MODULES,
        "fp8ParamGather" => flag::FP8_PARAM_GATHER,
        "expandableSegments" => "env PYTORCH_CUDA_ALLOC_CONF / PYTORCH_HIP_ALLOC_CONF",
        "spec.training.globalBatchSize" => flag::GBS,
        "spec.training.seqLength" => flag::SEQ,
        "spec.cluster.gpus" => "world size (replicas x nprocPerNode)",
        _ => return None,
    })
}

/// Rename a field of the oracle's vocabulary (`spec.parallelism.tp`) to where the job says it.
pub fn job_field(field: &str, source: LayoutSource) -> String {
    let short = field.strip_prefix("spec.parallelism.").unwrap_or(field);
    match source {
        LayoutSource::Flags => flag_for_field(short)
            .or_else(|| flag_for_field(field))
            .map(str::to_string)
            .unwrap_or_else(|| field.to_string()),
        LayoutSource::Primus => flag_for_field(short)
            .or_else(|| flag_for_field(field))
            .map(crate::primus::key)
            .unwrap_or_else(|| field.to_string()),
        LayoutSource::Annotation => {
            if field.starts_with("spec.parallelism.") {
                format!("{}.{short}", annotation_field(annotations::LAYOUT))
            } else if field.starts_with("spec.training.") {
                flag_for_field(field)
                    .map(str::to_string)
                    .unwrap_or_else(|| field.to_string())
            } else {
                field.to_string()
            }
        }
    }
}

fn parse_annotation<T: serde::de::DeserializeOwned>(
    annotations: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<T>, DeriveError> {
    let Some(text) = annotations.get(key) else {
        return Ok(None);
    };
    let field = annotation_field(key);
    let value: Value = serde_json::from_str(text)
        .map_err(|e| DeriveError::invalid(field.clone(), format!("is not valid JSON: {e}")))?;
    from_value_at(value, &field)
        .map(Some)
        .map_err(DeriveError::Invalid)
}

/// Derive the scenario and layout of a PyTorchJob (`data` is the object without metadata, as
/// in a `DynamicObject`; `annotations` its metadata annotations). The spec is read as the
/// typed [`PyTorchJobSpec`]; a field of the wrong type is named.
pub fn derive(
    data: &Value,
    annotations: &BTreeMap<String, String>,
    catalog: &Catalog,
) -> Result<DerivedJob, DeriveError> {
    let Some(spec) = data.get("spec").filter(|s| s.is_object()) else {
        return Err(DeriveError::Missing(vec!["the job has no spec".into()]));
    };
    match spec.get("pytorchReplicaSpecs") {
        None => {
            return Err(DeriveError::Missing(vec![
                "spec.pytorchReplicaSpecs is missing".into(),
            ]));
        }
        Some(r) if !r.is_object() => {
            return Err(DeriveError::invalid(
                "spec.pytorchReplicaSpecs",
                "must be a mapping of replica type (Master, Worker) to replica spec",
            ));
        }
        Some(_) => {}
    }
    let spec: PyTorchJobSpec = from_json_at(spec, "spec").map_err(DeriveError::Invalid)?;
    derive_spec(&spec, annotations, catalog)
}

/// [`derive`] from the typed spec.
pub fn derive_spec(
    spec: &PyTorchJobSpec,
    annotations: &BTreeMap<String, String>,
    catalog: &Catalog,
) -> Result<DerivedJob, DeriveError> {
    let replicas = replicas_of(spec)?;
    let mut missing: Vec<String> = Vec::new();

    // The container whose flags describe the job: Master's, else Worker's.
    let primary = replicas.iter().find(|r| r.container.is_some());
    let container = primary.and_then(|r| r.container);
    let primus_job = container.and_then(crate::primus::read);
    let args = match &primus_job {
        Some(job) => job.args.clone(),
        None => {
            let words: Vec<&str> = container.map(container_words).unwrap_or_default();
            MegatronArgs::parse(words.iter().copied())
        }
    };
    args.check_bounds().map_err(DeriveError::Invalid)?;

    let model = match (model_of(&args, annotations, catalog)?, &primus_job) {
        (Err(_), Some(job)) => crate::primus::model(job, catalog),
        (m, _) => m,
    }
    .map_err(|m| missing.push(m));
    if let (Some(job), Ok(m)) = (&primus_job, &model)
        && let Some(line) = crate::primus::missing_shape(job, annotations, m.moe.is_some())
    {
        missing.push(line);
    }
    let training = training_of(&args, annotations)?.map_err(|m| missing.push(m));
    let world = world_of(spec, &replicas, catalog, &mut missing)?;
    let pods: Vec<&PodSpec> = replicas.iter().filter_map(|r| r.pod_spec).collect();
    let gpu = gpu::gpu_kind(&pods, annotations, world.resource.as_deref(), catalog)
        .map_err(|m| missing.push(m));
    let (mut layout, mut layout_source) = layout_of(&args, annotations, model.as_ref().ok())?;
    if layout_source == LayoutSource::Flags && primus_job.is_some() {
        layout_source = LayoutSource::Primus;
    }
    if layout_source != LayoutSource::Annotation
        && let (Some(l), Some(on)) = (
            layout.as_mut(),
            primary
                .and_then(|r| r.container)
                .and_then(expandable_segments_env),
        )
    {
        l.expandable_segments = on;
    }

    if !missing.is_empty() {
        return Err(DeriveError::Missing(missing));
    }
    let (Ok(model), Ok(training), Ok(gpu), Some(mut layout)) = (model, training, gpu, layout)
    else {
        return Err(DeriveError::Missing(vec![
            "the job could not be derived".into(),
        ]));
    };
    let gpus_per_node = world.per_node.unwrap_or(gpu.profile.gpus_per_node as u64);
    // Both bounded (world_of): the casts keep the values.
    let scenario = Scenario {
        model,
        hardware: gpu.profile,
        cluster: Cluster {
            gpus: world.gpus.min(limits::GPUS) as u32,
            gpus_per_node: gpus_per_node.clamp(1, limits::AXIS) as u32,
        },
        training,
    };
    // The layout's bounds, then its legality (products in checked arithmetic).
    layout.check(&scenario).map_err(|e| {
        DeriveError::invalid(
            job_field(&e.field, layout_source),
            format!("{} (rule {})", e.message, e.rule),
        )
    })?;
    let mut notes: Vec<String> = gpu.note.into_iter().collect();
    if let Some(job) = &primus_job {
        notes.extend(job.notes.iter().cloned());
        if layout_source == LayoutSource::Primus {
            let (best, assumed) =
                primus_oracle::primus::assume::best_case(&scenario, &layout, &job.overrides);
            if !assumed.is_empty() {
                notes.push(format!(
                    "the Primus command line leaves {} to the experiment YAML (out of sight): checked at their most memory-saving values, so a denial holds whatever the YAML sets",
                    assumed.join(", ")
                ));
            }
            layout = best;
        }
    }
    let adds_memory = container
        .and_then(|c| c.env.as_ref())
        .map(|env| {
            primus_oracle::megatron::unmodelled_memory_env(
                env.iter()
                    .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or(""))),
            )
        })
        .unwrap_or_default();
    Ok(DerivedJob {
        scenario,
        layout,
        layout_source,
        gpu_source: gpu.source,
        notes,
        unmodelled: args.unmodelled_memory_flags(),
        adds_memory,
    })
}

/// The model: the card annotation, else the preset annotation, else the architecture flags
/// (`Ok(Err(line))`: what to add).
fn model_of(
    args: &MegatronArgs,
    annotations: &BTreeMap<String, String>,
    catalog: &Catalog,
) -> Result<Result<ModelCard, String>, DeriveError> {
    if let Some(card) = parse_annotation::<ModelCard>(annotations, annotations::MODEL_CARD)? {
        let at = annotation_field(annotations::MODEL_CARD);
        card.validate(&at).map_err(DeriveError::Invalid)?;
        return Ok(Ok(card));
    }
    if let Some(name) = annotations.get(annotations::MODEL) {
        return Ok(catalog.model(name.trim()).cloned().ok_or_else(|| {
            format!(
                "model: unknown preset {} in annotation {}; known: {}",
                quote(name),
                annotations::MODEL,
                catalog.model_names().join(", ")
            )
        }));
    }
    match args.model_card().map_err(DeriveError::Invalid)? {
        Some(card) => {
            card.validate("megatron flags")
                .map_err(DeriveError::Invalid)?;
            Ok(Ok(card))
        }
        None => Ok(Err(format!(
            "model: no annotation {} (a preset: {}) and no complete architecture flags ({} {} {} {})",
            annotations::MODEL,
            catalog.model_names().join(", "),
            flag::NUM_LAYERS,
            flag::HIDDEN,
            flag::HEADS,
            flag::VOCAB
        ))),
    }
}

/// Training settings: the annotation, else the flags; bounded.
fn training_of(
    args: &MegatronArgs,
    annotations: &BTreeMap<String, String>,
) -> Result<Result<Training, String>, DeriveError> {
    let annotated = parse_annotation::<Training>(annotations, annotations::TRAINING)?;
    let t = match annotated {
        Some(t) => t,
        None => match args.training().map_err(DeriveError::Invalid)? {
            Some(t) => t,
            None => {
                return Ok(Err(format!(
                    "training: no {} and {} flags and no annotation {}",
                    flag::SEQ,
                    flag::GBS,
                    annotations::TRAINING
                )));
            }
        },
    };
    let field = |f: &str| {
        if annotations.contains_key(annotations::TRAINING) {
            format!("{}.{f}", annotation_field(annotations::TRAINING))
        } else if f == "seqLength" {
            flag::SEQ.to_string()
        } else {
            flag::GBS.to_string()
        }
    };
    bounds::check(&t, "").map_err(|e| DeriveError::invalid(field(&e.field), e.message))?;
    Ok(Ok(t))
}

/// The job's GPUs: how many in all, per node, and of which resource.
struct World {
    gpus: u64,
    per_node: Option<u64>,
    resource: Option<String>,
}

/// World size and GPUs per node from the replicas (what cannot be known goes to `missing`).
fn world_of(
    spec: &PyTorchJobSpec,
    replicas: &[Replica<'_>],
    catalog: &Catalog,
    missing: &mut Vec<String>,
) -> Result<World, DeriveError> {
    let resources = gpu::gpu_resources(catalog);
    let mut w = World {
        gpus: 0,
        per_node: None,
        resource: None,
    };
    let mut known = true;
    for r in replicas {
        let Some(c) = r.container else {
            missing.push(format!(
                "GPUs per {} replica: no container named pytorch in its pod template",
                r.name
            ));
            known = false;
            continue;
        };
        let gpus = gpu_limit(c, &resources)?;
        if let Some((res, _)) = &gpus
            && w.resource.is_none()
        {
            w.resource = Some(res.clone());
        }
        match procs_per_replica(spec, gpus.map(|(_, n)| n), r.name)? {
            Ok(n) => {
                w.gpus = w.gpus.saturating_add(r.replicas.saturating_mul(n));
                w.per_node.get_or_insert(n);
            }
            Err(why) => {
                missing.push(why);
                known = false;
            }
        }
    }
    if known && w.gpus == 0 {
        missing.push("world size: the replicas add up to 0 GPUs".into());
    }
    if w.gpus > limits::GPUS {
        return Err(DeriveError::invalid(
            "spec.pytorchReplicaSpecs",
            format!(
                "replicas x nprocPerNode = {} GPUs is beyond any real job (at most {})",
                w.gpus,
                limits::GPUS
            ),
        ));
    }
    Ok(w)
}

/// The layout: the annotation, else the flags (which need the model's layer count for VPP).
fn layout_of(
    args: &MegatronArgs,
    annotations: &BTreeMap<String, String>,
    model: Option<&ModelCard>,
) -> Result<(Option<Layout>, LayoutSource), DeriveError> {
    if let Some(l) = parse_annotation::<Layout>(annotations, annotations::LAYOUT)? {
        return Ok((Some(l), LayoutSource::Annotation));
    }
    let layout = match model {
        Some(m) => Some(args.layout(m).map_err(DeriveError::Invalid)?),
        None => None,
    };
    Ok((layout, LayoutSource::Flags))
}
