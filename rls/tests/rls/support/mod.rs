//! The library's test helpers this suite shares (tests/support at the
//! workspace's root), the ones that need none of the library's features.
#![allow(dead_code)]

#[path = "../../../../tests/support/backend.rs"]
mod backend;
#[path = "../../../../tests/support/events.rs"]
pub mod events;
#[path = "../../../../tests/support/promtool.rs"]
pub mod promtool;
#[path = "../../../../tests/support/web.rs"]
mod web;

pub use backend::Backend;
pub use web::{client, header, ok_app, serve};
