#![allow(unreachable_pub, missing_docs)]
//! Integration tests: real TLS and real HTTP on loopback, certificates generated here.

mod auth;
mod body_rules;
mod claims;
mod cluster;
mod cluster_replay;
mod conn_slots;
mod demo;
mod embedded;
mod enforcement;
mod envelope;
mod faults;
mod fleet_metrics;
mod forward;
mod layout;
mod ops;
mod policy;
mod quota_eviction;
mod reload;
mod revocation;
mod sdk;
mod streams;
mod support;
mod timeouts;
mod upstream;
mod v2;
