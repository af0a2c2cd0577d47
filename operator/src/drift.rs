//! Drift: measured throughput against the projection. The measurement comes from the plan's
//! `status.measured` (written by `primus report`, field manager `primus-report`) or from an
//! instant query against the Prometheus HTTP API (`spec.drift.prometheus`). drift = measured /
//! projected - 1; within tolerance when |drift| <= `spec.drift.tolerance` (default 0.10).

use primus_crds::{DriftSpec, DriftStatus, MeasuredThroughput, PrometheusSource};
use primus_oracle::bounds::limits;

/// A measured throughput and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub tokens_per_second_per_gpu: f64,
    pub source: String,
}

/// Whether a measured throughput (tokens/s/GPU) is one a run can have: finite, not negative
/// (a stalled job's 0 is a drift of -100%), at most [`limits::TOKENS_PER_SECOND_PER_GPU`].
/// Anyone with the status verb can write `status.measured`.
pub fn plausible(measured: f64) -> bool {
    measured.is_finite() && (0.0..=limits::TOKENS_PER_SECOND_PER_GPU).contains(&measured)
}

/// Drift of a measurement against a projection (`None` when the projection is not positive,
/// or the measurement is not [`plausible`]).
pub fn drift(projected: f64, measured: f64, tolerance: f64) -> Option<DriftStatus> {
    if !(projected.is_finite() && projected > 0.0 && plausible(measured)) {
        return None;
    }
    let ratio = measured / projected - 1.0;
    Some(DriftStatus {
        ratio,
        tolerance,
        within_tolerance: ratio.abs() <= tolerance,
    })
}

/// Largest Prometheus answer read, bytes (an instant query of one series is a few hundred).
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// Why a Prometheus query gave no number. Every message is in the operator's own words: nothing
/// the remote server sent is copied into a plan's status.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(
        "{url}: {host} is not in the operator's allow-list of drift URLs (--drift-url-allow); ask its administrators to add it"
    )]
    NotAllowed { url: String, host: String },
    #[error("{url}: {what}")]
    Refused { url: String, what: &'static str },
    #[error("request to {url} failed: {what}")]
    Http { url: String, what: &'static str },
    #[error(
        "{url} answered with a redirect (HTTP {status}); redirects are not followed: give the final URL"
    )]
    Redirect { url: String, status: u16 },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: the answer is larger than {limit} bytes; the query must return one sample")]
    TooLarge { url: String, limit: usize },
    #[error("unexpected answer from {url}: {what}")]
    Format { url: String, what: String },
}

impl QueryError {
    /// Whether the URL was refused by the allow-list (the plan cannot fix it alone).
    pub fn not_allowed(&self) -> bool {
        matches!(self, QueryError::NotAllowed { .. })
    }
}

/// One entry of the operator's drift URL allow-list: `scheme://host[:port]`, the host exact or
/// `*.` and a domain suffix (`https://*.monitoring.svc`). Without a port, only the scheme's
/// default port matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlRule {
    scheme: String,
    /// Lower-case host, or `.suffix` for a wildcard.
    host: String,
    wildcard: bool,
    port: Option<u16>,
}

impl std::str::FromStr for UrlRule {
    type Err = String;

    fn from_str(s: &str) -> Result<UrlRule, String> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| format!("{s:?}: expected scheme://host[:port]"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(format!("{s:?}: the scheme must be http or https"));
        }
        let rest = rest.trim_end_matches('/');
        if rest.contains(['/', '@', '?', '#']) || rest.is_empty() {
            return Err(format!(
                "{s:?}: expected scheme://host[:port], without path, user or query"
            ));
        }
        let (host, port) = match rest.strip_prefix('[') {
            // An IPv6 literal: [addr] or [addr]:port.
            Some(r) => {
                let (h, after) = r
                    .split_once(']')
                    .ok_or_else(|| format!("{s:?}: unclosed ["))?;
                (format!("[{h}]"), after.strip_prefix(':'))
            }
            None => match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (rest.to_string(), None),
            },
        };
        let port = port
            .map(|p| {
                p.parse::<u16>()
                    .map_err(|_| format!("{s:?}: {p:?} is not a port"))
            })
            .transpose()?;
        let host = host.to_ascii_lowercase();
        let (wildcard, host) = match host.strip_prefix("*.") {
            Some(suffix) if !suffix.is_empty() && !suffix.contains('*') => {
                (true, format!(".{suffix}"))
            }
            _ if host.contains('*') => {
                return Err(format!(
                    "{s:?}: a wildcard must be the first label (*.domain)"
                ));
            }
            _ => (false, host),
        };
        Ok(UrlRule {
            scheme,
            host,
            wildcard,
            port,
        })
    }
}

impl UrlRule {
    fn allows(&self, url: &reqwest::Url) -> bool {
        let Some(host) = url.host_str().map(str::to_ascii_lowercase) else {
            return false;
        };
        let host_ok = if self.wildcard {
            host.ends_with(&self.host) && host.len() > self.host.len()
        } else {
            host == self.host
        };
        let port_ok = match self.port {
            Some(p) => url.port_or_known_default() == Some(p),
            None => url.port().is_none(),
        };
        url.scheme() == self.scheme && host_ok && port_ok
    }
}

/// Check `url` against the allow-list (empty: nothing is allowed).
pub fn allowed(rules: &[UrlRule], url: &reqwest::Url, text: &str) -> Result<(), QueryError> {
    if !url.username().is_empty() || url.password().is_some() {
        return Err(QueryError::Refused {
            url: text.to_string(),
            what: "credentials in the URL are not accepted",
        });
    }
    if rules.iter().any(|r| r.allows(url)) {
        return Ok(());
    }
    let host = match url.port() {
        Some(p) => format!(
            "{}://{}:{p}",
            url.scheme(),
            url.host_str().unwrap_or_default()
        ),
        None => format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default()),
    };
    Err(QueryError::NotAllowed {
        url: text.to_string(),
        host,
    })
}

/// The HTTP client of drift queries: no redirects, bounded connect and total time.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(QUERY_TIMEOUT)
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// How long one query may take in all.
pub const QUERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn http_error(url: &str, e: &reqwest::Error) -> QueryError {
    let what = if e.is_timeout() {
        "no answer in time"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the answer could not be read"
    } else {
        "the request failed"
    };
    QueryError::Http {
        url: url.to_string(),
        what,
    }
}

/// Read at most `limit` bytes of the answer (refusing a longer one by its announced length,
/// then while reading, so a body without a length is bounded too).
async fn read_capped(
    url: &str,
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, QueryError> {
    let too_large = || QueryError::TooLarge {
        url: url.to_string(),
        limit,
    };
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| http_error(url, &e))? {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The sample value of a Prometheus instant-query answer: a scalar, or a vector of exactly one
/// sample. `Ok(None)` for an empty vector (no data yet).
pub fn parse_answer(url: &str, body: &serde_json::Value) -> Result<Option<f64>, QueryError> {
    let fail = |what: &str| QueryError::Format {
        url: url.to_string(),
        what: what.to_string(),
    };
    if body["status"] != "success" {
        // Its error text is not copied: it is the remote server's, not ours.
        return Err(fail(
            "Prometheus reported an error (see its own logs or run the query there)",
        ));
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

/// The measured throughput: the plan's Prometheus query when it has one (and the allow-list
/// `rules` lets its URL through), else what `primus report` recorded in the status.
pub async fn measure(
    http: &reqwest::Client,
    rules: &[UrlRule],
    spec: &DriftSpec,
    recorded: Option<&MeasuredThroughput>,
) -> Result<Option<Measurement>, QueryError> {
    let Some(p) = &spec.prometheus else {
        return Ok(recorded.map(|m| Measurement {
            tokens_per_second_per_gpu: m.tokens_per_second_per_gpu,
            source: m.source.clone().unwrap_or_else(|| "status.measured".into()),
        }));
    };
    Ok(query(http, rules, p).await?.map(|v| Measurement {
        tokens_per_second_per_gpu: v,
        source: format!("Prometheus query at {}", p.url),
    }))
}

/// Run an instant query: `GET {url}/api/v1/query?query=...`, when the allow-list lets the URL
/// through; no redirect followed, at most [`MAX_ANSWER_BYTES`] read.
pub async fn query(
    http: &reqwest::Client,
    rules: &[UrlRule],
    source: &PrometheusSource,
) -> Result<Option<f64>, QueryError> {
    let url = format!("{}/api/v1/query", source.url.trim_end_matches('/'));
    let full = reqwest::Url::parse_with_params(&url, [("query", source.query.as_str())]).map_err(
        |_| QueryError::Refused {
            url: source.url.clone(),
            what: "not a URL",
        },
    )?;
    allowed(rules, &full, &source.url)?;
    let resp = http
        .get(full)
        .send()
        .await
        .map_err(|e| http_error(&url, &e))?;
    let status = resp.status();
    if status.is_redirection() {
        return Err(QueryError::Redirect {
            url,
            status: status.as_u16(),
        });
    }
    if !status.is_success() {
        return Err(QueryError::Status {
            url,
            status: status.as_u16(),
        });
    }
    let body = read_capped(&url, resp, MAX_ANSWER_BYTES).await?;
    let body: serde_json::Value =
        serde_json::from_slice(&body).map_err(|_| QueryError::Format {
            url: url.clone(),
            what: "not JSON".into(),
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
        // A stalled job is a drift of -100%; no run measures a negative, infinite or
        // beyond-any-run throughput (a status written by anyone with the status verb).
        assert_eq!(drift(1000.0, 0.0, 0.1).map(|d| d.ratio), Some(-1.0));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e308, 1.01e8] {
            assert!(drift(1000.0, bad, 0.1).is_none(), "{bad}");
        }
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
        let e = parse_answer("u", &err).unwrap_err().to_string();
        assert!(e.contains("Prometheus reported an error"), "{e}");
        assert!(!e.contains("char 3"), "{e}");
    }

    fn rules(list: &[&str]) -> Vec<UrlRule> {
        list.iter().map(|r| r.parse().unwrap()).collect()
    }

    #[test]
    fn the_allow_list_matches_scheme_host_and_port() {
        let r = rules(&[
            "http://prometheus.monitoring.svc:9090",
            "https://*.example.org",
            "http://[::1]:9090",
        ]);
        let ok = |u: &str| allowed(&r, &reqwest::Url::parse(u).unwrap(), u).is_ok();
        assert!(ok("http://prometheus.monitoring.svc:9090/api/v1/query"));
        assert!(ok("http://PROMETHEUS.monitoring.svc:9090"));
        assert!(!ok("https://prometheus.monitoring.svc:9090"), "scheme");
        assert!(!ok("http://prometheus.monitoring.svc:9091"), "port");
        assert!(!ok("http://prometheus.monitoring.svc"), "default port");
        assert!(ok("https://thanos.example.org/x"));
        assert!(ok("https://a.b.example.org:443"), "the default port");
        assert!(!ok("https://example.org"), "the wildcard needs a label");
        assert!(!ok("https://evil-example.org"));
        assert!(!ok("https://thanos.example.org:8443"));
        assert!(ok("http://[::1]:9090"));
        assert!(!ok("http://169.254.169.254/latest/meta-data"));
        let creds = "http://u:p@prometheus.monitoring.svc:9090";
        let e = allowed(&r, &reqwest::Url::parse(creds).unwrap(), creds).unwrap_err();
        assert!(e.to_string().contains("credentials"), "{e}");
        // Nothing is allowed by default.
        let e = allowed(
            &[],
            &reqwest::Url::parse("http://p:9090").unwrap(),
            "http://p:9090",
        )
        .unwrap_err();
        assert!(e.not_allowed());
        assert!(
            e.to_string()
                .contains("http://p:9090 is not in the operator's allow-list"),
            "{e}"
        );
        for bad in [
            "prom:9090",
            "ftp://x",
            "http://x/path",
            "http://a.*.b",
            "http://x:99999",
            "http://u@x",
        ] {
            assert!(bad.parse::<UrlRule>().is_err(), "{bad}");
        }
    }

    /// A local HTTP server for the query tests: `/api/v1/query` answers with `body`, `/moved`
    /// redirects there.
    async fn server(body: serde_json::Value) -> std::net::SocketAddr {
        use warp::Filter;
        crate::install_crypto_provider();
        let answer = warp::path!("api" / "v1" / "query").map(move || warp::reply::json(&body));
        let moved = warp::path!("moved" / "api" / "v1" / "query")
            .map(|| warp::redirect::found(warp::http::Uri::from_static("/api/v1/query")));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(warp::serve(answer.or(moved)).incoming(listener).run());
        addr
    }

    /// A raw HTTP server that answers every request with 200 and `megabytes` MiB of spaces,
    /// announcing the length or not; how many bytes it got to send.
    async fn huge(
        megabytes: usize,
        announce: bool,
    ) -> (
        std::net::SocketAddr,
        std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = sent.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let total = megabytes << 20;
                    let head = if announce {
                        format!("HTTP/1.1 200 OK\r\ncontent-length: {total}\r\n\r\n")
                    } else {
                        "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_string()
                    };
                    if s.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = vec![b' '; 64 << 10];
                    for _ in 0..total / chunk.len() {
                        if s.write_all(&chunk).await.is_err() {
                            return;
                        }
                        count.fetch_add(chunk.len(), std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
        });
        (addr, sent)
    }

    fn source(url: String) -> PrometheusSource {
        PrometheusSource {
            url,
            query: "x".into(),
        }
    }

    #[tokio::test]
    async fn redirects_are_not_followed_and_huge_answers_are_cut_off() {
        let ok =
            json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "7"]}});
        let addr = server(ok).await;
        let r = rules(&[&format!("http://127.0.0.1:{}", addr.port())]);
        let http = client();
        let base = format!("http://{addr}");
        assert_eq!(
            query(&http, &r, &source(base.clone())).await.unwrap(),
            Some(7.0)
        );
        let e = query(&http, &r, &source(format!("{base}/moved")))
            .await
            .unwrap_err();
        assert!(matches!(e, QueryError::Redirect { status: 302, .. }), "{e}");
        // 1 GiB without a length: reading stops at the cap, long before the end.
        for announce in [false, true] {
            let (big, sent) = huge(1024, announce).await;
            let r = rules(&[&format!("http://127.0.0.1:{}", big.port())]);
            let e = query(&http, &r, &source(format!("http://{big}")))
                .await
                .unwrap_err();
            assert!(matches!(e, QueryError::TooLarge { .. }), "{e}");
            let n = sent.load(std::sync::atomic::Ordering::SeqCst);
            assert!(n < 64 << 20, "the server got to send {n} bytes");
        }
        // Another port of the same host is not on the list: nothing is sent.
        let e = query(&http, &r, &source("http://127.0.0.1:1".into()))
            .await
            .unwrap_err();
        assert!(e.not_allowed(), "{e}");
    }

    #[tokio::test]
    async fn no_remote_text_reaches_the_message() {
        let secret = "internal-admin-token-123";
        let addr = server(json!({"status": "error", "error": secret})).await;
        let r = rules(&[&format!("http://127.0.0.1:{}", addr.port())]);
        let e = query(&client(), &r, &source(format!("http://{addr}")))
            .await
            .unwrap_err();
        assert!(!e.to_string().contains(secret), "{e}");
        assert!(
            e.to_string().contains("Prometheus reported an error"),
            "{e}"
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
        let http = client();
        let src = PrometheusSource {
            url: format!("http://{addr}/"),
            query: "tokens_per_gpu".into(),
        };
        let r = rules(&[
            &format!("http://127.0.0.1:{}", addr.port()),
            "http://127.0.0.1:1",
        ]);
        assert_eq!(query(&http, &r, &src).await.unwrap(), Some(2500.0));
        let bad = PrometheusSource {
            url: "http://127.0.0.1:1".into(),
            query: "x".into(),
        };
        assert!(matches!(
            query(&http, &r, &bad).await,
            Err(QueryError::Http { .. })
        ));
    }
}
