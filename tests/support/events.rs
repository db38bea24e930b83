#![allow(dead_code)]
//! Captures this crate's `tracing` events (target `keyed_rate_limit`) as
//! rendered fields, on the current thread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

pub type Events = Arc<Mutex<Vec<HashMap<String, String>>>>;

struct Capture(Events);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "keyed_rate_limit" {
            return;
        }
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(fields);
    }
}

/// A subscriber that keeps this crate's events in `events`.
pub fn subscriber(events: Events) -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::registry().with(Capture(events))
}

/// Captures on this thread (all of a current-thread `#[tokio::test]`) until
/// the guard drops.
pub fn capture() -> (Events, tracing::subscriber::DefaultGuard) {
    let events = Events::default();
    let guard = tracing::subscriber::set_default(subscriber(events.clone()));
    (events, guard)
}

/// The events whose `message` contains `text`.
pub fn with_message(events: &Events, text: &str) -> Vec<HashMap<String, String>> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.get("message").is_some_and(|m| m.contains(text)))
        .cloned()
        .collect()
}
