//! The integration tests that can share a process: each module starts its own foqsd
//! (or stores, or processes) per file as before, against real MariaDB and SQLite files.
//! One binary instead of one per file: linking each file's test binary against foqs cost
//! about 100 MB of `target/` and a link step apiece (see docs/testing.md).

mod common;

mod access;
mod api;
mod background;
mod bounds;
mod console;
mod dedup;
mod dlq;
mod docs;
mod edge;
mod faults;
mod hostile;
mod index;
mod leases;
mod longpoll;
mod migrate;
mod outcomes;
mod owner;
mod packaging;
mod prefetch;
mod removal;
mod restart;
mod skew;
mod sqlite;
mod store;
mod transports;
mod wire;
