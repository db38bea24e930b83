//! A layer that asks a remote rate-limit service (Envoy's RLS v3: the
//! `keyed-rls` crate, envoyproxy/ratelimit, or any other) for each
//! request's decision, the way Envoy's `envoy.filters.http.ratelimit`
//! filter does. The service itself is the `keyed-rls` crate.

pub mod client;
