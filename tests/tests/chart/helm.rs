//! Real `helm` against the chart: rendering, linting, and the rendered objects as JSON values.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    primus_tests::repo_root().join("charts/primus-projection")
}

/// A `helm` binary.
#[derive(Debug, Clone)]
pub struct Helm {
    bin: PathBuf,
}

/// What one `helm template` printed.
#[derive(Debug)]
pub struct Rendered {
    pub text: String,
    pub objects: Vec<Value>,
}

impl Helm {
    /// Find helm (or skip loudly / fail under `PRIMUS_REQUIRE_TESTBED=1`).
    pub fn find(test: &str) -> Option<Helm> {
        primus_tests::tools::require("helm", test).map(|bin| Helm { bin })
    }

    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .args(args)
            // Keep helm away from the caller's repositories and plugins.
            .env(
                "HELM_CACHE_HOME",
                std::env::temp_dir().join("primus-helm/cache"),
            )
            .env(
                "HELM_CONFIG_HOME",
                std::env::temp_dir().join("primus-helm/config"),
            )
            .env(
                "HELM_DATA_HOME",
                std::env::temp_dir().join("primus-helm/data"),
            )
            .output()
            .unwrap_or_else(|e| panic!("helm {args:?}: {e}"))
    }

    /// `helm template RELEASE CHART -n NAMESPACE ARGS`: the output, or stderr on failure.
    pub fn template(
        &self,
        release: &str,
        namespace: &str,
        args: &[&str],
    ) -> Result<Rendered, String> {
        let chart = chart_dir();
        let mut all = vec![
            "template",
            release,
            chart.to_str().expect("utf-8 path"),
            "--namespace",
            namespace,
        ];
        all.extend_from_slice(args);
        let out = self.run(&all);
        if !out.status.success() {
            return Err(primus_tests::stderr(&out));
        }
        let text = primus_tests::stdout(&out);
        let objects = parse_documents(&text);
        Ok(Rendered { text, objects })
    }

    /// Like [`Helm::template`] but the rendering must succeed.
    pub fn render(&self, release: &str, namespace: &str, args: &[&str]) -> Rendered {
        self.template(release, namespace, args)
            .unwrap_or_else(|e| panic!("helm template {args:?} failed:\n{e}"))
    }
}

/// The YAML documents of a multi-document stream, as JSON values (empty documents dropped).
pub fn parse_documents(text: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut flush = |doc: &mut String| {
        let meaningful = doc
            .lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
        if meaningful {
            let v: Value = serde_saphyr::from_str(doc)
                .unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{doc}"));
            if !v.is_null() {
                docs.push(v);
            }
        }
        doc.clear();
    };
    for line in text.lines() {
        if line.trim_end() == "---" {
            flush(&mut current);
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    flush(&mut current);
    docs
}

impl Rendered {
    /// Objects of one kind.
    pub fn kind(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    /// The one object of `kind` named `name`.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        let found: Vec<_> = self
            .kind(kind)
            .into_iter()
            .filter(|o| o["metadata"]["name"] == name)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "expected one {kind} {name}, found {}; kinds rendered: {:?}",
            found.len(),
            self.kinds()
        );
        found[0]
    }

    /// Every kind rendered, sorted, with repeats.
    pub fn kinds(&self) -> Vec<String> {
        let mut k: Vec<String> = self
            .objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap_or("?").to_string())
            .collect();
        k.sort();
        k
    }

    /// The rendering without the objects of `kinds`, as a YAML stream (JSON documents).
    pub fn without(&self, kinds: &[&str]) -> String {
        self.objects
            .iter()
            .filter(|o| !kinds.iter().any(|k| o["kind"] == *k))
            .map(|o| format!("---\n{}\n", serde_json::to_string(o).expect("JSON")))
            .collect()
    }
}

/// A file of the repository, as text.
pub fn repo_file(path: impl AsRef<Path>) -> String {
    let p = primus_tests::repo_root().join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
