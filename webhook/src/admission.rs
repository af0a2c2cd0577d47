//! AdmissionReview (admission.k8s.io/v1) in, AdmissionReview out: the bytes the API server
//! sends and the bytes it gets back, with no network in between (the server and the tests call
//! [`handle`]). Malformed input gets HTTP 400 with an AdmissionReview whose status says what is
//! wrong; nothing here panics on input (a panic in the check itself is caught and fails open).

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use kube::core::DynamicObject;
use kube::core::Status;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use primus_crds::{JobKind, pytorchjob, trainjob};

use crate::trainingplan;
use crate::validate::{JobRequest, Reason, Validator, Verdict};

/// Which endpoint a review arrived at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// kubeflow.org/v1 PyTorchJob; `strict` denies jobs that cannot be derived.
    PyTorchJob { strict: bool },
    /// trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer v2), likewise.
    TrainJob { strict: bool },
    /// primus.dev/v1alpha1 TrainingPlan.
    TrainingPlan,
}

impl Endpoint {
    /// The kind label of the metrics.
    pub fn kind(self) -> &'static str {
        match self {
            Endpoint::PyTorchJob { .. } => pytorchjob::KIND,
            Endpoint::TrainJob { .. } => trainjob::KIND,
            Endpoint::TrainingPlan => "TrainingPlan",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Endpoint::PyTorchJob { .. } => pytorchjob::GROUP,
            Endpoint::TrainJob { .. } => trainjob::GROUP,
            Endpoint::TrainingPlan => primus_crds::GROUP,
        }
    }
}

/// The answer to one request.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status: 200 for every decision, 400 for a malformed request.
    pub status: u16,
    /// JSON body (an AdmissionReview).
    pub body: Vec<u8>,
    pub kind: &'static str,
    /// `allow`, `warn`, `deny` or `error`.
    pub decision: &'static str,
    pub reason: Reason,
    /// Fields for the log line.
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub operation: &'static str,
    pub dry_run: bool,
    pub message: String,
}

fn serialize(review: &AdmissionReview<DynamicObject>) -> Vec<u8> {
    serde_json::to_vec(review).unwrap_or_else(|e| {
        // Unreachable with these types; answer something the API server can read anyway.
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{{"uid":"","allowed":false,"status":{{"message":"cannot serialize the response: {}","code":500}}}}}}"#,
            e.to_string().replace(['"', '\\'], "'")
        )
        .into_bytes()
    })
}

/// A 400 reply for a request that is not a usable AdmissionReview.
fn malformed(kind: &'static str, reason: Reason, message: String, uid: Option<String>) -> Reply {
    let mut resp = AdmissionResponse::invalid(&message);
    resp.result = Status::failure(&message, "BadRequest").with_code(400);
    if let Some(uid) = &uid {
        resp.uid = uid.clone();
    }
    Reply {
        status: 400,
        body: serialize(&resp.into_review()),
        kind,
        decision: "error",
        reason,
        uid: uid.unwrap_or_default(),
        namespace: String::new(),
        name: String::new(),
        operation: "",
        dry_run: false,
        message,
    }
}

fn operation_str(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// Parse a request body into an AdmissionRequest (with the review's apiVersion/kind kept for
/// the response), or the 400 reply explaining why not.
pub fn parse(ep: Endpoint, body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, Box<Reply>> {
    let kind = ep.kind();
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).map_err(|e| {
        Box::new(malformed(
            kind,
            Reason::Malformed,
            format!("the request body is not an AdmissionReview: {e}"),
            None,
        ))
    })?;
    if review.types.kind != "AdmissionReview"
        || !review.types.api_version.starts_with("admission.k8s.io/")
    {
        return Err(Box::new(malformed(
            kind,
            Reason::Malformed,
            format!(
                "expected kind AdmissionReview of admission.k8s.io/v1, got kind {:?} apiVersion {:?}",
                review.types.kind, review.types.api_version
            ),
            None,
        )));
    }
    review.try_into().map_err(|_| {
        Box::new(malformed(
            kind,
            Reason::Malformed,
            "the AdmissionReview has no request".into(),
            None,
        ))
    })
}

/// Decide one parsed request. Panics in the check are caught: the request is then allowed
/// with a warning (denied in strict mode), and the reason is `internal`.
pub fn decide(
    v: &Validator,
    ep: Endpoint,
    req: &AdmissionRequest<DynamicObject>,
    deadline: Instant,
) -> Verdict {
    let run = || -> Verdict {
        if req.sub_resource.is_some() {
            return Verdict::allow(Reason::NotApplicable);
        }
        if !matches!(req.operation, Operation::Create | Operation::Update) {
            return Verdict::allow(Reason::NotApplicable);
        }
        let Some(obj) = &req.object else {
            // `handle` answers this with a 400 before it gets here.
            return Verdict::allow(Reason::NotApplicable);
        };
        let empty = BTreeMap::new();
        match ep {
            Endpoint::PyTorchJob { strict } | Endpoint::TrainJob { strict } => {
                let kind = match ep {
                    Endpoint::TrainJob { .. } => JobKind::TrainJob,
                    _ => JobKind::PyTorchJob,
                };
                let job = JobRequest {
                    labels: obj.metadata.labels.as_ref().unwrap_or(&empty),
                    annotations: obj.metadata.annotations.as_ref().unwrap_or(&empty),
                    data: &obj.data,
                    old: match req.operation {
                        Operation::Update => req.old_object.as_ref().map(|o| &o.data),
                        _ => None,
                    },
                };
                v.job(kind, &job, strict, deadline)
            }
            Endpoint::TrainingPlan => {
                let name = obj
                    .metadata
                    .name
                    .clone()
                    .unwrap_or_else(|| req.name.clone());
                trainingplan::validate(&name, &obj.data, &v.catalog)
            }
        }
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(verdict) => verdict,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            tracing::error!(uid = %req.uid, panic = %what, "the admission check panicked (a bug): failing open");
            internal_verdict(
                v,
                ep,
                &format!("the memory check failed internally ({what})"),
            )
        }
    }
}

/// What to answer when the check itself failed (a panic, an overrun): allowed with a warning,
/// denied in strict mode.
pub fn internal_verdict(v: &Validator, ep: Endpoint, why: &str) -> Verdict {
    let strict = v.settings.strict
        || matches!(
            ep,
            Endpoint::PyTorchJob { strict: true } | Endpoint::TrainJob { strict: true }
        );
    if strict {
        Verdict::deny(
            Reason::Internal,
            500,
            format!("strict admission: cannot check GPU memory: {why}"),
        )
    } else {
        let mut verdict = Verdict::allow(Reason::Internal);
        verdict
            .warnings
            .push(format!("primus: cannot check GPU memory: {why}"));
        verdict
    }
}

/// The reply for a decided request.
pub fn respond(ep: Endpoint, req: &AdmissionRequest<DynamicObject>, verdict: Verdict) -> Reply {
    let mut resp = AdmissionResponse::from(req);
    if !verdict.allowed {
        let reason = if verdict.code == 422 {
            "Invalid"
        } else {
            "Forbidden"
        };
        resp = resp.deny(&verdict.message);
        resp.result = Status::failure(&verdict.message, reason).with_code(verdict.code);
    }
    if !verdict.warnings.is_empty() {
        resp.warnings = Some(verdict.warnings.clone());
    }
    resp.audit_annotations = verdict.audit.clone().into_iter().collect();
    Reply {
        status: 200,
        body: serialize(&resp.into_review()),
        kind: ep.kind(),
        decision: verdict.decision(),
        reason: verdict.reason,
        uid: req.uid.clone(),
        namespace: req.namespace.clone().unwrap_or_default(),
        name: req.name.clone(),
        operation: operation_str(&req.operation),
        dry_run: req.dry_run,
        message: if verdict.allowed {
            verdict.warnings.join(" | ")
        } else {
            verdict.message
        },
    }
}

/// Check what `decide` needs and that the request is for this endpoint's kind; a 400 reply
/// otherwise.
pub fn precheck(ep: Endpoint, req: &AdmissionRequest<DynamicObject>) -> Result<(), Box<Reply>> {
    let kind = ep.kind();
    if req.kind.group != ep.group() || req.kind.kind != kind {
        return Err(Box::new(malformed(
            kind,
            Reason::WrongKind,
            format!(
                "this endpoint validates {}/{kind}, not {}/{} {}",
                ep.group(),
                if req.kind.group.is_empty() {
                    "core"
                } else {
                    &req.kind.group
                },
                req.kind.version,
                req.kind.kind
            ),
            Some(req.uid.clone()),
        )));
    }
    if matches!(req.operation, Operation::Create | Operation::Update)
        && req.sub_resource.is_none()
        && req.object.is_none()
    {
        return Err(Box::new(malformed(
            kind,
            Reason::Malformed,
            format!(
                "request.object is missing from a {} request",
                operation_str(&req.operation)
            ),
            Some(req.uid.clone()),
        )));
    }
    Ok(())
}

/// Answer one request body, start to end.
pub fn handle(v: &Validator, ep: Endpoint, body: &[u8], deadline: Instant) -> Reply {
    let req = match parse(ep, body) {
        Ok(r) => r,
        Err(reply) => return *reply,
    };
    if let Err(reply) = precheck(ep, &req) {
        return *reply;
    }
    let verdict = decide(v, ep, &req, deadline);
    respond(ep, &req, verdict)
}

/// An AdmissionReview request for `object` as the API server would send it (for the load
/// generator and tests): `operation` CREATE or UPDATE (with `old`), `dry_run` as given.
pub fn review_for(
    object: &serde_json::Value,
    operation: &str,
    old: Option<&serde_json::Value>,
    dry_run: bool,
    uid: &str,
) -> serde_json::Value {
    let api_version = object
        .get("apiVersion")
        .and_then(serde_json::Value::as_str)
        .unwrap_or(pytorchjob::API_VERSION);
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = object
        .get("kind")
        .and_then(serde_json::Value::as_str)
        .unwrap_or(pytorchjob::KIND);
    let gvk = serde_json::json!({"group": group, "version": version, "kind": kind});
    let gvr = serde_json::json!({
        "group": group,
        "version": version,
        "resource": format!("{}s", kind.to_lowercase()),
    });
    let meta = object.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .cloned()
        .unwrap_or(serde_json::Value::String(String::new()));
    let namespace = meta
        .and_then(|m| m.get("namespace"))
        .cloned()
        .unwrap_or(serde_json::Value::String("default".into()));
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "primus-webhook-test", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": if operation == "UPDATE" { "UpdateOptions" } else { "CreateOptions" }},
        }
    })
}
