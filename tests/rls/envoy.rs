//! Envoy 1.40 in front of an axum upstream.
