//! The GPU kind of a PyTorchJob: node selector and required node affinity on the GPU product
//! label (`amd.com/gpu.product-name`, `nvidia.com/gpu.product`), the `primus.dev/gpu`
//! annotation, or the GPU resource name when only one hardware profile uses it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use primus_crds::annotations;
use primus_oracle::hardware::HardwareProfile;
use primus_oracle::profiles::Catalog;

/// Labels that name the GPU product on nodes, from the catalog (plus the two well-known ones).
pub fn product_labels(catalog: &Catalog) -> Vec<String> {
    let mut labels: Vec<String> = catalog
        .hardware_profiles()
        .map(|p| p.kubernetes.product_label.clone())
        .collect();
    for l in ["amd.com/gpu.product-name", "nvidia.com/gpu.product"] {
        labels.push(l.to_string());
    }
    labels.sort();
    labels.dedup();
    labels
}

/// Extended resource names of GPUs, from the catalog (plus the two well-known ones).
pub fn gpu_resources(catalog: &Catalog) -> Vec<String> {
    let mut r: Vec<String> = catalog
        .hardware_profiles()
        .map(|p| p.kubernetes.resource.clone())
        .collect();
    for l in ["amd.com/gpu", "nvidia.com/gpu"] {
        r.push(l.to_string());
    }
    r.sort();
    r.dedup();
    r
}

/// Product label values the pod's required node affinity allows, per label key.
fn affinity_values<'a>(pod: &'a PodSpec, label: &str) -> Vec<&'a str> {
    let terms = pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == label && e.operator == "In")
        .flat_map(|e| e.values.iter().flatten().map(String::as_str))
        .collect()
}

/// The GPU kind of a job and where it came from.
pub struct GpuKind {
    pub profile: HardwareProfile,
    /// How it was found, e.g. `nodeSelector amd.com/gpu.product-name=AMD_Instinct_MI300X`.
    pub source: String,
    /// Something to tell the user (several kinds allowed, inferred from the resource alone).
    pub note: Option<String>,
}

/// The GPU kind: node selector, then required node affinity, then the `primus.dev/gpu`
/// annotation, then the GPU resource name when only one profile uses it.
pub fn gpu_kind(
    pods: &[&PodSpec],
    annotations: &BTreeMap<String, String>,
    resource: Option<&str>,
    catalog: &Catalog,
) -> Result<GpuKind, String> {
    let labels = product_labels(catalog);
    let mut unknown: Vec<String> = Vec::new();
    if let Some(k) = by_node_selector(pods, &labels, catalog, &mut unknown) {
        return Ok(k);
    }
    if let Some(k) = by_affinity(pods, &labels, catalog, &mut unknown) {
        return Ok(k);
    }
    if let Some(name) = annotations.get(annotations::GPU) {
        return match catalog.hardware(name.trim()) {
            Some(p) => Ok(GpuKind {
                profile: p.clone(),
                source: format!("annotation {}={name}", annotations::GPU),
                note: None,
            }),
            None => Err(format!(
                "GPU kind: unknown hardware profile {} in annotation {}; known: {}",
                primus_oracle::parse::quote(name),
                annotations::GPU,
                catalog.hardware_names().join(", ")
            )),
        };
    }
    if !unknown.is_empty() {
        let known: Vec<String> = catalog
            .hardware_profiles()
            .flat_map(|p| p.kubernetes.product_values.first().cloned())
            .collect();
        return Err(format!(
            "GPU kind: no hardware profile for {} (known products: {}); or name a profile in annotation {}",
            unknown.join(", "),
            known.join(", "),
            annotations::GPU
        ));
    }
    let Some(resource) = resource else {
        return Err(format!(
            "GPU kind: no GPU resource, no nodeSelector on {} and no annotation {}",
            labels.join(" / "),
            annotations::GPU
        ));
    };
    by_resource(resource, catalog)
}

/// The first pod whose node selector names a known product (unknown ones go to `unknown`).
fn by_node_selector(
    pods: &[&PodSpec],
    labels: &[String],
    catalog: &Catalog,
    unknown: &mut Vec<String>,
) -> Option<GpuKind> {
    for sel in pods.iter().filter_map(|p| p.node_selector.as_ref()) {
        for label in labels {
            let Some(v) = sel.get(label) else { continue };
            match catalog.hardware_by_product_label(v) {
                Some(p) => {
                    return Some(GpuKind {
                        profile: p.clone(),
                        source: format!("nodeSelector {label}={v}"),
                        note: None,
                    });
                }
                None => unknown.push(format!("nodeSelector {label}={v}")),
            }
        }
    }
    None
}

/// The first pod whose required node affinity allows known products: the one with the least
/// memory of them (the scheduler may place the job on any).
fn by_affinity(
    pods: &[&PodSpec],
    labels: &[String],
    catalog: &Catalog,
    unknown: &mut Vec<String>,
) -> Option<GpuKind> {
    for pod in pods {
        for label in labels {
            let values = affinity_values(pod, label);
            let mut found: Vec<&HardwareProfile> = Vec::new();
            for v in &values {
                match catalog.hardware_by_product_label(v) {
                    Some(p) if !found.iter().any(|f| f.name == p.name) => found.push(p),
                    Some(_) => {}
                    None => unknown.push(format!("node affinity {label} In {v}")),
                }
            }
            if found.is_empty() {
                continue;
            }
            found.sort_by(|a, b| a.usable_bytes().total_cmp(&b.usable_bytes()));
            let p = found[0];
            let note = (found.len() > 1).then(|| {
                format!(
                    "node affinity allows {}: checked against the smallest, {}",
                    found
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    p.name
                )
            });
            return Some(GpuKind {
                profile: p.clone(),
                source: format!("node affinity {label} In [{}]", values.join(", ")),
                note,
            });
        }
    }
    None
}

/// The profile of a GPU resource when exactly one uses it.
fn by_resource(resource: &str, catalog: &Catalog) -> Result<GpuKind, String> {
    let candidates: Vec<&HardwareProfile> = catalog
        .hardware_profiles()
        .filter(|p| p.kubernetes.resource == resource)
        .collect();
    match candidates.as_slice() {
        [p] => Ok(GpuKind {
            profile: (*p).clone(),
            source: format!("resource {resource} (the only profile using it)"),
            note: Some(format!(
                "GPU kind inferred from the resource {resource} alone ({}): pin it with a nodeSelector or annotation {}",
                p.name,
                annotations::GPU
            )),
        }),
        _ => {
            let label = candidates
                .first()
                .map(|p| p.kubernetes.product_label.clone())
                .unwrap_or_else(|| "the GPU product label".into());
            Err(format!(
                "GPU kind: the job asks for {resource} but not which product ({}); add a nodeSelector on {label} or annotation {}",
                candidates
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                annotations::GPU
            ))
        }
    }
}
