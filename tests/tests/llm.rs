//! The real small model the agent's tests use (SmolLM2-135M-Instruct served by llama.cpp's
//! `llama-server` on loopback, installed by `tests/llm/install.sh`): an OpenAI-compatible
//! `/v1/chat/completions` whose `response_format` JSON schema is enforced on every reply, and
//! the launcher's adapter that gives requests without one a default schema.

use primus_tests::llm::Options;
use primus_tests::llm_server;
use serde_json::{Value, json};

/// `{"tp": int, "pp": int, "microBatchSize": int}`, nothing else.
fn layout_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "tp": {"type": "integer"},
            "pp": {"type": "integer"},
            "microBatchSize": {"type": "integer"}
        },
        "required": ["tp", "pp", "microBatchSize"],
        "additionalProperties": false
    })
}

/// Why `content` does not match [`layout_schema`], if it does not.
fn layout_mismatch(content: &str) -> Option<String> {
    let v: Value = match serde_json::from_str(content) {
        Ok(v) => v,
        Err(e) => return Some(format!("not JSON: {e}")),
    };
    let Some(o) = v.as_object() else {
        return Some("not an object".into());
    };
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["microBatchSize", "pp", "tp"] {
        return Some(format!("keys {keys:?}"));
    }
    // JSON Schema's integer: a number without a fractional part (`-0` and `1.0` are integers;
    // llama.cpp's grammar emits `-0` when the schema sets no minimum).
    o.values()
        .find(|x| !x.as_f64().is_some_and(|f| f.fract() == 0.0))
        .map(|x| format!("{x} is not an integer"))
}

fn content(reply: &Value) -> String {
    reply
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no choices[0].message.content in {reply}"))
        .to_string()
}

const PROMPTS: [&str; 5] = [
    "Propose a parallel layout (tensor parallel tp, pipeline parallel pp, micro-batch size) for training a 7B model on 16 GPUs.",
    "Which tp, pp and micro-batch size would you use for Llama 3 70B on 64 H100 GPUs?",
    "Give me a Megatron layout for a small model on 8 GPUs.",
    "Hello! What is your name?",
    "Write a haiku about pipelines.",
];

#[test]
fn json_schema_replies_match_the_schema_every_time() {
    let Some(llm) = llm_server!(Options::default()) else {
        return;
    };
    let response_format = json!({
        "type": "json_schema",
        "json_schema": {"name": "layout", "strict": true, "schema": layout_schema()}
    });
    // Ten tries: five prompts (two unrelated to layouts), sampled at temperature 1 with
    // different seeds, so the replies differ and only the constraint keeps them in shape.
    for i in 0..10u64 {
        let reply = llm
            .chat(&json!({
                "messages": [{"role": "user", "content": PROMPTS[i as usize % PROMPTS.len()]}],
                "response_format": response_format,
                "temperature": 1.0,
                "seed": 1000 + i,
                "max_tokens": 200,
            }))
            .unwrap_or_else(|e| panic!("try {i}: {e}\n{}", llm.log_tail()));
        let text = content(&reply);
        assert_eq!(
            reply.pointer("/choices/0/finish_reason"),
            Some(&json!("stop")),
            "try {i}: the reply ended early: {text:?}"
        );
        if let Some(why) = layout_mismatch(&text) {
            panic!("try {i}: {why}: {text:?}");
        }
        assert_eq!(reply["model"], llm.model());
    }

    // The same prompts without the schema: the model answers in prose, so the schema above is
    // what made the replies match (this part fails if the constraint were a no-op).
    let free: Vec<String> = (0..3u64)
        .map(|i| {
            content(
                &llm.chat(&json!({
                    "messages": [{"role": "user", "content": PROMPTS[i as usize]}],
                    "temperature": 1.0,
                    "seed": 2000 + i,
                    "max_tokens": 60,
                }))
                .unwrap(),
            )
        })
        .collect();
    assert!(
        free.iter().any(|t| layout_mismatch(t).is_some()),
        "unconstrained replies matched the schema too: {free:?}"
    );
}

#[test]
fn the_adapter_gives_requests_without_a_schema_the_default_one() {
    let opts = Options {
        json_schema: Some(layout_schema()),
        ..Options::default()
    };
    let Some(llm) = llm_server!(opts) else {
        return;
    };
    for i in 0..3u64 {
        let reply = llm
            .chat(&json!({
                "messages": [{"role": "user", "content": PROMPTS[i as usize]}],
                "temperature": 0.7,
                "seed": 3000 + i,
                "max_tokens": 200,
            }))
            .unwrap_or_else(|e| panic!("try {i}: {e}\n{}", llm.log_tail()));
        let text = content(&reply);
        if let Some(why) = layout_mismatch(&text) {
            panic!("try {i}: the default schema was not applied ({why}): {text:?}");
        }
    }
    // A request's own schema wins over the default.
    let own = json!({
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": false
    });
    let reply = llm
        .chat(&json!({
            "messages": [{"role": "user", "content": "Is 16 a power of two?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "yn", "schema": own}},
            "max_tokens": 50,
        }))
        .unwrap();
    let v: Value = serde_json::from_str(&content(&reply)).expect("JSON");
    assert!(
        v == json!({"answer": "yes"}) || v == json!({"answer": "no"}),
        "{v}"
    );
    // Other endpoints pass through the adapter unchanged.
    let (status, models) = llm.get("/v1/models").unwrap();
    assert_eq!(status, 200, "{models}");
    assert!(models.contains(llm.model()), "{models}");
}
