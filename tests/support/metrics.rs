//! A process-wide `metrics` recorder for tests that assert on counters.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

type Labels = Vec<(String, String)>;
type Totals = HashMap<(String, Labels), u64>;

/// What the snapshots added up to: counter totals, the last gauge values,
/// and how many samples each histogram got.
#[derive(Default)]
struct Seen {
    counters: Totals,
    gauges: HashMap<(String, Labels), f64>,
    samples: Totals,
}

/// Installs the recorder (once per test binary); call it before anything
/// is counted, since counts made without a recorder are lost.
pub fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let s = recorder.snapshotter();
        recorder.install().expect("one recorder per test binary");
        s
    })
}

/// A snapshot drains the recorder and tests run in parallel, so every
/// snapshot is added up here.
fn seen() -> MutexGuard<'static, Seen> {
    static SEEN: OnceLock<Mutex<Seen>> = OnceLock::new();
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap();
    for (k, _, _, v) in snapshotter().snapshot().into_vec() {
        let key = k.key();
        let labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        let id = (key.name().to_owned(), labels);
        match v {
            DebugValue::Counter(c) => *seen.counters.entry(id).or_default() += c,
            DebugValue::Gauge(g) => {
                seen.gauges.insert(id, g.into_inner());
            }
            DebugValue::Histogram(h) => *seen.samples.entry(id).or_default() += h.len() as u64,
        }
    }
    seen
}

fn matches((n, labels): &(String, Labels), name: &str, with: &[(&str, &str)]) -> bool {
    n == name
        && with
            .iter()
            .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
}

/// The last value of the gauge `name{rule}`.
pub fn gauge(name: &str, rule: &str) -> Option<f64> {
    let seen = seen();
    let found = seen
        .gauges
        .iter()
        .find(|(id, _)| matches(id, name, &[("rule", rule)]));
    found.map(|(_, g)| *g)
}

/// How many samples the histogram `name{rule}` received.
pub fn samples(name: &str, rule: &str) -> u64 {
    let seen = seen();
    let all = seen
        .samples
        .iter()
        .filter(|(id, _)| matches(id, name, &[("rule", rule)]));
    all.map(|(_, n)| *n).sum()
}

/// The sum of `name` counters whose labels include every `(key, value)` in `with`.
pub fn counter_with(name: &str, with: &[(&str, &str)]) -> u64 {
    let seen = seen();
    let all = seen
        .counters
        .iter()
        .filter(|(id, _)| matches(id, name, with));
    all.map(|(_, c)| *c).sum()
}

/// `name{rule, outcome}`; an empty outcome matches any.
pub fn counter(name: &str, rule: &str, outcome: &str) -> u64 {
    if outcome.is_empty() {
        counter_with(name, &[("rule", rule)])
    } else {
        counter_with(name, &[("rule", rule), ("outcome", outcome)])
    }
}
