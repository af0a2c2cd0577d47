//! Bounds on every size, count and length an input may give, checked before the oracle
//! computes or allocates with them. Beyond these nothing is a real training job, and within
//! them the oracle's integer arithmetic stays far from overflow and its allocations small.
//!
//! Each input type lists its bounded fields in one table, beside the type
//! ([`Bounded::BOUNDS`]: field name, [`Limit`], how to read the value), from the constants of
//! [`limits`]. The same table is checked in Rust ([`check`]) and written into the JSON schema
//! of the type ([`schema`], the CRD's `maximum`, `maxLength`, `maxItems`, `pattern`), so the
//! API server rejects most of an over-bound plan before any code runs and the messages name
//! the same field. A new field gets one row in its type's table.
//!
//! Bounds on combinations (products of sizes, the pipeline schedule's passes) are checked with
//! the rules that read them, in checked arithmetic ([`product`]).

use crate::error::FieldError;

/// The largest values any input may give. Shared by the tables of every input type, the
/// Megatron flag bounds and the derived-size budgets.
pub mod limits {
    /// Decoder layers, and every per-layer count (dense layers, layers of a pipeline stage,
    /// recomputed layers). Real models: <= 126 (Llama 3.1 405B).
    pub const LAYERS: u64 = 4096;
    /// Multi-token-prediction layers (DeepSeek-V3: 1).
    pub const MTP_LAYERS: u64 = 64;
    /// YaRN rotary scaling factor (gpt-oss: 32; DeepSeek-V3's 40).
    pub const YARN_SCALING: u64 = 1024;
    /// Model width, per-head and latent dimensions. Real models: <= 2^14.
    pub const HIDDEN: u64 = 1 << 17;
    /// FFN widths. Real models: <= 53,248 (Llama 3.1 405B).
    pub const FFN: u64 = 1 << 20;
    /// Attention heads and key/value heads.
    pub const HEADS: u64 = 4096;
    /// Vocabulary. Real models: <= 2^18.
    pub const VOCAB: u64 = 1 << 23;
    /// Routed and shared experts, experts per token. Real models: <= 384.
    pub const EXPERTS: u64 = 1 << 12;
    /// Sequence length and every length in tokens (positions, sliding window).
    pub const SEQ: u64 = 1 << 24;
    /// Global batch in sequences. Real jobs: <= 2^16.
    pub const GLOBAL_BATCH: u64 = 1 << 24;
    /// Each parallel size (tp, pp, vpp, cp, ep, etp) and the micro-batch size.
    pub const AXIS: u64 = 1 << 16;
    /// GPUs of a job.
    pub const GPUS: u64 = 1 << 24;
    /// Virtual pipeline stages (pp * vpp, or the stages of a pipeline layout).
    pub const VIRTUAL_STAGES: u64 = 1 << 13;
    /// Passes of one simulated pipeline schedule: 2 x virtual stages x micro-batches. The
    /// simulator keeps a few dozen bytes per pass; real jobs: <= 2^17.
    pub const SCHEDULE_PASSES: u64 = 1 << 22;
    /// Layouts reported by the tuner (`spec.tuning.topK`; each one is a status entry).
    pub const TOP_K: u64 = 64;
    /// Values of one `spec.tuning.allowed` list, and other short lists.
    pub const LIST: u64 = 64;
    /// Entries of `recomputeModules` (seven modules exist).
    pub const MODULES: u64 = 16;
    /// Characters of a name (preset, profile, product, resource, label).
    pub const NAME: u64 = 253;
    /// Characters of `pipelineLayout` (DeepSeek-V3's is 13).
    pub const LAYOUT_TEXT: u64 = 4096;
    /// Characters of a URL.
    pub const URL: u64 = 2048;
    /// Characters of a query, an image reference or another free text.
    pub const TEXT: u64 = 4096;
    /// Rounds of the agent searcher.
    pub const ROUNDS: u64 = 100;
    /// Seconds of any timeout (a day).
    pub const SECONDS: u64 = 86_400;
    /// Hours of report reuse (a year).
    pub const HOURS: u64 = 8_760;
    /// Benchmark attempts.
    pub const ATTEMPTS: u64 = 100;
    /// Measured tokens per second of one GPU (a validation row, `primus report`, a drift
    /// query): beyond any real run. The fastest rows here are ~45,000 on a GB300; a
    /// 100M-parameter model would not reach 10^7.
    pub const TOKENS_PER_SECOND_PER_GPU: f64 = 1e8;
    /// Measured TFLOP/s of one GPU: beyond any GPU's dense peak (GB300: 5,000 FP8).
    pub const TFLOPS_PER_GPU: f64 = 1e5;
    /// Measured seconds of one iteration (11.6 days).
    pub const SECONDS_PER_ITERATION: f64 = 1e6;
    /// Bytes of a document read whole from a file: a plan, a model card or hardware profile,
    /// a benchmark report, a Primus experiment, a certificate (the largest here: ~10 KB).
    pub const DOCUMENT_BYTES: u64 = 4 << 20;
    /// Bytes of a validation table (CSV) read whole (the largest here: ~180 KB).
    pub const TABLE_BYTES: u64 = 64 << 20;
    /// Entries of one profiles directory (`models/` or `hardware/`) the catalog lists (the
    /// built-in ones: 19 model cards, 11 hardware profiles).
    pub const PROFILE_FILES: u64 = 4096;
}

/// The bytes of a file of at most `max` bytes. A longer one, or a device that never ends
/// (`/dev/zero`, a pipe), is refused after reading `max + 1` bytes, with an `InvalidData`
/// error that states the limit: nothing is allocated by the file's size.
pub fn read_file(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {}, more than any input of its kind",
                if max.is_multiple_of(1 << 20) {
                    format!("{} MiB", max >> 20)
                } else {
                    format!("{max} bytes")
                }
            ),
        ));
    }
    Ok(bytes)
}

/// The UTF-8 text of a file of at most `max` bytes ([`read_file`]).
pub fn read_text_file(path: &std::path::Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_file(path, max)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// An input file's text ([`read_text_file`]), its error naming the path.
pub fn read_input(path: &std::path::Path, max: u64) -> Result<String, crate::error::PlanError> {
    read_text_file(path, max).map_err(|source| crate::error::PlanError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// A regular expression the API server checks (`pattern` in the schema) and the same test in
/// Rust.
#[derive(Debug, Clone, Copy)]
pub struct Pattern {
    /// ECMA-262 / RE2 syntax, anchored.
    pub regex: &'static str,
    /// What a matching value is, for the message ("an http(s) URL").
    pub what: &'static str,
    pub test: fn(&str) -> bool,
}

/// What a field may hold.
#[derive(Debug, Clone, Copy)]
pub enum Limit {
    /// An integer in `min..=max`.
    Int { min: u64, max: u64 },
    /// A string of at most `max` characters, matching `pattern` when given.
    Text { max: u64, pattern: Option<Pattern> },
    /// A list of at most `max` items.
    Items { max: u64 },
    /// A list of at most `items` integers, each in `min..=max`.
    Ints { items: u64, min: u64, max: u64 },
}

/// A field's value as its bound reads it.
#[derive(Debug, Clone, Copy)]
pub enum Seen<'a> {
    /// Not given (an absent optional field).
    Absent,
    Int(u64),
    Text(&'a str),
    /// The length of a list.
    Items(usize),
    Ints(&'a [u32]),
}

impl From<u32> for Seen<'_> {
    fn from(v: u32) -> Self {
        Seen::Int(v.into())
    }
}

impl From<u64> for Seen<'_> {
    fn from(v: u64) -> Self {
        Seen::Int(v)
    }
}

impl From<Option<u32>> for Seen<'_> {
    fn from(v: Option<u32>) -> Self {
        v.map_or(Seen::Absent, Seen::from)
    }
}

impl From<Option<u64>> for Seen<'_> {
    fn from(v: Option<u64>) -> Self {
        v.map_or(Seen::Absent, Seen::Int)
    }
}

impl<'a> From<&'a str> for Seen<'a> {
    fn from(v: &'a str) -> Self {
        Seen::Text(v)
    }
}

impl<'a> From<&'a String> for Seen<'a> {
    fn from(v: &'a String) -> Self {
        Seen::Text(v)
    }
}

impl<'a> From<Option<&'a String>> for Seen<'a> {
    fn from(v: Option<&'a String>) -> Self {
        v.map_or(Seen::Absent, |s| Seen::Text(s))
    }
}

/// One bounded field of `T`: its name in the input (camelCase, a property of `T`'s schema),
/// what it may hold, and how to read it.
pub struct Bound<T> {
    pub field: &'static str,
    pub limit: Limit,
    pub get: for<'a> fn(&'a T) -> Seen<'a>,
}

impl<T> Bound<T> {
    /// An integer field in `min..=max`.
    pub const fn int(
        field: &'static str,
        min: u64,
        max: u64,
        get: for<'a> fn(&'a T) -> Seen<'a>,
    ) -> Self {
        Bound {
            field,
            limit: Limit::Int { min, max },
            get,
        }
    }

    /// A string field of at most `max` characters.
    pub const fn text(field: &'static str, max: u64, get: for<'a> fn(&'a T) -> Seen<'a>) -> Self {
        Bound {
            field,
            limit: Limit::Text { max, pattern: None },
            get,
        }
    }

    /// A string field of at most `max` characters matching `pattern`.
    pub const fn matching(
        field: &'static str,
        max: u64,
        pattern: Pattern,
        get: for<'a> fn(&'a T) -> Seen<'a>,
    ) -> Self {
        Bound {
            field,
            limit: Limit::Text {
                max,
                pattern: Some(pattern),
            },
            get,
        }
    }

    /// A list field of at most `max` items.
    pub const fn items(field: &'static str, max: u64, get: for<'a> fn(&'a T) -> Seen<'a>) -> Self {
        Bound {
            field,
            limit: Limit::Items { max },
            get,
        }
    }

    /// A list of at most `items` integers, each in `min..=max`.
    pub const fn ints(
        field: &'static str,
        items: u64,
        min: u64,
        max: u64,
        get: for<'a> fn(&'a T) -> Seen<'a>,
    ) -> Self {
        Bound {
            field,
            limit: Limit::Ints { items, min, max },
            get,
        }
    }
}

/// An input type with bounded fields.
pub trait Bounded: Sized + 'static {
    /// One row per bounded field.
    const BOUNDS: &'static [Bound<Self>];

    /// Check every row, then the nested values (types with bounded children add theirs).
    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        check_rows(self, at, Self::BOUNDS)
    }
}

/// Check a value's bounds; `at` is its path in the input (`spec.model.card`).
pub fn check<T: Bounded>(value: &T, at: &str) -> Result<(), FieldError> {
    value.check_bounds(at)
}

/// Check `value` against the rows of a table.
pub fn check_rows<T>(value: &T, at: &str, rows: &[Bound<T>]) -> Result<(), FieldError> {
    for row in rows {
        check_one(row.field, row.limit, (row.get)(value), at)?;
    }
    Ok(())
}

/// The dotted path of a field under `at`.
pub fn path(at: &str, field: &str) -> String {
    if at.is_empty() {
        field.to_string()
    } else {
        format!("{at}.{field}")
    }
}

fn int_error(field: String, v: u64, min: u64, max: u64) -> FieldError {
    if v < min && min == 1 {
        FieldError::new(field, "must be greater than 0")
    } else if v < min {
        FieldError::new(field, format!("{v} is less than {min}"))
    } else {
        FieldError::new(field, format!("{v} is beyond any real job (at most {max})"))
    }
}

/// Check one value against one limit.
pub fn check_one(field: &str, limit: Limit, seen: Seen<'_>, at: &str) -> Result<(), FieldError> {
    match (limit, seen) {
        (_, Seen::Absent) => Ok(()),
        (Limit::Int { min, max }, Seen::Int(v)) => {
            if (min..=max).contains(&v) {
                Ok(())
            } else {
                Err(int_error(path(at, field), v, min, max))
            }
        }
        (Limit::Text { max, pattern }, Seen::Text(s)) => {
            // Count no further than the limit: the length of a huge string is not needed.
            let n = s.chars().take(max as usize + 1).count() as u64;
            if n > max {
                return Err(FieldError::new(
                    path(at, field),
                    format!("is longer than {max} characters"),
                ));
            }
            match pattern {
                Some(p) if !(p.test)(s) => Err(FieldError::new(
                    path(at, field),
                    format!("{} is not {}", crate::parse::quote(s), p.what),
                )),
                _ => Ok(()),
            }
        }
        (Limit::Items { max }, Seen::Items(n)) => items_ok(field, at, n, max),
        (Limit::Ints { items, min, max }, Seen::Ints(list)) => {
            items_ok(field, at, list.len(), items)?;
            for (i, &v) in list.iter().enumerate() {
                let v = u64::from(v);
                if !(min..=max).contains(&v) {
                    return Err(int_error(format!("{}[{i}]", path(at, field)), v, min, max));
                }
            }
            Ok(())
        }
        // A table row whose getter does not fit its limit: a bug in the table, caught by the
        // tables' own unit test; never a reason to reject input.
        _ => Ok(()),
    }
}

fn items_ok(field: &str, at: &str, n: usize, max: u64) -> Result<(), FieldError> {
    if n as u64 > max {
        Err(FieldError::new(
            path(at, field),
            format!("lists {n} values (at most {max})"),
        ))
    } else {
        Ok(())
    }
}

/// The product of `factors` (name, value), or an error naming `field` when it exceeds `max`
/// (checked arithmetic: never wraps). The message shows the product's terms.
pub fn product(field: &str, factors: &[(&str, u64)], max: u64) -> Result<u64, FieldError> {
    let mut p: u64 = 1;
    let mut over = false;
    for &(_, v) in factors {
        match p.checked_mul(v) {
            Some(x) if x <= max => p = x,
            _ => {
                over = true;
                break;
            }
        }
    }
    if !over {
        return Ok(p);
    }
    let names: Vec<&str> = factors.iter().map(|(n, _)| *n).collect();
    let values: Vec<String> = factors.iter().map(|(_, v)| v.to_string()).collect();
    Err(FieldError::new(
        field,
        format!("{} = {} exceeds {max}", names.join("*"), values.join("*")),
    ))
}

/// Patterns shared by several tables.
pub mod patterns {
    use super::Pattern;

    fn url(s: &str) -> bool {
        let rest = s
            .strip_prefix("https://")
            .or_else(|| s.strip_prefix("http://"));
        rest.is_some_and(|r| !r.is_empty() && !r.contains(char::is_whitespace))
    }

    fn dns_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    fn env_name(s: &str) -> bool {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    }

    fn layout_symbols(s: &str) -> bool {
        s.chars().all(|c| {
            matches!(
                c,
                'E' | 't' | 'm' | 'L' | '|' | '(' | ')' | '*' | ',' | ' ' | '\t'
            ) || c.is_ascii_digit()
        })
    }

    /// `http://` or `https://` and a host.
    pub const HTTP_URL: Pattern = Pattern {
        regex: "^https?://[^\\s]+$",
        what: "an http(s) URL",
        test: url,
    };
    /// A Kubernetes object name of one DNS label (RFC 1123).
    pub const DNS_LABEL: Pattern = Pattern {
        regex: "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        what: "a valid object name (lower-case letters, digits and '-', at most 63)",
        test: dns_label,
    };
    /// An environment variable name.
    pub const ENV_NAME: Pattern = Pattern {
        regex: "^[A-Za-z_][A-Za-z0-9_]*$",
        what: "an environment variable name",
        test: env_name,
    };
    /// The symbols of Megatron's pipeline layout syntax (the grammar is the parser's).
    pub const LAYOUT_SYMBOLS: Pattern = Pattern {
        regex: "^[EtmL|()*0-9, \\t]*$",
        what: "a pipeline layout (E, t, m, L, |, (, ), *n)",
        test: layout_symbols,
    };
}

/// Write a type's bounds into its JSON schema (a schemars `transform`): `minimum`/`maximum`,
/// `maxLength`/`pattern`, `maxItems` and the items' range, on each row's property.
#[cfg(feature = "schema")]
pub fn schema<T: Bounded>(s: &mut schemars::Schema) {
    let Some(props) = s
        .get_mut("properties")
        .and_then(serde_json::Value::as_object_mut)
    else {
        return;
    };
    for row in T::BOUNDS {
        if let Some(p) = props.get_mut(row.field).and_then(|p| p.as_object_mut()) {
            write_limit(p, row.limit);
        }
    }
}

#[cfg(feature = "schema")]
fn write_limit(p: &mut serde_json::Map<String, serde_json::Value>, limit: Limit) {
    use serde_json::json;
    match limit {
        Limit::Int { min, max } => {
            p.insert("minimum".into(), json!(min));
            p.insert("maximum".into(), json!(max));
        }
        Limit::Text { max, pattern } => {
            p.insert("maxLength".into(), json!(max));
            if let Some(pat) = pattern {
                p.insert("pattern".into(), json!(pat.regex));
            }
        }
        Limit::Items { max } => {
            p.insert("maxItems".into(), json!(max));
        }
        Limit::Ints { items, min, max } => {
            p.insert("maxItems".into(), json!(items));
            if let Some(i) = p.get_mut("items").and_then(|i| i.as_object_mut()) {
                i.insert("minimum".into(), json!(min));
                i.insert("maximum".into(), json!(max));
            }
        }
    }
}

/// A number as an error message shows it: scientific notation when tiny or huge (a subnormal
/// written out in full is hundreds of digits), plain otherwise.
pub fn shown(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-3..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_up_to_its_bound_and_no_further() {
        let dir = std::env::temp_dir().join(format!("primus-bounds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let at = dir.join("at");
        std::fs::write(&at, "x".repeat(1 << 20)).unwrap();
        assert_eq!(read_text_file(&at, 1 << 20).unwrap().len(), 1 << 20);
        let e = read_text_file(&at, (1 << 20) - 1).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("larger than 1048575 bytes"), "{e}");
        let bad = dir.join("bad");
        std::fs::write(&bad, [b'a', 0xff, b'b']).unwrap();
        assert!(
            read_text_file(&bad, 16)
                .unwrap_err()
                .to_string()
                .contains("UTF-8")
        );
        // A device that never ends: refused after max + 1 bytes.
        if std::path::Path::new("/dev/zero").exists() {
            let e = read_file(std::path::Path::new("/dev/zero"), 4 << 20).unwrap_err();
            assert!(e.to_string().contains("larger than 4 MiB"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    struct T {
        n: u32,
        s: String,
        list: Vec<u32>,
    }

    impl Bounded for T {
        const BOUNDS: &'static [Bound<Self>] = &[
            Bound::int("n", 1, 10, |t| t.n.into()),
            Bound::matching("s", 8, patterns::ENV_NAME, |t| (&t.s).into()),
            Bound::ints("list", 3, 1, 4, |t| Seen::Ints(&t.list)),
        ];
    }

    fn t(n: u32, s: &str, list: &[u32]) -> T {
        T {
            n,
            s: s.into(),
            list: list.to_vec(),
        }
    }

    #[test]
    fn each_limit_names_its_field() {
        assert!(check(&t(3, "A_B", &[1, 4]), "spec.x").is_ok());
        let e = |v: &T| check(v, "spec.x").unwrap_err();
        assert_eq!(
            e(&t(0, "A", &[])).to_string(),
            "spec.x.n: must be greater than 0"
        );
        assert_eq!(
            e(&t(11, "A", &[])).to_string(),
            "spec.x.n: 11 is beyond any real job (at most 10)"
        );
        assert_eq!(e(&t(1, "ABCDEFGHI", &[])).field, "spec.x.s");
        assert_eq!(e(&t(1, "1A", &[])).field, "spec.x.s");
        assert_eq!(e(&t(1, "A", &[1, 2, 3, 4])).field, "spec.x.list");
        assert_eq!(e(&t(1, "A", &[1, 5])).field, "spec.x.list[1]");
    }

    #[test]
    fn products_never_wrap() {
        assert_eq!(product("f", &[("a", 3), ("b", 4)], 12), Ok(12));
        let e = product("f", &[("tp", 65536), ("pp", 65536), ("cp", 1)], 1 << 24).unwrap_err();
        assert_eq!(
            e.to_string(),
            "f: tp*pp*cp = 65536*65536*1 exceeds 16777216"
        );
        assert!(product("f", &[("a", u64::MAX), ("b", u64::MAX)], u64::MAX).is_err());
    }

    #[test]
    fn patterns_agree_with_their_regex_on_examples() {
        // The regex is the API server's; the Rust test must accept and reject the same.
        for (p, good, bad) in [
            (
                patterns::HTTP_URL,
                &["http://prom:9090", "https://x.y/api"][..],
                &["prom:9090", "http://", "ftp://x", "http://a b"][..],
            ),
            (
                patterns::DNS_LABEL,
                &["a", "job-1", "0a"][..],
                &["", "-a", "a-", "Bad_Name", &"a".repeat(64)][..],
            ),
            (
                patterns::ENV_NAME,
                &["A", "_x1"][..],
                &["", "1A", "A-B"][..],
            ),
            (
                patterns::LAYOUT_SYMBOLS,
                &["Et|(tt|)*30mL", ""][..],
                &["x", "Et|tL;"][..],
            ),
        ] {
            for g in good {
                assert!((p.test)(g), "{} should accept {g:?}", p.regex);
            }
            for b in bad {
                assert!(!(p.test)(b), "{} should reject {b:?}", p.regex);
            }
        }
    }
}
