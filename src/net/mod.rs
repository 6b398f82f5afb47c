//! Sandbox networking. For now each sandbox gets its own network namespace
//! with loopback only; the egress policy, proxy and DNS arrive later.

pub mod netns;
