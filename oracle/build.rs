//! Embeds every `profiles/models/*.yaml` and `profiles/hardware/*.yaml` file of the repository
//! into the library, so the `primus` CLI works on a laptop with no data directory.

use std::fmt::Write as _;
use std::path::Path;

fn list(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) == Some("yaml")
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
            {
                out.push((
                    stem.to_string(),
                    path.canonicalize()
                        .unwrap_or(path.clone())
                        .display()
                        .to_string(),
                ));
            }
        }
    }
    out.sort();
    out
}

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest).join("..").join("profiles");
    let mut code = String::new();
    for (kind, konst) in [("models", "MODELS"), ("hardware", "HARDWARE")] {
        let dir = root.join(kind);
        println!("cargo:rerun-if-changed={}", dir.display());
        writeln!(code, "/// Embedded `profiles/{kind}/*.yaml`: (name, text).").unwrap();
        writeln!(code, "pub static {konst}: &[(&str, &str)] = &[").unwrap();
        for (name, path) in list(&dir) {
            println!("cargo:rerun-if-changed={path}");
            writeln!(code, "    ({name:?}, include_str!({path:?})),").unwrap();
        }
        writeln!(code, "];").unwrap();
    }
    let out = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("embedded_profiles.rs");
    std::fs::write(out, code).expect("write embedded_profiles.rs");
}
