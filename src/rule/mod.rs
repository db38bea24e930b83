//! Rules: what is limited, by whom and how.

pub mod quota;
