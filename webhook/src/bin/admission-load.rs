//! `admission-load`: an open-loop HTTPS load generator for the admission webhook. Requests are
//! scheduled at a fixed rate and spread round-robin over keep-alive TLS connections; latency
//! is measured from each request's scheduled time to its complete answer (so a stalled server
//! cannot hide queueing), and the server's RSS and CPU time are read from /proc/PID.
//!
//!   admission-load --url https://127.0.0.1:8443/validate/pytorchjob --ca ca.crt \
//!       --manifest webhook/examples/fitting-pytorchjob.yaml --rate 500 --duration-seconds 10 \
//!       --pid PID

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use hyper::body::Bytes;
use primus_webhook::client::{Connection, client_config};
use tokio::sync::mpsc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Expect {
    Allow,
    Deny,
    Any,
}

/// Open-loop load generator for the admission webhook.
#[derive(Debug, Parser)]
#[command(name = "admission-load")]
struct Args {
    /// Endpoint, e.g. https://127.0.0.1:8443/validate/pytorchjob.
    #[arg(long)]
    url: String,
    /// CA certificate that signed the server's certificate (PEM).
    #[arg(long)]
    ca: PathBuf,
    /// Name to verify the server as (default: the URL's host).
    #[arg(long)]
    server_name: Option<String>,
    /// An AdmissionReview (JSON) to send as is.
    #[arg(long, conflicts_with = "manifest")]
    body: Option<PathBuf>,
    /// A PyTorchJob (YAML or JSON) to wrap into a CREATE AdmissionReview.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Requests per second.
    #[arg(long, default_value_t = 500.0)]
    rate: f64,
    /// Seconds of measured load.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value = "10",
        value_parser = primus_runtime::flags::positive_seconds
    )]
    duration_seconds: Duration,
    /// Seconds of unmeasured load first.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value = "1",
        value_parser = primus_runtime::flags::seconds
    )]
    warmup_seconds: Duration,
    /// Keep-alive connections.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// PID of the server: its RSS and CPU time are reported.
    #[arg(long)]
    pid: Option<u32>,
    /// Expected decision; other answers count as errors.
    #[arg(long, value_enum, default_value = "any")]
    expect: Expect,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

struct Url {
    host: String,
    addr: SocketAddr,
    path: String,
}

fn parse_url(url: &str) -> Result<Url> {
    let rest = url
        .strip_prefix("https://")
        .context("--url must start with https://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
            h.trim_start_matches('[').trim_end_matches(']').to_string(),
            p.parse::<u16>().context("port")?,
        ),
        _ => (authority.to_string(), 443),
    };
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .context("resolving the host")?
        .next()
        .context("the host has no address")?;
    Ok(Url { host, addr, path })
}

/// One answered (or failed) request.
struct Sample {
    /// From the scheduled time to the complete answer.
    latency: Duration,
    /// From sending to the complete answer.
    service: Duration,
    error: Option<String>,
    measured: bool,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `(VmRSS, VmHWM)` of a process, KiB.
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// utime + stime of a process, clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn expected(body: &[u8], expect: Expect) -> Option<String> {
    if expect == Expect::Any {
        return None;
    }
    let v: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Some(format!("answer is not JSON: {e}")),
    };
    let allowed = v
        .get("response")
        .and_then(|r| r.get("allowed"))
        .and_then(serde_json::Value::as_bool);
    match (allowed, expect) {
        (Some(true), Expect::Allow) | (Some(false), Expect::Deny) => None,
        (other, _) => Some(format!("expected {expect:?}, got allowed = {other:?}")),
    }
}

async fn worker(
    url: Arc<Url>,
    name: String,
    config: Arc<rustls::ClientConfig>,
    body: Bytes,
    expect: Expect,
    mut jobs: mpsc::Receiver<(Instant, bool)>,
    samples: mpsc::UnboundedSender<Sample>,
) {
    let mut conn: Option<Connection> = None;
    while let Some((scheduled, measured)) = jobs.recv().await {
        let sent = Instant::now();
        let result = async {
            if conn.as_ref().is_none_or(|c| !c.is_open()) {
                conn = Some(Connection::open(url.addr, &name, config.clone()).await?);
            }
            match conn.as_mut() {
                Some(c) => c.post(&url.path, body.clone()).await,
                None => unreachable!("connection was just opened"),
            }
        }
        .await;
        let done = Instant::now();
        let error = match result {
            Ok(a) if a.status == 200 => expected(&a.body, expect),
            Ok(a) => Some(format!(
                "HTTP {}: {}",
                a.status,
                String::from_utf8_lossy(&a.body)
            )),
            Err(e) => {
                conn = None;
                Some(e.to_string())
            }
        };
        let _ = samples.send(Sample {
            latency: done.saturating_duration_since(scheduled),
            service: done.saturating_duration_since(sent),
            error,
            measured,
        });
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    primus_runtime::tls::install_ring_provider();
    if !(args.rate.is_finite() && args.rate > 0.0) {
        bail!("--rate must be a positive number of requests per second");
    }
    if args.connections == 0 {
        bail!("--connections must be at least 1");
    }
    let url = Arc::new(parse_url(&args.url)?);
    let ca = std::fs::read(&args.ca).with_context(|| format!("{}", args.ca.display()))?;
    let config = client_config(&ca)?;
    let body = request_body(&args)?;
    let (senders, mut sample_rx) = open_connections(&args, url, config, body).await?;

    let cpu_before = args.pid.and_then(cpu_ticks);
    let warmup = args.warmup_seconds;
    let total = warmup + args.duration_seconds;
    let start = Instant::now();
    let rss_task = tokio::spawn(watch_rss(args.pid, start, warmup, total));
    let period = Duration::from_secs_f64(1.0 / args.rate);
    let dispatcher = std::thread::spawn(move || dispatch(senders, start, period, warmup, total));
    let dropped = tokio::task::spawn_blocking(move || dispatcher.join().unwrap_or(0))
        .await
        .unwrap_or(0);
    let measured_span = start.elapsed().saturating_sub(warmup);
    let mut t = Tally::default();
    while let Some(s) = sample_rx.recv().await {
        t.add(s);
    }
    let cpu_after = args.pid.and_then(cpu_ticks);
    let (max_rss, hwm, last_rss) = rss_task.await.unwrap_or((0, 0, 0));
    t.latencies.sort();
    t.services.sort();
    // Clock ticks per second: 100 on Linux for every architecture this runs on.
    let cpu_seconds = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) => Some((b.saturating_sub(a)) as f64 / 100.0),
        _ => None,
    };
    let run = Run {
        tally: t,
        dropped,
        measured_span,
        elapsed_total: start.elapsed().as_secs_f64(),
        cpu_seconds,
        rss: (max_rss, hwm, last_rss),
    };
    if args.json {
        println!("{}", run.json(&args));
    } else {
        run.print(&args);
    }
    if run.tally.errors + dropped > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// The AdmissionReview to send: `--body` as is, or `--manifest` wrapped into a CREATE review.
fn request_body(args: &Args) -> Result<Bytes> {
    Ok(match (&args.body, &args.manifest) {
        (Some(p), _) => std::fs::read(p)
            .with_context(|| format!("{}", p.display()))?
            .into(),
        (None, Some(p)) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("{}", p.display()))?;
            let object: serde_json::Value = serde_saphyr::from_str(&text)
                .with_context(|| format!("{} is not YAML/JSON", p.display()))?;
            let review = primus_webhook::admission::review_for(
                &object,
                "CREATE",
                None,
                false,
                "00000000-0000-0000-0000-000000000000",
            );
            serde_json::to_vec(&review)?.into()
        }
        (None, None) => bail!("give --body or --manifest"),
    })
}

type Jobs = mpsc::Sender<(Instant, bool)>;

/// Open every connection (and check it answers) before the clock starts; one worker each.
async fn open_connections(
    args: &Args,
    url: Arc<Url>,
    config: Arc<rustls::ClientConfig>,
    body: Bytes,
) -> Result<(Vec<Jobs>, mpsc::UnboundedReceiver<Sample>)> {
    let name = args.server_name.clone().unwrap_or_else(|| url.host.clone());
    let (sample_tx, sample_rx) = mpsc::unbounded_channel();
    let mut senders = Vec::new();
    for _ in 0..args.connections {
        let mut probe = Connection::open(url.addr, &name, config.clone())
            .await
            .with_context(|| format!("connecting to {}", args.url))?;
        let a = probe.post(&url.path, body.clone()).await?;
        if a.status != 200 {
            bail!(
                "the server answers HTTP {}: {}",
                a.status,
                String::from_utf8_lossy(&a.body)
            );
        }
        let (tx, rx) = mpsc::channel(4096);
        senders.push(tx);
        tokio::spawn(worker(
            url.clone(),
            name.clone(),
            config.clone(),
            body.clone(),
            args.expect,
            rx,
            sample_tx.clone(),
        ));
    }
    Ok((senders, sample_rx))
}

/// (max RSS under load, high-water mark, last RSS) of the server, KiB, sampled every 100 ms.
async fn watch_rss(
    pid: Option<u32>,
    start: Instant,
    warmup: Duration,
    total: Duration,
) -> (u64, u64, u64) {
    let Some(pid) = pid else {
        return (0, 0, 0);
    };
    let (mut max_rss, mut hwm, mut last) = (0u64, 0u64, 0u64);
    while start.elapsed() < total {
        if let Some((rss, h)) = rss_kib(pid) {
            if start.elapsed() >= warmup {
                max_rss = max_rss.max(rss);
            }
            hwm = h;
            last = rss;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (max_rss, hwm, last)
}

/// The schedule, on its own OS thread with std's sleep (tens of microseconds late at worst),
/// not on the runtime's millisecond timer wheel, so "latency from schedule" measures the
/// server and the network, not the generator's timer. Returns the requests dropped because a
/// worker's queue was full.
fn dispatch(
    senders: Vec<Jobs>,
    start: Instant,
    period: Duration,
    warmup: Duration,
    total: Duration,
) -> u64 {
    let measure_start = start + warmup;
    let mut sent: u64 = 0;
    let mut dropped: u64 = 0;
    loop {
        let scheduled = start + period.mul_f64(sent as f64);
        if scheduled.duration_since(start) >= total {
            break;
        }
        let now = Instant::now();
        if scheduled > now {
            std::thread::sleep(scheduled - now);
        }
        let measured = scheduled >= measure_start;
        let i = (sent % senders.len() as u64) as usize;
        if senders[i].try_send((scheduled, measured)).is_err() {
            dropped += 1;
        }
        sent += 1;
    }
    dropped
}

/// The measured samples.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    services: Vec<Duration>,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn add(&mut self, s: Sample) {
        if !s.measured {
            return;
        }
        if let Some(e) = s.error {
            self.errors += 1;
            self.first_error.get_or_insert(e);
        } else {
            self.latencies.push(s.latency);
            self.services.push(s.service);
        }
    }
}

/// A finished run.
struct Run {
    tally: Tally,
    dropped: u64,
    measured_span: Duration,
    elapsed_total: f64,
    cpu_seconds: Option<f64>,
    rss: (u64, u64, u64),
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Run {
    fn requests(&self) -> u64 {
        self.tally.latencies.len() as u64 + self.tally.errors
    }

    fn achieved(&self) -> f64 {
        self.requests() as f64 / self.measured_span.as_secs_f64().max(1e-9)
    }

    fn json(&self, args: &Args) -> serde_json::Value {
        let (l, s) = (&self.tally.latencies, &self.tally.services);
        let (max_rss, hwm, last_rss) = self.rss;
        serde_json::json!({
            "url": args.url,
            "rateTarget": args.rate,
            "rateAchieved": self.achieved(),
            "connections": args.connections,
            "requests": self.requests(),
            "errors": self.tally.errors + self.dropped,
            "firstError": self.tally.first_error,
            "latencyMs": {
                "p50": ms(percentile(l, 50.0)),
                "p90": ms(percentile(l, 90.0)),
                "p99": ms(percentile(l, 99.0)),
                "p999": ms(percentile(l, 99.9)),
                "max": ms(l.last().copied().unwrap_or_default()),
            },
            "serviceMs": {
                "p50": ms(percentile(s, 50.0)),
                "p99": ms(percentile(s, 99.0)),
                "max": ms(s.last().copied().unwrap_or_default()),
            },
            "serverRssKiB": args.pid.map(|_| serde_json::json!({"maxUnderLoad": max_rss, "highWaterMark": hwm, "end": last_rss})),
            "serverCpuPercent": self.cpu_seconds.map(|c| 100.0 * c / self.elapsed_total),
        })
    }

    fn print(&self, args: &Args) {
        let (l, s) = (&self.tally.latencies, &self.tally.services);
        println!(
            "{} requests in {:.1} s at {:.0}/s (target {:.0}/s) over {} keep-alive TLS connections",
            self.requests(),
            self.measured_span.as_secs_f64(),
            self.achieved(),
            args.rate,
            args.connections
        );
        println!(
            "latency from schedule: p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms",
            ms(percentile(l, 50.0)),
            ms(percentile(l, 90.0)),
            ms(percentile(l, 99.0)),
            ms(percentile(l, 99.9)),
            ms(l.last().copied().unwrap_or_default())
        );
        println!(
            "service time:          p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
            ms(percentile(s, 50.0)),
            ms(percentile(s, 99.0)),
            ms(s.last().copied().unwrap_or_default())
        );
        println!("errors: {}", self.tally.errors + self.dropped);
        if let Some(e) = &self.tally.first_error {
            println!("first error: {e}");
        }
        let Some(pid) = args.pid else { return };
        let (max_rss, hwm, last_rss) = self.rss;
        println!(
            "server pid {pid}: RSS max under load {:.1} MiB, high-water mark {:.1} MiB, at end {:.1} MiB",
            max_rss as f64 / 1024.0,
            hwm as f64 / 1024.0,
            last_rss as f64 / 1024.0
        );
        if let Some(c) = self.cpu_seconds {
            println!(
                "server CPU: {:.1} s ({:.0}% of one core)",
                c,
                100.0 * c / self.elapsed_total
            );
        }
    }
}
