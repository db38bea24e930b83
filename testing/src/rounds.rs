//! Interleaved rounds and their medians, shared by the Redis bench and the
//! HTTP load test.

/// The order of `n` runs in `round`: odd rounds go backwards, so that no run
/// is always first or last while the machine drifts.
pub fn order(round: usize, n: usize) -> Vec<usize> {
    if round.is_multiple_of(2) {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

/// The median of the rounds' results.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
