//! The tuning agent's transport: [`ChatCompletions`] implements the oracle's
//! [`Proposer`] over an OpenAI-compatible chat-completions endpoint (`POST
//! {endpoint}/chat/completions`, reqwest on a one-thread tokio runtime). The prompts, the reply
//! parsing and the search loop are the oracle's ([`primus_oracle::tune::agent`]); this is the
//! only part that touches the network, so it lives at the edge (the CLI here, the operator
//! later).

use std::time::Duration;

use serde_json::{Value, json};

use primus_oracle::tune::agent::{ChatMessage, ProposeError, Proposer};

/// An OpenAI-compatible chat-completions endpoint (`POST {endpoint}/chat/completions`),
/// e.g. vLLM, SGLang, llama.cpp's server, or a hosted API.
pub struct ChatCompletions {
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    url: String,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
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
        primus_runtime::tls::install_ring_provider();
        let client = reqwest::Client::builder()
            .timeout(timeout)
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
        })
    }
}

impl Proposer for ChatCompletions {
    fn complete(&mut self, messages: &[ChatMessage]) -> Result<String, ProposeError> {
        let body = json!({
            "model": self.model,
            "messages": messages,
            "temperature": 0,
        });
        let secs = self.timeout.as_secs();
        let mut req = self.client.post(&self.url).json(&body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let transport = |e: reqwest::Error| {
            if e.is_timeout() {
                ProposeError::Timeout(secs)
            } else {
                ProposeError::Transport(e.to_string())
            }
        };
        let timeout = self.timeout;
        let result = self.runtime.block_on(async {
            tokio::time::timeout(timeout, async {
                let resp = req.send().await.map_err(transport)?;
                let status = resp.status();
                let text = resp.text().await.map_err(transport)?;
                Ok::<_, ProposeError>((status, text))
            })
            .await
        });
        let (status, text) = result.map_err(|_| ProposeError::Timeout(secs))??;
        if !status.is_success() {
            let head: String = text.chars().take(200).collect();
            return Err(ProposeError::Transport(format!("HTTP {status}: {head}")));
        }
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ProposeError::Protocol(format!("not JSON: {e}")))?;
        v.pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| ProposeError::Protocol("no choices[0].message.content".into()))
    }
}
