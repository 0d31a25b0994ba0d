//! Durations on the wire (`"1500ms"`, `"30s"`, `"5m"`, `"1h30m"`, `"3d"`): the parser, formatter
//! and serde helpers live in [`sundial_core::duration`], shared with the workflow crate; this
//! module keeps the server's paths (`sundial_server::duration::parse`, `crate::duration::opt`)
//! and the bound on durations that set how long something stays valid.

pub use sundial_core::duration::*;

/// The longest validity a request may give (a token's `expires_in`, a secret rotation's
/// `overlap`): 36,500 days, about a century. The end it sets is stored and answered as an RFC
/// 3339 time, which cannot name a year past 9999, so an unbounded duration would store a time no
/// answer can carry.
pub const MAX_VALIDITY: std::time::Duration = std::time::Duration::from_secs(36_500 * 24 * 3600);

/// Why a validity duration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ValidityError {
    /// Not a duration at all.
    #[error(transparent)]
    Parse(#[from] DurationError),
    /// Longer than [`MAX_VALIDITY`].
    #[error("{0:?} is longer than the longest validity Sundial takes, 36500d")]
    TooLong(String),
}

/// Parses a validity duration (see [`MAX_VALIDITY`]).
pub fn parse_validity(s: &str) -> Result<std::time::Duration, ValidityError> {
    let d = parse(s)?;
    if d > MAX_VALIDITY {
        return Err(ValidityError::TooLong(s.to_string()));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_validity_is_at_most_a_century() {
        assert_eq!(parse_validity("36500d").ok(), Some(MAX_VALIDITY));
        assert!(matches!(
            parse_validity("36500d1ms"),
            Err(ValidityError::TooLong(_))
        ));
        assert!(matches!(
            parse_validity("88000000d"),
            Err(ValidityError::TooLong(_))
        ));
        assert!(matches!(parse_validity("1w"), Err(ValidityError::Parse(_))));
    }
}
