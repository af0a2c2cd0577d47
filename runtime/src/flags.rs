//! Duration flags. Every duration on a command line of this project is a number of seconds in
//! a flag named `--*-seconds` (fractions allowed: `--budget-seconds 0.25`), read into a
//! [`Duration`] by one of these parsers (`#[arg(value_parser = primus_runtime::flags::seconds)]`),
//! so a bad value is a clap usage error naming the flag.

use std::time::Duration;

/// A non-negative, finite number of seconds.
pub fn seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("must be a non-negative number of seconds, got {s}"));
    }
    Duration::try_from_secs_f64(v).map_err(|e| format!("{s} seconds: {e}"))
}

/// A positive, finite number of seconds.
pub fn positive_seconds(s: &str) -> Result<Duration, String> {
    let d = seconds(s)?;
    if d.is_zero() {
        return Err(format!("must be a positive number of seconds, got {s}"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_and_fractional_seconds_parse() {
        assert_eq!(seconds("300"), Ok(Duration::from_secs(300)));
        assert_eq!(seconds("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(seconds("0"), Ok(Duration::ZERO));
        assert_eq!(positive_seconds("2"), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn bad_values_are_errors_not_panics() {
        for bad in ["", "ten", "-1", "NaN", "inf", "1e300"] {
            assert!(seconds(bad).is_err(), "{bad:?}");
        }
        assert!(positive_seconds("0").unwrap_err().contains("positive"));
    }
}
