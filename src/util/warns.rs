//! The crate's unit tests' count of WARN events on the current thread.

use std::sync::{Arc, Mutex};

use tracing_subscriber::layer::SubscriberExt;

struct Warns(Arc<Mutex<usize>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warns {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *e.metadata().level() == tracing::Level::WARN {
            *self.0.lock().unwrap() += 1;
        }
    }
}

/// Counts WARN events on this thread until the guard drops.
pub(crate) fn counted() -> (Arc<Mutex<usize>>, tracing::subscriber::DefaultGuard) {
    let warns = Arc::new(Mutex::new(0));
    let subscriber = tracing_subscriber::registry().with(Warns(warns.clone()));
    (warns, tracing::subscriber::set_default(subscriber))
}
