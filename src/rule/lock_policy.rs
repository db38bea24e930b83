//! Who may lock a rule's keys: its lockout, and the control handle
//! ([`Rule::lockout`], [`Rule::blockable`]).

use super::{Lockout, Rule};

/// Whether and how a rule's keys are locked: by its own lockout after
/// repeated denies, or by the control handle when it is blockable. A rule
/// with neither never looks for a lock (ADR 31).
#[derive(Clone, Copy, Default)]
pub(crate) struct LockPolicy {
    pub(crate) lockout: Option<Lockout>,
    pub(crate) blockable: bool,
}

impl LockPolicy {
    /// How long a key's denies count toward its lockout: zero without one.
    pub(crate) fn within(&self) -> std::time::Duration {
        self.lockout.map_or(std::time::Duration::ZERO, |l| l.within)
    }
}

impl Rule {
    /// Locks out keys this rule keeps denying; see [`Lockout`]. Shadow
    /// rules never lock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule, rule::Lockout};
    /// let login = Rule::new("login", KeyExtractor::header("x-user"), Quota::per_minute(5))
    ///     .lockout(Lockout::new(5, Duration::from_secs(60), Duration::from_secs(900)));
    /// assert_eq!(login.get_lockout().map(|l| l.after()), Some(5));
    /// ```
    pub fn lockout(mut self, lockout: Lockout) -> Self {
        self.lock_policy.lockout = Some(lockout);
        self
    }

    /// Lets the [control handle](crate::rate_limit::Control::block) block
    /// this rule's keys (default `false`; a rule with a
    /// [`lockout`](Self::lockout) always can). A rule that cannot be
    /// locked never looks for a lock: on a global rule, one Redis read less
    /// per decision. Blocking a key of a rule that is not blockable is
    /// [`ControlError::NotBlockable`](crate::rate_limit::ControlError::NotBlockable).
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let api = Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(600))
    ///     .blockable(true);
    /// assert!(api.is_blockable());
    /// ```
    pub fn blockable(mut self, blockable: bool) -> Self {
        self.lock_policy.blockable = blockable;
        self
    }
}
