//! How every message quotes a value it got from a user: Debug-quoted (control characters
//! escaped, as Kubernetes shows a bad string value) and cut after `QUOTE_MAX_CHARS`
//! characters, so a huge input cannot flood an admission response, an event or a log line.

use std::fmt;

/// Longest value, in characters, quoted whole; longer ones are cut with `…`.
pub(crate) const QUOTE_MAX_CHARS: usize = 200;

/// Displays its string quoted and cut (see the module docs); for `format!` and `#[error]`.
#[derive(Clone, Copy, Debug)]
pub struct Quoted<'a>(pub &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(QUOTE_MAX_CHARS) {
            Some((cut, _)) => write!(f, "{:?}…", &self.0[..cut]),
            None => write!(f, "{:?}", self.0),
        }
    }
}

/// `value` quoted and cut, as a `String`.
pub fn quote(value: &str) -> String {
    Quoted(value).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_debug_quoted_whole() {
        assert_eq!(quote("nginx"), "\"nginx\"");
        assert_eq!(quote("a\nb\u{7}"), "\"a\\nb\\u{7}\"");
    }

    #[test]
    fn long_values_are_cut_at_a_character_boundary() {
        let long = "é".repeat(QUOTE_MAX_CHARS + 5);
        let quoted = quote(&long);
        assert_eq!(quoted, format!("{:?}…", "é".repeat(QUOTE_MAX_CHARS)));
        assert_eq!(
            quote(&"x".repeat(QUOTE_MAX_CHARS)),
            format!("{:?}", "x".repeat(QUOTE_MAX_CHARS))
        );
    }
}
