//! Admissions bracketed by Redis `TIME`, and the promise each algorithm
//! makes about them: shared by the exact and the leased invariant tests.
#![allow(dead_code)]

use std::collections::HashMap;

use keyed_rate_limit::{Algorithm, Quota};

pub struct Admit {
    /// Server time (µs) just before and just after the call.
    pub lo: f64,
    pub hi: f64,
    pub cost: u32,
    /// Fixed window: the window's end, from the key's expiry; `None` when
    /// the window had ended before it could be read.
    pub window_end: Option<f64>,
}

pub async fn time_us(c: &mut redis::aio::MultiplexedConnection) -> f64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(c).await.unwrap();
    s as f64 * 1e6 + us as f64
}

/// Whether `admits` keep `algorithm`'s promise for `q`.
pub fn check(algorithm: Algorithm, q: Quota, admits: &[Admit]) -> Result<(), String> {
    let limit = f64::from(q.limit());
    let window = q.window().as_micros() as f64;
    match algorithm {
        Algorithm::Gcra | Algorithm::TokenBucket => {
            let interval = window / limit;
            // By start, each gap taken to the latest end so far: an
            // admission counted between i and j happened by then.
            let mut admits: Vec<&Admit> = admits.iter().collect();
            admits.sort_by(|a, b| a.lo.total_cmp(&b.lo));
            for i in 0..admits.len() {
                let (mut units, mut end) = (0.0, admits[i].hi);
                for j in i..admits.len() {
                    units += f64::from(admits[j].cost);
                    end = end.max(admits[j].hi);
                    let gap = (end - admits[i].lo).max(0.0);
                    let most = f64::from(q.burst()) + gap / interval + 1e-6;
                    if units > most {
                        return Err(format!("{units} units in {gap} µs, at most {most}"));
                    }
                }
            }
        }
        Algorithm::FixedWindow => {
            // Admissions of one window share its end (to the millisecond or so).
            let mut windows: Vec<(f64, f64)> = Vec::new();
            let known: Vec<_> = admits.iter().filter(|a| a.window_end.is_some()).collect();
            // Most admissions must place their window, or nothing is checked.
            if known.len() * 10 < admits.len() * 9 {
                return Err(format!(
                    "{} of {} admissions have no known window",
                    admits.len() - known.len(),
                    admits.len()
                ));
            }
            for a in known {
                let end = a.window_end.unwrap_or_default();
                match windows.iter_mut().find(|(e, _)| (e - end).abs() < 20_000.0) {
                    Some((_, units)) => *units += f64::from(a.cost),
                    None => windows.push((end, f64::from(a.cost))),
                }
            }
            if let Some((end, units)) = windows.iter().find(|(_, u)| *u > limit) {
                return Err(format!("{units} units in the window ending at {end}"));
            }
        }
        _ => {
            let mut per: HashMap<i64, f64> = HashMap::new();
            for a in admits {
                let (from, to) = ((a.lo / window).floor(), (a.hi / window).floor());
                if from == to {
                    *per.entry(from as i64).or_default() += f64::from(a.cost);
                }
            }
            if let Some((idx, units)) = per.iter().find(|(_, u)| **u > limit) {
                return Err(format!("{units} units in aligned window {idx}"));
            }
        }
    }
    Ok(())
}
