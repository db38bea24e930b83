//! Every Rust code block of README.md and docs/*.md, verbatim, one module
//! each (see build.rs). Nothing here is run: it has to compile with only
//! what an axum app depends on, as the blocks are shown.
#![allow(unused, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/snippets.rs"));
