//! The tests that arm failpoints inside this process (`fail::cfg`, named after shards:
//! `shard-0-turn`): they would reach any in-process host of another test, so they get a
//! process of their own, and `fail::FailScenario` runs them one at a time.

mod common;

mod handoff;
mod simulation;
mod worker_death;
