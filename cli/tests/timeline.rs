//! `primus timeline` writes a well-formed SVG that renders (rsvg-convert to PNG).

use std::path::Path;
use std::process::Command as Process;

mod common;

use common::primus;

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
        let out = primus()
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
        // 4 x 8 x (1 or 2) x 2 passes fit in 1,600 pixels: nothing is left out.
        assert!(svg.contains("all drawn to scale"), "{name}");
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
    let out = primus()
        .args(["timeline", "-f"])
        .arg(&plan)
        .arg("-o")
        .arg(dir.path().join("x.svg"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

/// Widths of the drawn passes of one kind (`F`, `B`), from their `<rect ...><title>K micro-batch`.
fn pass_widths(svg: &str, kind: char) -> Vec<f64> {
    let marker = format!("><title>{kind} micro-batch");
    svg.lines()
        .filter(|l| l.starts_with("<rect") && l.contains(&marker))
        .map(|l| {
            let w = l.split(" width=\"").nth(1).expect("a width");
            w[..w.find('"').unwrap()].parse::<f64>().expect("a number")
        })
        .collect()
}

/// The number just before `suffix` in `text` (thousands separators allowed).
fn number_before(text: &str, suffix: &str) -> Vec<usize> {
    text.match_indices(suffix)
        .map(|(i, _)| {
            let head = &text[..i];
            let digits: String = head
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_digit() || *c == ',')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .filter(|c| *c != ',')
                .collect();
            digits
                .parse()
                .unwrap_or_else(|_| panic!("no number before {suffix:?}"))
        })
        .collect()
}

#[test]
fn the_70b_example_keeps_its_passes_readable_and_counts_them_all() {
    // examples/llama3.1-70b-h100.yaml: 64 H100, TP4 PP8 VPP5, MBS 1, global batch 128.
    // DP = 64 / (4 x 8) = 2, micro-batches = 128 / (1 x 2) = 64 per pipeline, and every stage
    // runs a forward and a backward pass per micro-batch and chunk:
    // 8 stages x 64 micro-batches x 5 chunks = 2,560 forward and 2,560 backward passes.
    let (stages, microbatches, chunks) = (8usize, 64usize, 5usize);
    let forward = stages * microbatches * chunks;
    let dir = tempfile::tempdir().expect("tempdir");
    let svg_path = dir.path().join("70b.svg");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/llama3.1-70b-h100.yaml");
    let out = primus()
        .args(["timeline", "-f"])
        .arg(&example)
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
    check_xml(&svg).unwrap_or_else(|e| panic!("malformed SVG: {e}"));

    // The caption: the full counts of the schedule, and what is drawn.
    let caption = svg
        .lines()
        .find(|l| l.contains(" passes on "))
        .expect("a caption with the pass counts");
    assert!(
        caption.contains(&format!(
            "5,120 passes on {stages} stages: 2,560 forward, 2,560 backward;"
        )),
        "{caption}"
    );
    assert!(
        caption.contains("drawn: warm-up 0.000-")
            && caption.contains("steady state")
            && caption.contains("cool-down"),
        "{caption}"
    );
    assert!(svg.contains(&format!("{microbatches} micro-batches x {chunks} chunks")));

    // Every drawn pass is a visible box: forward at least 5 px, backward at least 5 px (to
    // scale, a forward pass would be 1,460 px x its 15 ms / the 15.6 s step: 1.4 px).
    let (f, b) = (pass_widths(&svg, 'F'), pass_widths(&svg, 'B'));
    assert!(
        f.len() >= stages * 20 && b.len() >= stages * 20,
        "{} F, {} B drawn",
        f.len(),
        b.len()
    );
    let narrowest = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(
        narrowest(&f) >= 5.0,
        "a forward box is {:.2} px wide",
        narrowest(&f)
    );
    assert!(
        narrowest(&b) >= 5.0,
        "a backward box is {:.2} px wide",
        narrowest(&b)
    );

    // Drawn and left out add up to the schedule: the caption's drawn count, the gaps' counts.
    let drawn = number_before(caption, " passes; one time scale");
    assert_eq!(drawn, [f.len() + b.len()], "{caption}");
    let left_out: usize = number_before(&svg, " passes left out").iter().sum();
    assert_eq!(
        drawn[0] + left_out,
        2 * forward,
        "drawn {drawn:?} + left out {left_out}"
    );

    match Process::new("rsvg-convert")
        .arg(&svg_path)
        .arg("-o")
        .arg(dir.path().join("70b.png"))
        .output()
    {
        Ok(r) => assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr)),
        Err(e) => eprintln!("SKIPPED rendering: rsvg-convert not available ({e})"),
    }
}
