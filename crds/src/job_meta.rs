//! What the operator reads from the metadata of any job it writes (PyTorchJob, TrainJob): the
//! layout it says it runs, the `spec.job.suspend` applied last, and the queue it waits in.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use primus_oracle::layout::Layout;

use crate::annotations;

/// The layout the job says it runs (its `primus.dev/layout` annotation).
pub fn annotated_layout(meta: &ObjectMeta) -> Option<Layout> {
    meta.annotations
        .as_ref()?
        .get(annotations::LAYOUT)
        .and_then(|s| serde_json::from_str(s).ok())
}

/// The `spec.job.suspend` the operator last applied (its `primus.dev/suspend-applied`
/// annotation); None on a job written before the annotation or by someone else.
pub fn applied_suspend(meta: &ObjectMeta) -> Option<bool> {
    match meta
        .annotations
        .as_ref()?
        .get(annotations::SUSPEND_APPLIED)?
        .as_str()
    {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// The queue named in the metadata: Kueue's queue-name label, else Volcano's queue-name
/// annotation.
pub fn queue(meta: &ObjectMeta) -> Option<String> {
    let label = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(annotations::KUEUE_QUEUE));
    let ann = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::VOLCANO_QUEUE));
    label.or(ann).filter(|q| !q.is_empty()).cloned()
}
