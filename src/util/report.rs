//! `Debug` for the crate's errors: what `Display` says, then each source,
//! as anyhow prints them, so `fn main() -> Result<(), E>` reads well.

use std::error::Error;
use std::fmt;

/// Writes `e` and its source chain.
pub(crate) fn chain(e: &(dyn Error + 'static), f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "{e}")?;
    let mut source = e.source();
    if source.is_some() {
        f.write_str("\n\nCaused by:")?;
    }
    while let Some(s) = source {
        write!(f, "\n    {s}")?;
        source = s.source();
    }
    Ok(())
}

/// `impl Debug` through [`chain`].
macro_rules! debug_as_display {
    ($($t:ty),+) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                crate::util::report::chain(self, f)
            }
        }
    )+};
}
pub(crate) use debug_as_display;

#[cfg(test)]
mod tests {
    #[derive(Debug)]
    struct Inner;
    impl std::fmt::Display for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("connection refused")
        }
    }
    impl std::error::Error for Inner {}

    struct Outer(Inner);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("redis unreachable")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    debug_as_display!(Outer);

    #[test]
    fn the_crates_errors_debug_as_they_display() {
        let e = crate::error::BuildError::DuplicateRule("api".into());
        assert_eq!(format!("{e:?}"), e.to_string());
        let q = crate::quota::QuotaError::ZeroLimit;
        assert_eq!(format!("{q:?}"), q.to_string());
    }

    #[test]
    fn debug_is_display_then_the_sources() {
        assert_eq!(
            format!("{:?}", Outer(Inner)),
            "redis unreachable\n\nCaused by:\n    connection refused"
        );
    }
}
