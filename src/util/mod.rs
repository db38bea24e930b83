//! Small helpers the layers share: a clock read that tolerates a far
//! future, a value that is ready now or later, a log throttle, and the
//! formatting of lists in messages.

pub(crate) mod instant;
pub(crate) mod now_or_later;
pub(crate) mod report;
pub(crate) mod throttle;
#[cfg(test)]
pub(crate) mod warns;
