//! `n` operations spread over `callers` tasks that take the next index
//! until none is left: the load shape of the Redis measurement programs.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Runs `op(i)` for every `i` in `0..n` on `callers` tasks; operations per
/// second. `op` is cloned into each task.
pub async fn per_second<F, Fut>(n: usize, callers: usize, op: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (next, op) = (next.clone(), op.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    op(i).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    n as f64 / start.elapsed().as_secs_f64()
}
