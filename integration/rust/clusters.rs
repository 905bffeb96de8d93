//! The tests that run clusters of real `foqsd` processes (static peers, and etcd):
//! ownership, failover, routing. Apart from `suite` so that their timing-sensitive
//! failovers do not share a process's test threads with the rest.

mod common;

mod cluster;
mod cluster_etcd;
mod routing;
mod tier_etcd;
