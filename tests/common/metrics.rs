//! A process-wide `metrics` recorder for tests that assert on counters.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

type Labels = Vec<(String, String)>;
type Totals = HashMap<(String, Labels), u64>;

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

/// Counter totals by (name, labels). A snapshot drains the recorder and
/// tests run in parallel, so every snapshot is added up here.
fn totals() -> MutexGuard<'static, Totals> {
    static TOTALS: OnceLock<Mutex<Totals>> = OnceLock::new();
    let mut totals = TOTALS.get_or_init(Default::default).lock().unwrap();
    for (k, _, _, v) in snapshotter().snapshot().into_vec() {
        if let DebugValue::Counter(c) = v {
            let key = k.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            *totals.entry((key.name().to_owned(), labels)).or_default() += c;
        }
    }
    totals
}

/// The sum of `name` counters whose labels include every `(key, value)` in `with`.
pub fn counter_with(name: &str, with: &[(&str, &str)]) -> u64 {
    totals()
        .iter()
        .filter(|((n, labels), _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, c)| *c)
        .sum()
}

/// `name{rule, outcome}`; an empty outcome matches any.
pub fn counter(name: &str, rule: &str, outcome: &str) -> u64 {
    if outcome.is_empty() {
        counter_with(name, &[("rule", rule)])
    } else {
        counter_with(name, &[("rule", rule), ("outcome", outcome)])
    }
}
