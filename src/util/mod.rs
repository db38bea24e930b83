//! Small helpers the layers share: a clock read that tolerates a far
//! future, a value that is ready now or later, a log throttle, and the
//! `Debug` of the crate's errors (their `Display`, then each source).

pub(crate) mod instant;
pub(crate) mod now_or_later;
pub(crate) mod report;
pub(crate) mod throttle;
#[cfg(test)]
pub(crate) mod warns;
