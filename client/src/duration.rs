//! Durations as people type them: `500ms`, `10s`, `2m`, `1h`; a bare number is seconds.

use std::time::Duration;

pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 10s, 2m)"))?;
    let seconds = match unit {
        "ms" => value / 1_000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3_600.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!("{text:?} is not a duration"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
        assert!(parse("ten").is_err());
        assert!(parse("5 parsecs").is_err());
    }
}
