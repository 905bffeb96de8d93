//! What `foqs-sim --etcd` counts, over the whole run (a report subtracts two snapshots).

#[derive(Clone, Copy, Default)]
pub(super) struct Counters {
    pub(super) requests: u64,
    pub(super) watch_events: u64,
    pub(super) whole_reads: u64,
    pub(super) double_served: u64,
    /// The operator's writes (a drain's primaries records, added shards' records), also
    /// counted in `requests`.
    pub(super) operator_requests: u64,
    /// Creates that found the key taken (a plan from a view behind etcd's).
    pub(super) creates_taken: u64,
    /// Shards taken by a host (created keys): every hand-over, those undone later in the
    /// same event too.
    pub(super) taken: u64,
    /// Plans made (`Ownership::plan` runs), over all hosts.
    pub(super) plans: u64,
    /// The periodic counts of the range's keys (one per host every `CHECK_POLLS` polls,
    /// whatever happens), also counted in `requests`.
    pub(super) check_requests: u64,
}
