//! Which Kubernetes API calls the Rust code makes, read from the sources, as RBAC rules
//! (API group, resource, verb). The chart's roles are compared against this, so a new call in
//! the code (or a verb dropped from the chart) fails `chart_rbac_matches_the_api_calls_in_the_code`.
//!
//! The scanner understands the patterns the code base uses and refuses to guess: an `Api<...>`
//! it cannot place, a type it has no resource for, or a method it has no verb for is an error
//! that names the file and line, so a new pattern is taught here rather than silently missed.
//!
//! - bindings: `let NAME: Api<Type> = ...;` and struct fields `NAME: Api<Type>,` (used as
//!   `self.NAME`); `Api<DynamicObject>` gets its resource from the statement
//!   (`job_resource(kind)`: PyTorchJobs and TrainJobs, `plan_resource()`, `report_resource()`,
//!   or a variable bound to one);
//! - calls on a binding: `get`/`get_opt` -> get, `list` -> list, `watch` -> watch, `create`,
//!   `delete`, `replace` -> update, `patch` -> patch (plus create for a server-side apply that
//!   may create the object, i.e. unless the same binding read it with `get` first, which fails
//!   when it is missing), `patch_status`/`replace_status`/`get_status` -> `RES/status`;
//! - `Controller::new(NAME`, `.owns(NAME`, `.owns_with(NAME`, `.watches(NAME`, `watcher(NAME`
//!   -> list and watch;
//! - `Recorder::new(` -> events.k8s.io events create and patch (events and their series);
//! - `X.controller_owner_ref(` with `X: &Type` -> `RES/finalizers` update (blockOwnerDeletion);
//! - discovery (`list_api_group_resources`, `apiserver_version`, ...) is left to the default
//!   `system:discovery` role.
//!
//! Helper functions in shared files (e.g. the CLI's `get_plan`) count for a component only when
//! one of its files calls them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One RBAC permission: (API group, resource[/subresource], verb).
pub type Perm = (String, String, String);

fn perm(group: &str, resource: &str, verb: &str) -> Perm {
    (group.to_string(), resource.to_string(), verb.to_string())
}

/// (group, resource) of a typed `Api<T>` (one pair, as a slice like [`resource_of_fn`]'s).
fn resource_of_type(t: &str) -> Option<&'static [(&'static str, &'static str)]> {
    Some(match t {
        // The operator's plans, decoded object by object (operator/src/decoded.rs).
        "TrainingPlan" | "PlanObject" => &[("primus.dev", "trainingplans")],
        "BenchmarkReport" => &[("primus.dev", "benchmarkreports")],
        "Pod" => &[("", "pods")],
        "Secret" => &[("", "secrets")],
        "Lease" => &[("coordination.k8s.io", "leases")],
        "ValidatingWebhookConfiguration" => &[(
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
        )],
        "Event" => &[("events.k8s.io", "events")],
        _ => return None,
    })
}

/// The (group, resource) pairs of the `ApiResource` a function returns (`job_resource(kind)`
/// returns either job kind's).
fn resource_of_fn(f: &str) -> Option<&'static [(&'static str, &'static str)]> {
    Some(match f {
        "job_resource" => &[
            ("kubeflow.org", "pytorchjobs"),
            ("trainer.kubeflow.org", "trainjobs"),
        ],
        "plan_resource" => &[("primus.dev", "trainingplans")],
        "report_resource" => &[("primus.dev", "benchmarkreports")],
        _ => return None,
    })
}

/// The source with comments blanked out (same byte offsets) and `#[cfg(test)]` modules cut.
fn clean(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    for line in src.lines() {
        let code = match find_line_comment(line) {
            Some(i) => format!("{}{}", &line[..i], " ".repeat(line.len() - i)),
            None => line.to_string(),
        };
        out.push_str(&code);
        out.push('\n');
    }
    if let Some(i) = out.find("#[cfg(test)]\nmod ") {
        out.truncate(i);
    }
    out
}

/// Where a `//` comment starts, outside string literals.
fn find_line_comment(line: &str) -> Option<usize> {
    let b = line.as_bytes();
    let mut in_str = false;
    let mut i = 0;
    while i + 1 < b.len() {
        match b[i] {
            b'\\' if in_str => i += 1,
            b'"' => in_str = !in_str,
            b'/' if !in_str && b[i + 1] == b'/' => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

fn line_of(src: &str, pos: usize) -> usize {
    src[..pos].matches('\n').count() + 1
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifier that ends right before `pos` (skipping spaces).
fn ident_before(src: &str, pos: usize) -> Option<(usize, &str)> {
    let head = src[..pos].trim_end();
    let start = head
        .char_indices()
        .rev()
        .take_while(|(_, c)| is_ident(*c))
        .last()
        .map(|(i, _)| i)?;
    Some((start, &head[start..]))
}

/// The identifier that starts at `pos` (skipping spaces and `&`).
fn ident_at(src: &str, pos: usize) -> Option<&str> {
    let rest = src[pos..].trim_start_matches([' ', '\n', '&']);
    let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// The text of the call whose `(` is at `open` up to its matching `)`.
fn call_args(src: &str, open: usize) -> &str {
    let mut depth = 0usize;
    for (i, c) in src[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &src[open + 1..open + i];
                }
            }
            _ => {}
        }
    }
    &src[open..]
}

#[derive(Debug, Clone)]
struct Binding {
    name: String,
    field: bool,
    pos: usize,
    /// (group, resource) pairs the binding may address.
    resources: &'static [(&'static str, &'static str)],
}

/// What one file does: permissions, and the helper functions it calls.
#[derive(Debug, Default)]
pub struct FileScan {
    pub perms: BTreeSet<Perm>,
    /// Per function (by name): the permissions of the calls in its body.
    pub per_fn: BTreeMap<String, BTreeSet<Perm>>,
}

/// Scan one source file. Errors name the file and line of what the scanner cannot place.
pub fn scan_source(path: &str, raw: &str) -> Result<FileScan, String> {
    let src = clean(raw);
    let err = |pos: usize, what: String| format!("{path}:{}: {what}", line_of(&src, pos));

    // Variables bound to an ApiResource: `let ar = job_resource(kind);`.
    let mut resource_vars: BTreeMap<String, &'static [(&'static str, &'static str)]> =
        BTreeMap::new();
    for (pos, _) in src.match_indices("let ") {
        if let Some(name) = ident_at(&src, pos + 4) {
            let stmt = &src[pos..src[pos..].find(';').map_or(src.len(), |e| pos + e)];
            if let Some(rhs) = stmt.split('=').nth(1)
                && let Some(f) = ident_at(rhs, 0)
                && let Some(r) = resource_of_fn(f)
            {
                resource_vars.insert(name.to_string(), r);
            }
        }
    }

    // Bindings: `NAME: Api<T>`.
    let mut bindings: Vec<Binding> = Vec::new();
    let mut placed = BTreeSet::new();
    for (pos, _) in src.match_indices(": Api<") {
        let Some((name_start, name)) = ident_before(&src, pos) else {
            return Err(err(pos, "`: Api<` without a name before it".into()));
        };
        let t_start = pos + ": Api<".len();
        let t_end = src[t_start..]
            .find('>')
            .map(|e| t_start + e)
            .unwrap_or(src.len());
        let t = src[t_start..t_end].trim();
        // A struct field (used as `self.NAME`), else a local or a parameter.
        let field = src[..name_start]
            .rfind("struct ")
            .is_some_and(|s| !src[s..name_start].contains('}'));
        let stmt_end = src[pos..]
            .find(if field { ',' } else { ';' })
            .map_or(src.len(), |e| pos + e);
        let resources = if t == "DynamicObject" {
            let stmt = &src[pos..stmt_end];
            let by_fn = stmt
                .match_indices("_resource(")
                .find_map(|(i, _)| ident_before(stmt, i + "_resource".len()))
                .and_then(|(_, f)| resource_of_fn(f));
            let by_var = || {
                stmt.match_indices('&')
                    .filter_map(|(i, _)| ident_at(stmt, i + 1))
                    .find_map(|v| resource_vars.get(v).copied())
            };
            match by_fn.or_else(by_var) {
                Some(r) => r,
                None => {
                    return Err(err(
                        pos,
                        format!(
                            "Api<DynamicObject> `{name}`: cannot tell its resource from `{}`",
                            stmt.trim()
                        ),
                    ));
                }
            }
        } else {
            match resource_of_type(t) {
                Some(r) => r,
                None => {
                    return Err(err(
                        pos,
                        format!(
                            "Api<{t}> `{name}`: no resource known for {t}; add it to rbac_scan.rs"
                        ),
                    ));
                }
            }
        };
        placed.insert(line_of(&src, pos));
        bindings.push(Binding {
            name: name.to_string(),
            field,
            pos,
            resources,
        });
    }
    // Every other mention of `Api<`/`Api::` must be a constructor inside a binding's statement
    // (`Api::namespaced(..)` on the right of `let x: Api<T> =`) or a generic helper signature.
    for pat in ["Api::", "Api<"] {
        for (pos, _) in src.match_indices(pat) {
            if src[..pos].ends_with(": ") || src[..pos].ends_with("kube::") && pat == "Api::" {
                continue;
            }
            let line = line_of(&src, pos);
            let in_binding = bindings.iter().any(|b| {
                let stmt_end = src[b.pos..].find(';').map_or(src.len(), |e| b.pos + e);
                pos >= b.pos && pos <= stmt_end
            });
            let generic_sig = src[..pos].trim_end().ends_with("->");
            let generic_ctor = src[src[..pos].rfind("fn ").unwrap_or(0)..pos].contains("-> Api<K>");
            if in_binding || generic_sig || generic_ctor || placed.contains(&line) {
                continue;
            }
            return Err(err(
                pos,
                format!("an `{pat}` the scanner cannot place; teach rbac_scan.rs"),
            ));
        }
    }

    let binding_at = |name: &str, field: bool, pos: usize| -> Option<&Binding> {
        bindings
            .iter()
            .filter(|b| b.name == name && b.field == field && (field || b.pos < pos))
            .max_by_key(|b| b.pos)
    };

    let mut found: Vec<(usize, Perm)> = Vec::new();
    // Method calls on bindings.
    for (dot, _) in src.match_indices('.') {
        let Some(method) = ident_at(&src, dot + 1) else {
            continue;
        };
        let after = dot + 1 + src[dot + 1..].find(method).unwrap_or(0) + method.len();
        if !src[after..].starts_with('(') {
            continue;
        }
        let Some((recv_start, recv)) = ident_before(&src, dot) else {
            continue;
        };
        let field = src[..recv_start].ends_with("self.");
        let Some(b) = binding_at(recv, field, dot) else {
            continue;
        };
        let args = call_args(&src, after);
        for &(g, r) in b.resources {
            let verbs: Vec<(String, &str)> = match method {
                "get" | "get_opt" | "get_metadata" | "get_metadata_opt" => vec![(r.into(), "get")],
                "list" | "list_metadata" => vec![(r.into(), "list")],
                "watch" | "watch_metadata" => vec![(r.into(), "watch")],
                "create" => vec![(r.into(), "create")],
                "delete" => vec![(r.into(), "delete")],
                "delete_collection" => vec![(r.into(), "deletecollection")],
                "replace" => vec![(r.into(), "update")],
                "patch" | "patch_metadata" => {
                    let read_first = src[b.pos..dot].contains(&format!("{recv}.get("));
                    if args.contains("Patch::Apply") && !read_first {
                        vec![(r.into(), "patch"), (r.into(), "create")]
                    } else {
                        vec![(r.into(), "patch")]
                    }
                }
                "patch_status" => vec![(format!("{r}/status"), "patch")],
                "replace_status" => vec![(format!("{r}/status"), "update")],
                "get_status" => vec![(format!("{r}/status"), "get")],
                "clone" | "resource_url" | "namespace" => vec![],
                other => {
                    return Err(err(
                        dot,
                        format!(
                            "`{recv}.{other}(..)` on an Api: no verb known; add it to rbac_scan.rs"
                        ),
                    ));
                }
            };
            for (res, verb) in verbs {
                found.push((dot, perm(g, &res, verb)));
            }
        }
    }
    // Watches.
    for pat in [
        "Controller::new(",
        ".owns(",
        ".owns_with(",
        ".watches(",
        "watcher(",
    ] {
        for (pos, _) in src.match_indices(pat) {
            let Some(name) = ident_at(&src, pos + pat.len()) else {
                continue;
            };
            let b = binding_at(name, false, pos)
                .ok_or_else(|| err(pos, format!("`{pat}{name}`: `{name}` is no Api binding")))?;
            for &(g, r) in b.resources {
                found.push((pos, perm(g, r, "list")));
                found.push((pos, perm(g, r, "watch")));
            }
        }
    }
    // Events.
    for (pos, _) in src.match_indices("Recorder::new(") {
        found.push((pos, perm("events.k8s.io", "events", "create")));
        found.push((pos, perm("events.k8s.io", "events", "patch")));
    }
    // Owner references that block the owner's deletion.
    for (pos, _) in src.match_indices(".controller_owner_ref(") {
        let (_, recv) = ident_before(&src, pos)
            .ok_or_else(|| err(pos, "controller_owner_ref without a receiver".into()))?;
        let decl = format!("{recv}: &");
        let t = src[..pos]
            .rfind(&decl)
            .and_then(|i| ident_at(&src, i + decl.len()))
            .and_then(resource_of_type)
            .and_then(|r| r.first().copied())
            .ok_or_else(|| {
                err(
                    pos,
                    format!("controller_owner_ref on `{recv}`: its type is not known"),
                )
            })?;
        found.push((pos, perm(t.0, &format!("{}/finalizers", t.1), "update")));
    }
    // Attribute each permission to the function around it.
    let fns: Vec<(usize, String)> = src
        .match_indices("fn ")
        .filter(|(i, _)| *i == 0 || !is_ident(src[..*i].chars().last().unwrap_or(' ')))
        .filter_map(|(i, _)| ident_at(&src, i + 3).map(|n| (i, n.to_string())))
        .collect();
    let mut scan = FileScan::default();
    for (pos, p) in found {
        if let Some((_, f)) = fns.iter().rev().find(|(i, _)| *i < pos) {
            scan.per_fn.entry(f.clone()).or_default().insert(p.clone());
        }
        scan.perms.insert(p);
    }
    Ok(scan)
}

/// A component: its own files (every call counts) and shared files (only the functions its own
/// files call count).
pub struct Component<'a> {
    pub own: Vec<PathBuf>,
    pub shared: Vec<PathBuf>,
    pub root: &'a Path,
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `.rs` file under `dir`, except under the listed subdirectories.
pub fn sources(dir: &Path, except: &[&str]) -> Vec<PathBuf> {
    let mut all = Vec::new();
    rs_files(dir, &mut all);
    all.retain(|p| !except.iter().any(|x| p.starts_with(dir.join(x))));
    all
}

impl Component<'_> {
    /// The permissions the component's code needs.
    pub fn perms(&self) -> Result<BTreeSet<Perm>, String> {
        let read = |p: &PathBuf| {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let rel = p.strip_prefix(self.root).unwrap_or(p).display().to_string();
            Ok::<_, String>((rel, text))
        };
        let mut perms = BTreeSet::new();
        let mut own_text = String::new();
        for p in &self.own {
            let (rel, text) = read(p)?;
            perms.extend(scan_source(&rel, &text)?.perms);
            own_text.push_str(&clean(&text));
        }
        for p in &self.shared {
            let (rel, text) = read(p)?;
            for (f, ps) in scan_source(&rel, &text)?.per_fn {
                let called = own_text.match_indices(&format!("{f}(")).any(|(i, _)| {
                    !own_text[..i].ends_with("fn ")
                        && !is_ident(own_text[..i].chars().last().unwrap_or(' '))
                });
                if called {
                    perms.extend(ps);
                }
            }
        }
        Ok(perms)
    }
}

#[test]
fn the_scanner_reads_the_patterns_it_claims_to() {
    let src = r#"
use kube::api::{Api, Patch};
struct Elector { api: Api<Lease>, }
impl Elector {
    async fn step(&self) { self.api.get_opt("x").await; self.api.replace("x", &pp, &l).await; }
}
async fn job(plan: &TrainingPlan) {
    let ar = job_resource(kind);
    let jobs: Api<DynamicObject> = Api::namespaced_with(c.clone(), ns, &ar);
    jobs
        .patch(&n, &PatchParams::default(), &Patch::Merge(&p))
        .await;
    let o = plan.controller_owner_ref(&());
    // pods.delete(&x) in a comment does not count
}
async fn apply() {
    let reports: Api<DynamicObject> = Api::namespaced_with(c.clone(), &ns, &report_resource());
    reports.patch(&n, &pp, &Patch::Apply(&b)).await;
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(c);
    let cur = hooks.get(name).await;
    hooks.patch(name, &pp, &Patch::Apply(&b)).await;
}
fn controller(pods: Api<Pod>) {
    let plans: Api<TrainingPlan> = Api::all(c.clone());
    let pods: Api<Pod> = Api::all(c.clone());
    Controller::new(plans, cfg).owns(pods, cfg);
    plans.patch_status("p", &pp, &Patch::Apply(&s));
}
"#;
    let s = scan_source("example.rs", src).expect("scans");
    let want: BTreeSet<Perm> = [
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "update"),
        ("kubeflow.org", "pytorchjobs", "patch"),
        ("trainer.kubeflow.org", "trainjobs", "patch"),
        ("primus.dev", "trainingplans/finalizers", "update"),
        ("primus.dev", "benchmarkreports", "patch"),
        ("primus.dev", "benchmarkreports", "create"),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            "get",
        ),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            "patch",
        ),
        ("primus.dev", "trainingplans", "list"),
        ("primus.dev", "trainingplans", "watch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("primus.dev", "trainingplans/status", "patch"),
    ]
    .iter()
    .map(|(g, r, v)| perm(g, r, v))
    .collect();
    assert_eq!(s.perms, want);
    assert_eq!(
        s.per_fn["apply"].iter().filter(|p| p.2 == "create").count(),
        1,
        "the apply without a read creates; the one after a get does not"
    );

    // What it cannot place is an error naming the line, not a silent miss.
    let unknown =
        scan_source("x.rs", "fn f() { let s: Api<ConfigMap> = Api::all(c); }").unwrap_err();
    assert!(
        unknown.contains("x.rs:1") && unknown.contains("ConfigMap"),
        "{unknown}"
    );
    let stray = scan_source("y.rs", "fn f() {\n    helper(Api::<Pod>::all(c));\n}").unwrap_err();
    assert!(stray.contains("y.rs:2"), "{stray}");
    let method = scan_source(
        "z.rs",
        "fn f() { let p: Api<Pod> = Api::all(c); p.evict(\"x\"); }",
    )
    .unwrap_err();
    assert!(method.contains("evict"), "{method}");
}
