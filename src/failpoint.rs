//! Named failpoints for tests (TiKV's `fail` crate), set from the `FAILPOINTS` variable:
//! compiled to nothing unless the `failpoints` feature is on, which only the test build
//! turns on. A test stops a foqsd at a chosen point ([`pause`]) and kills it there, or makes
//! a step fail ([`fires`]).

/// The pause the failpoint `name` asks for (its `return(MS)` action): unlike the `sleep`
/// action it leaves the runtime's threads free, so the rest of the host (a connection
/// closing, a lease renewed) goes on meanwhile.
#[cfg(feature = "failpoints")]
pub async fn pause(name: &str) {
    let pause = || -> Option<u64> {
        fail::fail_point!(name, |v| v.and_then(|s| s.parse().ok()));
        None
    };
    if let Some(ms) = pause() {
        tracing::warn!(failpoint = name, ms, "paused at a failpoint");
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

#[cfg(not(feature = "failpoints"))]
pub async fn pause(_name: &str) {}

/// Whether the failpoint `name` is set to `return`: the caller then fails its step.
#[cfg(feature = "failpoints")]
pub fn fires(name: &str) -> bool {
    let fired = || -> bool {
        fail::fail_point!(name, |_| true);
        false
    };
    fired()
}

#[cfg(not(feature = "failpoints"))]
pub fn fires(_name: &str) -> bool {
    false
}
