//! What a TrainingPlan may say about searcher `agent` in the cluster, checked the same way by
//! the admission webhook and the operator: `model`, `rounds`, `timeoutSeconds`,
//! `budgetSeconds`. The endpoint and its key are the operator's configuration (Helm values
//! `operator.agent`, a Secret in the release namespace, the operator's environment): a plan
//! naming them is refused, so a plan can neither point the operator's key at another server
//! nor have the operator read a variable of its environment.

use primus_oracle::FieldError;
use primus_oracle::plan::Plan;

/// Most agent rounds a plan may ask for.
pub const MAX_AGENT_ROUNDS: u32 = 50;
/// The agent's settings a plan may give in the cluster: `model`, `rounds`, `timeoutSeconds`,
/// `budgetSeconds`. The endpoint and its key are the operator's configuration (Helm values
/// `operator.agent`, a Secret in the release namespace): a plan naming them is refused, so a
/// plan can neither point the operator's key at another server nor read its environment.
pub fn check_agent(plan: &Plan) -> Result<(), FieldError> {
    let Some(a) = &plan.tuning.agent else {
        return Ok(());
    };
    if a.endpoint.is_some() {
        return Err(FieldError::new(
            "spec.tuning.agent.endpoint",
            "set by the operator's configuration (Helm values operator.agent), not by plans; remove it",
        ));
    }
    if a.api_key_env.is_some() {
        return Err(FieldError::new(
            "spec.tuning.agent.apiKeyEnv",
            "the API key is the operator's configuration (Helm values operator.agent), not the plan's; remove it",
        ));
    }
    for (field, v) in [
        ("rounds", a.rounds),
        ("timeoutSeconds", a.timeout_seconds),
        ("budgetSeconds", a.budget_seconds),
    ] {
        if v == Some(0) {
            return Err(FieldError::new(
                format!("spec.tuning.agent.{field}"),
                "must be greater than 0",
            ));
        }
    }
    if a.rounds.is_some_and(|r| r > MAX_AGENT_ROUNDS) {
        return Err(FieldError::new(
            "spec.tuning.agent.rounds",
            format!("at most {MAX_AGENT_ROUNDS}"),
        ));
    }
    Ok(())
}
