//! `crdgen [DIR]`: write the CRD manifests into DIR (default: the `crds/` directory of the
//! repository and the Helm chart's `crds/` copy), or print them with `-` as DIR.
//! `crdgen --check [DIR]` exits 1 when the files there differ from a fresh rendering.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (check, dir) = match args.as_slice() {
        [] => (false, None),
        [flag, dir] if flag == "--check" => (true, Some(dir.clone())),
        [flag] if flag == "--check" => (true, None),
        [dir] if !dir.starts_with('-') || dir == "-" => (false, Some(dir.clone())),
        _ => {
            eprintln!("usage: crdgen [--check] [DIR | -]");
            return ExitCode::from(2);
        }
    };
    let rendered = match primus_crds::crdgen::render() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("crdgen: {e}");
            return ExitCode::from(1);
        }
    };
    if dir.as_deref() == Some("-") {
        for (_, text) in &rendered {
            println!("---\n{text}");
        }
        return ExitCode::SUCCESS;
    }
    let dirs = match dir {
        Some(d) => vec![PathBuf::from(d)],
        None => {
            let crds = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let chart = crds.join("../charts/primus-projection/crds");
            let mut dirs = vec![crds];
            if chart.is_dir() {
                dirs.push(chart);
            }
            dirs
        }
    };
    let mut stale = 0;
    for (dir, (name, text)) in dirs
        .iter()
        .flat_map(|d| rendered.iter().map(move |r| (d, r)))
    {
        let path = dir.join(name);
        if check {
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            if current != *text {
                eprintln!("crdgen: {} is out of date", path.display());
                stale += 1;
            }
        } else if let Err(e) = std::fs::write(&path, text) {
            eprintln!("crdgen: {}: {e}", path.display());
            return ExitCode::from(1);
        } else {
            eprintln!("crdgen: wrote {}", path.display());
        }
    }
    if stale > 0 {
        eprintln!("crdgen: run `cargo run -p primus-crds --bin crdgen` and commit the result");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
