//! `FailureMode::RefusePercent`'s choice of which requests to refuse:
//! counted, not drawn, so that the share is exact and testable.

use std::sync::atomic::{AtomicU64, Ordering};

/// The requests one rule's partial mode has decided on this gateway.
///
/// Request `i` (from 0) is refused when `⌊(i + 1)·p / 100⌋` exceeds
/// `⌊i·p / 100⌋`: a Bresenham line, so the refusals are spread evenly, and
/// any `n` consecutive requests hold `⌊n·p / 100⌋` or `⌈n·p / 100⌉` of them.
/// Concurrent requests each take their own `i`.
#[derive(Debug, Default)]
pub(crate) struct Partial {
    seen: AtomicU64,
}

impl Partial {
    /// Whether the next request is one of the `percent` refused.
    pub(crate) fn refuses(&self, percent: u8) -> bool {
        let p = u64::from(percent.min(100));
        let i = self.seen.fetch_add(1, Ordering::Relaxed);
        (i + 1).wrapping_mul(p) / 100 > i.wrapping_mul(p) / 100
    }
}

#[cfg(test)]
mod tests {
    use super::Partial;

    #[test]
    fn any_run_of_requests_holds_the_share_within_one() {
        for p in [0u8, 1, 7, 25, 33, 50, 99, 100] {
            let partial = Partial::default();
            let refused: Vec<bool> = (0..1000).map(|_| partial.refuses(p)).collect();
            for n in [1usize, 3, 10, 99, 1000] {
                for start in (0..=1000 - n).step_by(37) {
                    let got = refused[start..start + n].iter().filter(|r| **r).count() as f64;
                    let want = n as f64 * f64::from(p) / 100.0;
                    assert!(
                        (got - want).abs() < 1.0,
                        "p {p}, n {n} from {start}: {got} refused"
                    );
                }
            }
            let first: usize = refused.iter().filter(|r| **r).count();
            assert_eq!(first, 10 * usize::from(p), "exact over 1000 requests");
        }
    }
}
