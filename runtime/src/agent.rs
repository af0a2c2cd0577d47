//! The tuning agent's transport: [`ChatCompletions`] implements the oracle's
//! [`Proposer`] over an OpenAI-compatible chat-completions endpoint (`POST
//! {endpoint}/chat/completions`, reqwest on a one-thread tokio runtime). The prompts, the reply
//! parsing and the search loop are the oracle's ([`primus_oracle::tune::agent`]); this is the
//! only part that touches the network, shared by the CLI and the operator.
//!
//! Requests ask for structured output: `response_format: {type: json_schema, ...}` with the
//! oracle's [`reply_schema`]. A server that refuses the field (HTTP 400 naming
//! `response_format`) is asked again without it, and not asked with it again. Reasoning models'
//! `reasoning_content` is not the answer and is not read.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use primus_oracle::tune::agent::{ChatMessage, ProposeError, Proposer, reply_schema};

/// Largest response body read (a chat completion is a few KiB).
const MAX_BODY: usize = 4 << 20;

/// An OpenAI-compatible chat-completions endpoint (`POST {endpoint}/chat/completions`),
/// e.g. vLLM, SGLang, llama.cpp's server, or a hosted API.
pub struct ChatCompletions {
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    url: String,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
    /// Whether to send `response_format` (cleared when the server refuses it).
    structured: bool,
    /// Proposals per reply the schema allows.
    per_round: usize,
    /// No request runs past this instant (the search's time budget).
    deadline: Option<Instant>,
}

impl ChatCompletions {
    /// `endpoint` is the API base (`http://host:8000/v1`) or the full
    /// `.../chat/completions` URL.
    pub fn new(
        endpoint: &str,
        model: &str,
        api_key: Option<String>,
        timeout: Duration,
    ) -> Result<ChatCompletions, ProposeError> {
        // reqwest is built without a default TLS crypto provider: install ring's (a no-op
        // when one is installed already).
        crate::tls::install_ring_provider();
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ProposeError::Transport(e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ProposeError::Transport(e.to_string()))?;
        let base = endpoint.trim_end_matches('/');
        let url = if base.ends_with("/chat/completions") {
            base.to_string()
        } else {
            format!("{base}/chat/completions")
        };
        Ok(ChatCompletions {
            client,
            runtime,
            url,
            model: model.to_string(),
            api_key,
            timeout,
            structured: true,
            per_round: 8,
            deadline: None,
        })
    }

    /// Send no `response_format` (for servers known not to take it).
    pub fn unstructured(mut self) -> ChatCompletions {
        self.structured = false;
        self
    }

    /// Proposals per reply the schema allows (the searcher's `per_round`).
    pub fn per_round(mut self, n: usize) -> ChatCompletions {
        self.per_round = n.max(1);
        self
    }

    /// No request runs past `deadline`.
    pub fn deadline(mut self, deadline: Instant) -> ChatCompletions {
        self.deadline = Some(deadline);
        self
    }

    /// One exchange: the status and the body (at most [`MAX_BODY`] bytes).
    fn post(&self, body: &Value) -> Result<(reqwest::StatusCode, String), ProposeError> {
        let mut timeout = self.timeout;
        if let Some(d) = self.deadline {
            timeout = timeout.min(d.saturating_duration_since(Instant::now()));
        }
        let secs = timeout.as_secs();
        if timeout.is_zero() {
            return Err(ProposeError::Timeout(0));
        }
        let mut req = self.client.post(&self.url).json(body).timeout(timeout);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let transport = |e: reqwest::Error| {
            if e.is_timeout() {
                ProposeError::Timeout(secs)
            } else {
                ProposeError::Transport(e.without_url().to_string())
            }
        };
        let result = self.runtime.block_on(async {
            tokio::time::timeout(timeout, async {
                let mut resp = req.send().await.map_err(transport)?;
                let status = resp.status();
                let mut bytes = Vec::new();
                while let Some(chunk) = resp.chunk().await.map_err(transport)? {
                    if bytes.len() + chunk.len() > MAX_BODY {
                        return Err(ProposeError::Protocol(format!(
                            "response larger than {MAX_BODY} bytes"
                        )));
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok::<_, ProposeError>((status, String::from_utf8_lossy(&bytes).into_owned()))
            })
            .await
        });
        result.map_err(|_| ProposeError::Timeout(secs))?
    }
}

impl Proposer for ChatCompletions {
    fn complete(&mut self, messages: &[ChatMessage]) -> Result<String, ProposeError> {
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "temperature": 0,
        });
        if self.structured {
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": {"name": "layouts", "strict": false, "schema": reply_schema(self.per_round)},
            });
        }
        let (mut status, mut text) = self.post(&body)?;
        if self.structured
            && status == reqwest::StatusCode::BAD_REQUEST
            && text.contains("response_format")
        {
            // This server does not take structured output: ask again without, and from now on.
            self.structured = false;
            if let Some(o) = body.as_object_mut() {
                o.remove("response_format");
            }
            (status, text) = self.post(&body)?;
        }
        if !status.is_success() {
            // The server's words, short and on one line (no HTML pages in a status).
            let head: String = text
                .chars()
                .take(200)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            return Err(ProposeError::Transport(format!("HTTP {status}: {head}")));
        }
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ProposeError::Protocol(format!("not JSON: {e}")))?;
        let message = v
            .pointer("/choices/0/message")
            .ok_or_else(|| ProposeError::Protocol("no choices[0].message".into()))?;
        match message.get("content") {
            Some(Value::String(s)) => Ok(s.clone()),
            // A reasoning model that spent its tokens thinking: an empty answer (counted as
            // a malformed reply, not a failed request).
            Some(Value::Null) | None if message.get("reasoning_content").is_some() => {
                Ok(String::new())
            }
            _ => Err(ProposeError::Protocol(
                "no choices[0].message.content".into(),
            )),
        }
    }
}
