//! The TrainingPlan document as the oracle sees it: the same YAML that `kubectl apply` sends
//! (`apiVersion: primus.dev/v1alpha1`, `kind: TrainingPlan`, `spec: ...`), parsed into plain
//! types with every error naming its field, and resolved against the profile catalog into a
//! [`Scenario`] (the job without its layout) plus the reference layout and tuning settings.
//! The operator converts its kube types to this through [`PlanSpec::from_json`] so both paths
//! share one parser and one set of rules.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::bounds::{self, Bound, Bounded, Seen, limits, patterns};
use crate::error::{FieldError, PlanError};
use crate::hardware::HardwareProfile;
use crate::layout::{Dispatch, Layout, Recompute, RecomputeModule, Schedule};
use crate::model::ModelCard;
use crate::parse::{from_value_at, one_line, parse_yaml_value};
use crate::profiles::Catalog;
use crate::scenario::{Cluster, Scenario, Training};

/// Which model: a preset name or an inline card (exactly one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<ModelRef>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelRef {
    /// Name of a model card in `profiles/models`, e.g. `llama3.1-70b`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// The architecture inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card: Option<ModelCard>,
}

/// The cluster the job runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<ClusterSpec>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// Hardware profile name, e.g. `mi300x` (see `primus profiles`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// A hardware profile inline, instead of `gpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_profile: Option<HardwareProfile>,
    /// Total GPUs of the job.
    pub gpus: u32,
    /// GPUs per node; defaults to the profile's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
}

/// Searcher used by `primus tune` and the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum SearcherKind {
    #[default]
    Exhaustive,
    Seed,
    Evolutionary,
    Agent,
    /// Project `spec.parallelism` as given; no search.
    None,
}

impl SearcherKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SearcherKind::Exhaustive => "exhaustive",
            SearcherKind::Seed => "seed",
            SearcherKind::Evolutionary => "evolutionary",
            SearcherKind::Agent => "agent",
            SearcherKind::None => "none",
        }
    }
}

/// Axes pinned to one value during a search (`spec.tuning.fixed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<FixedAxes>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixedAxes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the tensor-parallel size to this value.
    pub tp: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the pipeline-parallel size to this value.
    pub pp: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the virtual pipeline stages per GPU to this value.
    pub vpp: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the context-parallel size to this value.
    pub cp: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the expert-parallel size to this value.
    pub ep: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the expert tensor-parallel size to this value.
    pub etp: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the micro-batch size to this value.
    pub micro_batch_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the recomputation granularity to this value.
    pub recompute: Option<Recompute>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the layers per stage recomputed with full recompute (0 = all) to this value.
    pub recompute_layers: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the modules selective recompute reruns (Megatron's `--recompute-modules`) to this
    /// list; implies recompute selective.
    pub recompute_modules: Option<Vec<RecomputeModule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the sequence parallelism to this value.
    pub sequence_parallel: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the distributed optimizer to this value.
    pub distributed_optimizer: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the FSDP to this value.
    pub fsdp: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the pipeline schedule to this value.
    pub schedule: Option<Schedule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin the MoE token dispatcher (allgather, alltoall, deepep, hybridep,
    /// primus-turbo-deepep: the flex ones name their backend).
    pub dispatch: Option<Dispatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Pin Megatron's EP communication overlap (`--overlap-moe-expert-parallel-comm`).
    pub ep_overlap: Option<bool>,
}

/// Value lists per axis (`spec.tuning.allowed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<AllowedAxes>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllowedAxes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed values of the tensor-parallel size.
    pub tp: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed values of the pipeline-parallel size.
    pub pp: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed values of the virtual pipeline stages per GPU.
    pub vpp: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed values of the context-parallel size.
    pub cp: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed values of the expert-parallel size.
    pub ep: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed values of the expert tensor-parallel size.
    pub etp: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed values of the micro-batch size.
    pub micro_batch_size: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed values of the recomputation granularity.
    pub recompute: Option<Vec<Recompute>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed module lists of selective recompute (Megatron's `--recompute-modules`), e.g.
    /// `[[core_attn], [layernorm, moe_act]]`; `[core_attn]` is Megatron's default.
    pub recompute_modules: Option<Vec<Vec<RecomputeModule>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed values of the pipeline schedule.
    pub schedule: Option<Vec<Schedule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed MoE token dispatchers (what the image ships: e.g. `[alltoall, deepep]`);
    /// by default alltoall, the reference's and every flex backend of the hardware profile.
    pub dispatch: Option<Vec<Dispatch>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Allowed values of the EP communication overlap.
    pub ep_overlap: Option<Vec<bool>>,
}

/// Pinned axes, bounded.
impl Bounded for FixedAxes {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::int("tp", 1, limits::AXIS, |f| f.tp.into()),
        Bound::int("pp", 1, limits::AXIS, |f| f.pp.into()),
        Bound::int("vpp", 1, limits::AXIS, |f| f.vpp.into()),
        Bound::int("cp", 1, limits::AXIS, |f| f.cp.into()),
        Bound::int("ep", 1, limits::AXIS, |f| f.ep.into()),
        Bound::int("etp", 1, limits::AXIS, |f| f.etp.into()),
        Bound::int("microBatchSize", 1, limits::AXIS, |f| {
            f.micro_batch_size.into()
        }),
        Bound::int("recomputeLayers", 0, limits::LAYERS, |f| {
            f.recompute_layers.into()
        }),
        Bound::items("recomputeModules", limits::MODULES, |f| {
            f.recompute_modules
                .as_ref()
                .map_or(Seen::Absent, |m| Seen::Items(m.len()))
        }),
    ];
}

fn ints(list: &Option<Vec<u32>>) -> Seen<'_> {
    list.as_deref().map_or(Seen::Absent, Seen::Ints)
}

fn items<T>(list: &Option<Vec<T>>) -> Seen<'_> {
    list.as_ref().map_or(Seen::Absent, |l| Seen::Items(l.len()))
}

/// Value lists, bounded: at most [`limits::LIST`] values each, every size in range.
impl Bounded for AllowedAxes {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::ints("tp", limits::LIST, 1, limits::AXIS, |a| ints(&a.tp)),
        Bound::ints("pp", limits::LIST, 1, limits::AXIS, |a| ints(&a.pp)),
        Bound::ints("vpp", limits::LIST, 1, limits::AXIS, |a| ints(&a.vpp)),
        Bound::ints("cp", limits::LIST, 1, limits::AXIS, |a| ints(&a.cp)),
        Bound::ints("ep", limits::LIST, 1, limits::AXIS, |a| ints(&a.ep)),
        Bound::ints("etp", limits::LIST, 1, limits::AXIS, |a| ints(&a.etp)),
        Bound::ints("microBatchSize", limits::LIST, 1, limits::AXIS, |a| {
            ints(&a.micro_batch_size)
        }),
        Bound::items("recompute", limits::LIST, |a| items(&a.recompute)),
        Bound::items("recomputeModules", limits::LIST, |a| {
            items(&a.recompute_modules)
        }),
        Bound::items("schedule", limits::LIST, |a| items(&a.schedule)),
    ];

    /// The rows, then: no list is empty, no module list is long.
    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        bounds::check_rows(self, at, Self::BOUNDS)?;
        for row in Self::BOUNDS {
            let empty = match (row.get)(self) {
                Seen::Ints(l) => l.is_empty(),
                Seen::Items(n) => n == 0,
                _ => false,
            };
            if empty {
                return Err(FieldError::new(
                    bounds::path(at, row.field),
                    "must list at least one value (omit the axis to search all)",
                ));
            }
        }
        for (i, m) in self.recompute_modules.iter().flatten().enumerate() {
            bounds::check_one(
                &format!("recomputeModules[{i}]"),
                bounds::Limit::Items {
                    max: limits::MODULES,
                },
                Seen::Items(m.len()),
                at,
            )?;
        }
        Ok(())
    }
}

/// The LLM proposer's endpoint (OpenAI-compatible chat completions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<AgentSpec>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentSpec {
    /// Base URL, e.g. `http://llm.internal:8000/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Model name sent in the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Name of the environment variable holding the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Proposal rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u32>,
    /// Per-request timeout, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    /// Wall time for the whole agent search, seconds: no round starts after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_seconds: Option<u32>,
}

/// The agent's settings, bounded.
impl Bounded for AgentSpec {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::matching("endpoint", limits::URL, patterns::HTTP_URL, |a| {
            a.endpoint.as_ref().into()
        }),
        Bound::text("model", limits::NAME, |a| a.model.as_ref().into()),
        Bound::matching("apiKeyEnv", limits::NAME, patterns::ENV_NAME, |a| {
            a.api_key_env.as_ref().into()
        }),
        Bound::int("rounds", 0, limits::ROUNDS, |a| a.rounds.into()),
        Bound::int("timeoutSeconds", 0, limits::SECONDS, |a| {
            a.timeout_seconds.into()
        }),
        Bound::int("budgetSeconds", 0, limits::SECONDS, |a| {
            a.budget_seconds.into()
        }),
    ];
}

/// Default usable fraction of GPU memory for the tuner.
pub const DEFAULT_MEMORY_HEADROOM: f64 = 0.92;

/// `spec.tuning`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<Tuning>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tuning {
    /// Search strategy.
    #[serde(default)]
    pub searcher: SearcherKind,
    /// Usable fraction of the profile's usable memory (default 0.92).
    #[serde(default = "default_headroom")]
    pub memory_headroom: f64,
    /// Axes pinned during the search.
    #[serde(default)]
    pub fixed: FixedAxes,
    /// Value lists per axis.
    #[serde(default)]
    pub allowed: AllowedAxes,
    /// How many of the best layouts to report (default 5).
    #[serde(default = "default_top_k")]
    pub top_k: u32,
    /// LLM proposer settings (searcher `agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSpec>,
}

/// The tuning settings, bounded: `topK` (each reported layout is a status entry) and the
/// nested lists.
impl Bounded for Tuning {
    const BOUNDS: &'static [Bound<Self>] =
        &[Bound::int("topK", 1, limits::TOP_K, |t| t.top_k.into())];

    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        bounds::check_rows(self, at, Self::BOUNDS)?;
        bounds::check(&self.fixed, &bounds::path(at, "fixed"))?;
        bounds::check(&self.allowed, &bounds::path(at, "allowed"))?;
        if let Some(a) = &self.agent {
            bounds::check(a, &bounds::path(at, "agent"))?;
        }
        Ok(())
    }
}

/// Which model, bounded (an inline card is checked by [`ModelCard::validate`]).
impl Bounded for ModelRef {
    const BOUNDS: &'static [Bound<Self>] = &[Bound::text("preset", limits::NAME, |m| {
        m.preset.as_ref().into()
    })];
}

/// The cluster, bounded (an inline profile is checked by [`HardwareProfile::validate`]).
impl Bounded for ClusterSpec {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::text("gpu", limits::NAME, |c| c.gpu.as_ref().into()),
        Bound::int("gpus", 1, limits::GPUS, |c| c.gpus.into()),
        Bound::int("gpusPerNode", 1, limits::AXIS, |c| c.gpus_per_node.into()),
    ];
}

fn default_headroom() -> f64 {
    DEFAULT_MEMORY_HEADROOM
}
fn default_top_k() -> u32 {
    5
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            searcher: SearcherKind::default(),
            memory_headroom: DEFAULT_MEMORY_HEADROOM,
            fixed: FixedAxes::default(),
            allowed: AllowedAxes::default(),
            top_k: default_top_k(),
            agent: None,
        }
    }
}

/// `spec` of a TrainingPlan, as far as the oracle reads it. Other keys (`benchmark`, `job`,
/// `drift`, ...) belong to the operator and are kept in `operator` untouched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PlanSpec {
    pub model: ModelRef,
    pub cluster: ClusterSpec,
    pub training: Training,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<Layout>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<Tuning>,
    /// Keys the oracle does not read (operator settings).
    #[serde(flatten)]
    pub operator: BTreeMap<String, serde_json::Value>,
}

/// Keys of `spec` that belong to the operator; anything else unknown is a typo.
pub const OPERATOR_SPEC_KEYS: &[&str] = &["benchmark", "job", "drift"];

/// A resolved plan: the scenario plus the optional reference layout and tuning settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// `metadata.name`, or the file stem.
    pub name: String,
    pub scenario: Scenario,
    pub layout: Option<Layout>,
    pub tuning: Tuning,
}

impl Plan {
    /// The layout to project: `spec.parallelism`, or an error naming it when absent.
    pub fn layout(&self) -> Result<&Layout, PlanError> {
        self.layout.as_ref().ok_or_else(|| {
            PlanError::field(
                "spec.parallelism",
                "missing: `project` and `memory` need a layout (or run `primus tune`)",
            )
        })
    }

    /// The same plan with `spec.parallelism` set to `layout` (a finalist's benchmark).
    pub fn with_layout(&self, layout: Layout) -> Plan {
        Plan {
            layout: Some(layout),
            ..self.clone()
        }
    }
}

impl PlanSpec {
    /// Parse `spec` from a JSON value (the operator's path). Unknown keys other than the
    /// operator's own are rejected, naming the key.
    pub fn from_json(spec: serde_json::Value) -> Result<PlanSpec, FieldError> {
        check_spec_keys(&spec)?;
        from_value_at(spec, "spec")
    }

    /// Resolve presets and defaults against a catalog and check every field: each within its
    /// bounds ([`crate::bounds`]), so nothing downstream sees an unbounded value, and each
    /// field's own rules. The layout's legality against the scenario is checked separately
    /// ([`Layout::check`]).
    pub fn resolve(&self, name: &str, catalog: &Catalog) -> Result<Plan, FieldError> {
        bounds::check(&self.model, "spec.model")?;
        bounds::check(&self.cluster, "spec.cluster")?;
        let model = self.resolve_model(catalog)?;
        let hardware = self.resolve_hardware(catalog)?;
        let cluster = self.resolve_cluster(&hardware)?;
        bounds::check(&self.training, "spec.training")?;
        if let Some(l) = &self.parallelism {
            bounds::check(l, "spec.parallelism")?;
        }
        let tuning = self.resolve_tuning()?;
        Ok(Plan {
            name: name.to_string(),
            scenario: Scenario {
                model,
                hardware,
                cluster,
                training: self.training,
            },
            layout: self.parallelism.clone(),
            tuning,
        })
    }

    /// `spec.model`: a preset from the catalog or a checked inline card.
    fn resolve_model(&self, catalog: &Catalog) -> Result<ModelCard, FieldError> {
        match (&self.model.preset, &self.model.card) {
            (Some(_), Some(_)) => Err(FieldError::new(
                "spec.model",
                "give either `preset` or `card`, not both",
            )),
            (None, None) => Err(FieldError::new(
                "spec.model",
                "missing: give `preset` (see `primus profiles`) or an inline `card`",
            )),
            (Some(p), None) => catalog.model(p).cloned().ok_or_else(|| {
                FieldError::new(
                    "spec.model.preset",
                    format!(
                        "unknown model preset {p:?}; known: {}",
                        catalog.model_names().join(", ")
                    ),
                )
            }),
            (None, Some(card)) => {
                card.validate("spec.model.card")?;
                Ok(card.clone())
            }
        }
    }

    /// `spec.cluster.gpu` / `gpuProfile`: a profile from the catalog or a checked inline one.
    fn resolve_hardware(&self, catalog: &Catalog) -> Result<HardwareProfile, FieldError> {
        match (&self.cluster.gpu, &self.cluster.gpu_profile) {
            (Some(_), Some(_)) => Err(FieldError::new(
                "spec.cluster",
                "give either `gpu` or `gpuProfile`, not both",
            )),
            (None, None) => Err(FieldError::new(
                "spec.cluster.gpu",
                "missing: name a hardware profile (see `primus profiles`) or give `gpuProfile`",
            )),
            (Some(g), None) => catalog.hardware(g).cloned().ok_or_else(|| {
                FieldError::new(
                    "spec.cluster.gpu",
                    format!(
                        "unknown hardware profile {g:?}; known: {}",
                        catalog.hardware_names().join(", ")
                    ),
                )
            }),
            (None, Some(p)) => {
                p.validate("spec.cluster.gpuProfile")?;
                Ok(p.clone())
            }
        }
    }

    /// `spec.cluster.gpus` and `gpusPerNode` (default: the profile's), in whole nodes.
    fn resolve_cluster(&self, hardware: &HardwareProfile) -> Result<Cluster, FieldError> {
        let gpus = self.cluster.gpus;
        let gpus_per_node = self.cluster.gpus_per_node.unwrap_or(hardware.gpus_per_node);
        if gpus > gpus_per_node && !gpus.is_multiple_of(gpus_per_node) {
            return Err(FieldError::new(
                "spec.cluster.gpus",
                format!("{gpus} is not a multiple of gpusPerNode {gpus_per_node}"),
            ));
        }
        Ok(Cluster {
            gpus,
            gpus_per_node,
        })
    }

    /// `spec.tuning` (default when absent), checked against `spec.parallelism`.
    fn resolve_tuning(&self) -> Result<Tuning, FieldError> {
        let tuning = self.tuning.clone().unwrap_or_default();
        bounds::check(&tuning, "spec.tuning")?;
        if !(tuning.memory_headroom > 0.0 && tuning.memory_headroom <= 1.0) {
            return Err(FieldError::new(
                "spec.tuning.memoryHeadroom",
                format!(
                    "must be a fraction in (0, 1], got {}",
                    tuning.memory_headroom
                ),
            ));
        }
        if tuning.searcher == SearcherKind::None && self.parallelism.is_none() {
            return Err(FieldError::new(
                "spec.parallelism",
                "missing: searcher `none` projects spec.parallelism as given",
            ));
        }
        Ok(tuning)
    }
}

/// `spec` is a mapping of known keys (the oracle's and the operator's); anything else is a
/// typo, named.
pub fn check_spec_keys(spec: &serde_json::Value) -> Result<(), FieldError> {
    let Some(obj) = spec.as_object() else {
        return Err(FieldError::new("spec", "must be a mapping"));
    };
    for key in obj.keys() {
        let known = ["model", "cluster", "training", "parallelism", "tuning"]
            .contains(&key.as_str())
            || OPERATOR_SPEC_KEYS.contains(&key.as_str());
        if !known {
            return Err(FieldError::new(
                format!("spec.{}", key.chars().take(64).collect::<String>()),
                "unknown field (expected one of model, cluster, training, parallelism, tuning, benchmark, job, drift)",
            ));
        }
    }
    Ok(())
}

/// Parse a whole TrainingPlan document (or a bare spec) from YAML text and resolve it.
pub fn parse_plan(text: &str, source_name: &str, catalog: &Catalog) -> Result<Plan, PlanError> {
    let (spec, name) = read_document(text, source_name)?;
    let spec = PlanSpec::from_json(spec)?;
    Ok(spec.resolve(&name, catalog)?)
}

/// A TrainingPlan document (`apiVersion`, `kind`, `metadata.name`, `spec`) or a bare spec,
/// from YAML text: its `spec` and its name (`metadata.name`, else the file stem).
pub fn read_document(
    text: &str,
    source_name: &str,
) -> Result<(serde_json::Value, String), PlanError> {
    let value = parse_yaml_value(text, source_name)?;
    let serde_json::Value::Object(mut doc) = value else {
        return Err(PlanError::Syntax {
            source_name: source_name.to_string(),
            message: "expected a TrainingPlan mapping at the top level".into(),
        });
    };
    let (spec, name) = if doc.contains_key("spec") {
        if let Some(kind) = doc.get("kind")
            && kind != "TrainingPlan"
        {
            return Err(PlanError::field(
                "kind",
                one_line(&format!("expected TrainingPlan, got {kind}")),
            ));
        }
        if let Some(api) = doc.get("apiVersion")
            && api != "primus.dev/v1alpha1"
        {
            return Err(PlanError::field(
                "apiVersion",
                one_line(&format!("expected primus.dev/v1alpha1, got {api}")),
            ));
        }
        let name = doc
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .map(str::to_string);
        (doc.remove("spec").unwrap_or_default(), name)
    } else {
        (serde_json::Value::Object(doc), None)
    };
    let name = name.unwrap_or_else(|| {
        std::path::Path::new(source_name)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("plan")
            .to_string()
    });
    Ok((spec, name))
}

/// Read and parse a plan file.
pub fn load_plan(path: &std::path::Path, catalog: &Catalog) -> Result<Plan, PlanError> {
    let text = crate::bounds::read_input(path, crate::bounds::limits::DOCUMENT_BYTES)?;
    parse_plan(&text, &path.display().to_string(), catalog)
}
