//! `crddoc`: renders docs/trainingplan-reference.md from the TrainingPlan CRD's OpenAPI schema
//! (the same rendering as `crdgen`, so the reference cannot drift from the API).
//!
//! ```text
//! cargo run -p primus-crds --bin crddoc            # print the markdown
//! cargo run -p primus-crds --bin crddoc -- --write # rewrite docs/trainingplan-reference.md
//! ```
//!
//! `crds/tests/reference_doc.rs` fails when the checked-in page differs from this output.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::Value;

const CRD_FILE: &str = "trainingplans.primus.dev.yaml";

/// Where `--write` puts the page.
fn doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/trainingplan-reference.md")
}

/// One line of prose: whitespace runs collapsed, table pipes escaped.
fn one_line(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn scalar_type(schema: &Value) -> String {
    let t = schema["type"].as_str().unwrap_or("");
    let mut out = match (t, schema["format"].as_str()) {
        ("", _) if schema.get("x-kubernetes-int-or-string").is_some() => "integer or string".into(),
        ("", _) => "any".to_string(),
        (t, Some(f)) => format!("{t} ({f})"),
        (t, None) => t.to_string(),
    };
    if let Some(values) = schema["enum"].as_array() {
        let list: Vec<String> = values
            .iter()
            .map(|v| match v {
                Value::String(s) => format!("`{s}`"),
                other => format!("`{other}`"),
            })
            .collect();
        out = format!("{out}, one of {}", list.join(", "));
    }
    let unsigned = schema["format"]
        .as_str()
        .is_some_and(|f| f.starts_with("uint"));
    if let Some(min) = schema["minimum"].as_f64()
        && !(unsigned && min == 0.0)
        && min != i32::MIN as f64
    {
        let _ = write!(out, ", ≥ {min}");
    }
    // The range of the Rust type itself (crdgen gives every integer one) says nothing.
    let natural = match schema["format"].as_str() {
        Some("uint32") => Some(u32::MAX as f64),
        Some("uint64" | "uint") => Some(i64::MAX as f64),
        Some("int32") => Some(i32::MAX as f64),
        _ => None,
    };
    if let Some(max) = schema["maximum"].as_f64()
        && Some(max) != natural
    {
        let _ = write!(out, ", ≤ {max}");
    }
    if let Some(n) = schema["maxLength"]
        .as_u64()
        .or_else(|| schema["maxLength"].as_f64().map(|f| f as u64))
    {
        let _ = write!(out, ", at most {n} characters");
    }
    if let Some(p) = schema["pattern"].as_str() {
        let _ = write!(out, ", pattern `{p}`");
    }
    out
}

/// The type column of a field.
fn type_of(schema: &Value) -> String {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        && schema.get("properties").is_none()
    {
        return "object (any fields)".into();
    }
    match schema["type"].as_str() {
        Some("array") => match schema["maxItems"].as_f64() {
            Some(n) => format!("array (at most {n}) of {}", type_of(&schema["items"])),
            None => format!("array of {}", type_of(&schema["items"])),
        },
        Some("object") => match schema.get("additionalProperties") {
            Some(v) if v.is_object() => format!("map of {}", type_of(v)),
            _ => "object".into(),
        },
        _ => scalar_type(schema),
    }
}

/// One table row per field below `schema`, depth first, with dotted paths.
fn rows(schema: &Value, path: &str, out: &mut Vec<[String; 5]>) {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    for (name, sub) in props {
        let here = format!("{path}.{name}");
        let default = sub
            .get("default")
            .map(|d| format!("`{}`", serde_json::to_string(d).unwrap_or_default()))
            .unwrap_or_default();
        out.push([
            format!("`{here}`"),
            type_of(sub),
            if required.contains(&name.as_str()) {
                "yes".into()
            } else {
                String::new()
            },
            default,
            sub["description"]
                .as_str()
                .map(one_line)
                .unwrap_or_default(),
        ]);
        rows(sub, &here, out);
        if sub["type"] == "array" {
            rows(&sub["items"], &format!("{here}[]"), out);
        }
        if let Some(v) = sub.get("additionalProperties").filter(|v| v.is_object()) {
            rows(v, &format!("{here}.<key>"), out);
        }
    }
}

fn table(schema: &Value, path: &str) -> String {
    let mut r = Vec::new();
    rows(schema, path, &mut r);
    let mut out = String::from(
        "| Field | Type | Required | Default | Description |\n|---|---|---|---|---|\n",
    );
    for [f, t, req, d, desc] in r {
        let _ = writeln!(out, "| {f} | {t} | {req} | {d} | {desc} |");
    }
    out
}

/// The markdown page.
fn render() -> Result<String, String> {
    let (_, yaml) = primus_crds::crdgen::render()?
        .into_iter()
        .find(|(name, _)| name == CRD_FILE)
        .ok_or_else(|| format!("crdgen rendered no {CRD_FILE}"))?;
    let crd: Value = serde_saphyr::from_str(&yaml).map_err(|e| format!("{CRD_FILE}: {e}"))?;
    let version = &crd["spec"]["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"];

    let mut out = String::new();
    let _ = writeln!(out, "# TrainingPlan reference\n");
    let _ = writeln!(
        out,
        "<!-- Generated from the CRD schema by `cargo run -p primus-crds --bin crddoc -- --write`; do not edit by hand (crds/tests/reference_doc.rs fails when this page is stale). -->\n"
    );
    let _ = writeln!(
        out,
        "{}\n",
        one_line(schema["description"].as_str().unwrap_or_default())
    );
    overview(&crd, &mut out);
    let _ = writeln!(
        out,
        "The same document drives the CLI (`primus project -f plan.yaml`) and the operator (`kubectl apply -f plan.yaml`); `examples/` holds complete plans. `kubectl explain trainingplan.spec` shows these descriptions too.\n"
    );
    if let Some(cols) = version["additionalPrinterColumns"].as_array() {
        let _ = writeln!(out, "## Columns of `kubectl get trainingplans`\n");
        let _ = writeln!(out, "| Column | Type | JSON path |\n|---|---|---|");
        for c in cols {
            let _ = writeln!(
                out,
                "| {} | {} | `{}` |",
                c["name"].as_str().unwrap_or_default(),
                c["type"].as_str().unwrap_or_default(),
                c["jsonPath"].as_str().unwrap_or_default()
            );
        }
        out.push('\n');
    }
    for (section, who) in [
        ("spec", "Written by users; the operator never writes it."),
        (
            "status",
            "Written by the operator through the status subresource (`status.measured` by `primus report`).",
        ),
    ] {
        let sub = &schema["properties"][section];
        let _ = writeln!(out, "## {section}\n");
        let _ = writeln!(
            out,
            "{}\n\n{who}\n",
            one_line(sub["description"].as_str().unwrap_or_default())
        );
        out.push_str(&table(sub, section));
        out.push('\n');
    }
    Ok(out.trim_end().to_string() + "\n")
}

/// The table of names: API version, kind, scope, plural, short names, categories,
/// subresources.
fn overview(crd: &Value, out: &mut String) {
    let spec = &crd["spec"];
    let version = &spec["versions"][0];
    let names = &spec["names"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let codes = |items: Vec<&str>| {
        items
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let list = |v: &Value| {
        codes(
            v.as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default(),
        )
    };
    let subresources: Vec<&str> = version["subresources"]
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(
        out,
        "| API version | `{}/{}` |",
        text(&spec["group"]),
        text(&version["name"])
    );
    let _ = writeln!(out, "| Kind | `{}` |", text(&names["kind"]));
    let _ = writeln!(out, "| Scope | {} |", text(&spec["scope"]));
    let _ = writeln!(out, "| Plural | `{}` |", text(&names["plural"]));
    let _ = writeln!(out, "| Short names | {} |", list(&names["shortNames"]));
    let _ = writeln!(out, "| Categories | {} |", list(&names["categories"]));
    let _ = writeln!(out, "| Subresources | {} |\n", codes(subresources));
}

fn main() -> ExitCode {
    let page = match render() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("crddoc: {e}");
            return ExitCode::from(1);
        }
    };
    match std::env::args().nth(1).as_deref() {
        None => {
            print!("{page}");
            ExitCode::SUCCESS
        }
        Some("--write") => {
            let path = doc_path();
            if let Err(e) = std::fs::write(&path, page) {
                eprintln!("crddoc: {}: {e}", path.display());
                return ExitCode::from(1);
            }
            eprintln!("wrote {}", path.display());
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("crddoc: unknown argument {other:?} (usage: crddoc [--write])");
            ExitCode::from(2)
        }
    }
}
