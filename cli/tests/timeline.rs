//! `primus timeline` writes a well-formed SVG that renders (rsvg-convert to PNG).

use std::path::Path;
use std::process::Command as Process;

use assert_cmd::Command;

/// Minimal XML well-formedness check: balanced, properly nested tags, quoted attributes,
/// only the predefined entities, one root element.
fn check_xml(text: &str) -> Result<usize, String> {
    let b = text.as_bytes();
    let mut stack: Vec<String> = Vec::new();
    let mut elements = 0usize;
    let mut roots = 0usize;
    let mut i = 0usize;
    while i < b.len() {
        match b[i] {
            b'<' => {
                let end = text[i..].find('>').ok_or("unterminated tag")? + i;
                let tag = &text[i + 1..end];
                if let Some(rest) = tag.strip_prefix('?') {
                    if !rest.ends_with('?') {
                        return Err(format!("bad declaration at {i}"));
                    }
                } else if let Some(name) = tag.strip_prefix('/') {
                    let open = stack.pop().ok_or(format!("stray </{name}> at {i}"))?;
                    if open != name.trim() {
                        return Err(format!("</{name}> closes <{open}> at {i}"));
                    }
                } else {
                    let self_closing = tag.ends_with('/');
                    let body = tag.trim_end_matches('/');
                    let name: String = body.chars().take_while(|c| !c.is_whitespace()).collect();
                    if name.is_empty()
                        || !name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == ':' || c == '-')
                    {
                        return Err(format!("bad element name {name:?} at {i}"));
                    }
                    // Attributes: name="value" pairs.
                    let attrs = &body[name.len()..];
                    let quotes = attrs.matches('"').count();
                    if !quotes.is_multiple_of(2) {
                        return Err(format!("unbalanced quotes in <{name}> at {i}"));
                    }
                    if stack.is_empty() {
                        roots += 1;
                    }
                    elements += 1;
                    if !self_closing {
                        stack.push(name);
                    }
                }
                i = end + 1;
            }
            b'&' => {
                let end = text[i..].find(';').ok_or("unterminated entity")? + i;
                let ent = &text[i + 1..end];
                if !["amp", "lt", "gt", "quot", "apos"].contains(&ent) {
                    return Err(format!("unknown entity &{ent}; at {i}"));
                }
                i = end + 1;
            }
            _ => i += 1,
        }
    }
    if !stack.is_empty() {
        return Err(format!("unclosed elements {stack:?}"));
    }
    if roots != 1 {
        return Err(format!("{roots} root elements"));
    }
    Ok(elements)
}

fn write_plan(dir: &Path, parallelism: &str) -> std::path::PathBuf {
    let path = dir.join("plan.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata: {{name: timeline}}\nspec:\n  model: {{preset: llama3.1-70b}}\n  cluster: {{gpu: h100-sxm, gpus: 32}}\n  training: {{seqLength: 4096, globalBatchSize: 16, precision: bf16}}\n  parallelism: {parallelism}\n"
        ),
    )
    .expect("write plan");
    path
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    if bytes.len() < 24 || &bytes[..8] != b"\x89PNG\r\n\x1a\n" || &bytes[12..16] != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(bytes[16..20].try_into().ok()?);
    let h = u32::from_be_bytes(bytes[20..24].try_into().ok()?);
    Some((w, h))
}

#[test]
fn timeline_svg_is_well_formed_and_renders() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, parallelism) in [
        (
            "interleaved",
            "{tp: 4, pp: 4, vpp: 2, recompute: full, schedule: interleaved}",
        ),
        ("zero-bubble", "{tp: 4, pp: 4, schedule: zero-bubble}"),
    ] {
        let plan = write_plan(dir.path(), parallelism);
        let svg_path = dir.path().join(format!("{name}.svg"));
        let out = Command::cargo_bin("primus")
            .expect("binary")
            .args(["timeline", "-f"])
            .arg(&plan)
            .arg("-o")
            .arg(&svg_path)
            .output()
            .expect("runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let svg = std::fs::read_to_string(&svg_path).expect("svg written");
        let elements = check_xml(&svg).unwrap_or_else(|e| panic!("{name}: malformed SVG: {e}"));
        // 4 stages x 8 micro-batches x (chunks) x (F, B[, W]) blocks, plus axis and legend.
        assert!(elements > 100, "{name}: only {elements} elements");
        assert!(svg.contains("stage 3") && svg.contains("bubble") && svg.contains("p2p"));
        if name == "interleaved" {
            assert!(svg.contains("recompute micro-batch"));
        } else {
            assert!(svg.contains("W micro-batch"));
        }

        // Render it. rsvg-convert (Debian librsvg2-bin) is installed by the test scripts.
        let png_path = dir.path().join(format!("{name}.png"));
        match Process::new("rsvg-convert")
            .arg(&svg_path)
            .arg("-o")
            .arg(&png_path)
            .output()
        {
            Ok(r) => {
                assert!(
                    r.status.success(),
                    "{name}: rsvg-convert failed: {}",
                    String::from_utf8_lossy(&r.stderr)
                );
                let png = std::fs::read(&png_path).expect("png written");
                let (w, h) = png_size(&png).expect("a PNG");
                assert_eq!(w, 1600);
                assert!(h > 200, "{h}");
                // A blank image compresses to almost nothing; the schedule does not.
                assert!(png.len() > 20_000, "{name}: PNG only {} bytes", png.len());
            }
            Err(e) => eprintln!("SKIPPED rendering: rsvg-convert not available ({e})"),
        }
    }
}

#[test]
fn timeline_of_an_illegal_layout_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = write_plan(dir.path(), "{tp: 4, pp: 3}");
    let out = Command::cargo_bin("primus")
        .expect("binary")
        .args(["timeline", "-f"])
        .arg(&plan)
        .arg("-o")
        .arg(dir.path().join("x.svg"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}
