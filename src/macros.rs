//! The accessors every middleware service has, as tower-http writes them.

/// `get_ref`, `get_mut` and `into_inner` for a service whose wrapped
/// service `S` is at `self.<path>`.
macro_rules! inner_service_accessors {
    ($($field:ident).+) => {
        /// The wrapped service.
        pub fn get_ref(&self) -> &S {
            &self.$($field).+
        }

        /// The wrapped service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.$($field).+
        }

        /// Unwraps the inner service.
        pub fn into_inner(self) -> S {
            self.$($field).+
        }
    };
}
