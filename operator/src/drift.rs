//! Drift: measured throughput against the projection. The measurement comes from the plan's
//! `status.measured` (written by `primus report`, field manager `primus-report`) or from an
//! instant query against the Prometheus HTTP API (`spec.drift.prometheus`). drift = measured /
//! projected - 1; within tolerance when |drift| <= `spec.drift.tolerance` (default 0.10).

use primus_crds::{DriftSpec, DriftStatus, MeasuredThroughput, PrometheusSource};

/// A measured throughput and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub tokens_per_second_per_gpu: f64,
    pub source: String,
}

/// Drift of a measurement against a projection (`None` when the projection is not positive).
pub fn drift(projected: f64, measured: f64, tolerance: f64) -> Option<DriftStatus> {
    if !(projected.is_finite() && projected > 0.0 && measured.is_finite()) {
        return None;
    }
    let ratio = measured / projected - 1.0;
    Some(DriftStatus {
        ratio,
        tolerance,
        within_tolerance: ratio.abs() <= tolerance,
    })
}

/// Why a Prometheus query gave no number.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("request to {url} failed: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("unexpected answer from {url}: {what}")]
    Format { url: String, what: String },
}

/// The sample value of a Prometheus instant-query answer: a scalar, or a vector of exactly one
/// sample. `Ok(None)` for an empty vector (no data yet).
pub fn parse_answer(url: &str, body: &serde_json::Value) -> Result<Option<f64>, QueryError> {
    let fail = |what: &str| QueryError::Format {
        url: url.to_string(),
        what: what.to_string(),
    };
    if body["status"] != "success" {
        let e = body["error"].as_str().unwrap_or("status is not success");
        return Err(fail(e));
    }
    let data = &body["data"];
    let sample = match data["resultType"].as_str() {
        Some("scalar") => &data["result"],
        Some("vector") => {
            let result = data["result"]
                .as_array()
                .ok_or_else(|| fail("vector result is not a list"))?;
            match result.as_slice() {
                [] => return Ok(None),
                [one] => &one["value"],
                many => {
                    return Err(fail(&format!(
                        "the query returned {} series; it must return one (aggregate it, e.g. avg(...))",
                        many.len()
                    )));
                }
            }
        }
        other => {
            return Err(fail(&format!(
                "result type {other:?} (need scalar or vector)"
            )));
        }
    };
    let v = sample[1]
        .as_str()
        .ok_or_else(|| fail("sample has no value"))?
        .parse::<f64>()
        .map_err(|_| fail("sample value is not a number"))?;
    Ok(v.is_finite().then_some(v))
}

/// The measured throughput: the plan's Prometheus query when it has one, else what `primus
/// report` recorded in the status (`recorded`).
pub async fn measure(
    http: &reqwest::Client,
    spec: &DriftSpec,
    recorded: Option<&MeasuredThroughput>,
) -> Result<Option<Measurement>, QueryError> {
    let Some(p) = &spec.prometheus else {
        return Ok(recorded.map(|m| Measurement {
            tokens_per_second_per_gpu: m.tokens_per_second_per_gpu,
            source: m.source.clone().unwrap_or_else(|| "status.measured".into()),
        }));
    };
    Ok(query(http, p).await?.map(|v| Measurement {
        tokens_per_second_per_gpu: v,
        source: format!("Prometheus query at {}", p.url),
    }))
}

/// Run an instant query: `GET {url}/api/v1/query?query=...`.
pub async fn query(
    http: &reqwest::Client,
    source: &PrometheusSource,
) -> Result<Option<f64>, QueryError> {
    let url = format!("{}/api/v1/query", source.url.trim_end_matches('/'));
    let full =
        reqwest::Url::parse_with_params(&url, [("query", source.query.as_str())]).map_err(|e| {
            QueryError::Format {
                url: url.clone(),
                what: format!("not a URL: {e}"),
            }
        })?;
    let resp = http.get(full).send().await.map_err(|e| QueryError::Http {
        url: url.clone(),
        source: e,
    })?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        return Err(QueryError::Status {
            url,
            status: status.as_u16(),
            body: body.chars().take(200).collect(),
        });
    }
    let body: serde_json::Value = resp.json().await.map_err(|e| QueryError::Http {
        url: url.clone(),
        source: e,
    })?;
    parse_answer(&url, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drift_is_measured_over_projected_minus_one() {
        let d = drift(1000.0, 930.0, 0.1).unwrap();
        assert!((d.ratio + 0.07).abs() < 1e-12);
        assert!(d.within_tolerance);
        let d = drift(1000.0, 1200.0, 0.1).unwrap();
        assert!(!d.within_tolerance);
        assert!(drift(0.0, 10.0, 0.1).is_none());
    }

    #[test]
    fn prometheus_answers_are_read() {
        let v = json!({"status": "success", "data": {"resultType": "vector",
            "result": [{"metric": {"job": "x"}, "value": [1700000000.0, "3456.5"]}]}});
        assert_eq!(parse_answer("u", &v).unwrap(), Some(3456.5));
        let s =
            json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "12"]}});
        assert_eq!(parse_answer("u", &s).unwrap(), Some(12.0));
        let empty = json!({"status": "success", "data": {"resultType": "vector", "result": []}});
        assert_eq!(parse_answer("u", &empty).unwrap(), None);
        let two = json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"value": [1.0, "1"]}, {"value": [1.0, "2"]}]}});
        assert!(
            parse_answer("u", &two)
                .unwrap_err()
                .to_string()
                .contains("2 series")
        );
        let err = json!({"status": "error", "error": "parse error at char 3"});
        assert!(
            parse_answer("u", &err)
                .unwrap_err()
                .to_string()
                .contains("parse error")
        );
    }

    /// A real HTTP round trip against a local server speaking the Prometheus query API.
    #[tokio::test]
    async fn the_query_goes_over_http() {
        use warp::Filter;
        crate::install_crypto_provider();
        let route = warp::path!("api" / "v1" / "query")
            .and(warp::query::<std::collections::HashMap<String, String>>())
            .map(|q: std::collections::HashMap<String, String>| {
                let v = if q.get("query").map(String::as_str) == Some("tokens_per_gpu") {
                    "2500"
                } else {
                    "0"
                };
                warp::reply::json(
                    &json!({"status": "success", "data": {"resultType": "vector",
                    "result": [{"metric": {}, "value": [1.0, v]}]}}),
                )
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(warp::serve(route).incoming(listener).run());
        let http = reqwest::Client::new();
        let src = PrometheusSource {
            url: format!("http://{addr}/"),
            query: "tokens_per_gpu".into(),
        };
        assert_eq!(query(&http, &src).await.unwrap(), Some(2500.0));
        let bad = PrometheusSource {
            url: "http://127.0.0.1:1".into(),
            query: "x".into(),
        };
        assert!(matches!(
            query(&http, &bad).await,
            Err(QueryError::Http { .. })
        ));
    }
}
