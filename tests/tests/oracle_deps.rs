//! The oracle stays a pure library (DESIGN.md section 2): no Kubernetes client, no async runtime,
//! no network, no TLS, no command-line parser, no GPU FFI, and no unsafe code. These checks
//! fail when `oracle/Cargo.toml` grows such a dependency, directly or through another crate,
//! or when the `forbid(unsafe_code)` attribute goes.

use std::process::Command;

use primus_tests::repo_root;

/// Crates that belong to the edges (cli, bench, operator, webhook), never to the oracle.
const FORBIDDEN: &[&str] = &[
    "kube",
    "kube-client",
    "k8s-openapi",
    "tokio",
    "reqwest",
    "hyper",
    "warp",
    "rustls",
    "clap",
    "hip-sys",
    "cudarc",
    "libloading",
    "tracing-subscriber",
];

/// The dependency names of one `[...dependencies]` table of a Cargo.toml.
fn table_names(manifest: &str, table: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == format!("[{table}]");
            continue;
        }
        if inside
            && !line.is_empty()
            && !line.starts_with('#')
            && let Some((key, _)) = line.split_once('=')
        {
            // `serde.workspace = true` and `serde = { ... }` both name `serde`.
            let key = key.trim();
            names.push(key.split('.').next().unwrap_or(key).trim().to_string());
        }
    }
    names
}

#[test]
fn the_oracle_manifest_names_no_edge_dependency() {
    let manifest = std::fs::read_to_string(repo_root().join("oracle/Cargo.toml"))
        .expect("read oracle/Cargo.toml");
    let direct = table_names(&manifest, "dependencies");
    assert!(
        direct.iter().any(|d| d == "serde"),
        "the manifest parser found no dependencies: {direct:?}"
    );
    let bad: Vec<&String> = direct
        .iter()
        .filter(|d| FORBIDDEN.contains(&d.as_str()))
        .collect();
    assert!(
        bad.is_empty(),
        "oracle/Cargo.toml depends on {bad:?}: put that code in cli/, bench/, operator/ or webhook/"
    );
}

#[test]
fn the_oracle_builds_without_edge_crates_even_transitively() {
    // `cargo tree -p primus-oracle` resolves the oracle's features as `cargo build -p
    // primus-oracle` does, so optional dependencies other members switch on do not count.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo_root())
        .args([
            "tree",
            "-p",
            "primus-oracle",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
            "--offline",
            "--locked",
        ])
        .output()
        .expect("run cargo tree");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        names.contains(&"primus-oracle") && names.contains(&"serde"),
        "unexpected cargo tree output: {text}"
    );
    let bad: Vec<&&str> = names.iter().filter(|n| FORBIDDEN.contains(n)).collect();
    assert!(
        bad.is_empty(),
        "primus-oracle pulls in {bad:?} (`cargo tree -p primus-oracle -e normal -i NAME` shows how)"
    );
}

#[test]
fn the_oracle_forbids_unsafe_code() {
    let lib = std::fs::read_to_string(repo_root().join("oracle/src/lib.rs"))
        .expect("read oracle/src/lib.rs");
    assert!(
        lib.lines().any(|l| l.trim() == "#![forbid(unsafe_code)]"),
        "oracle/src/lib.rs lost #![forbid(unsafe_code)]"
    );
}
