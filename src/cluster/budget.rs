//! [`EtcdBudget`]: the tier's quota token buckets in etcd, one key per namespace
//! (`P/tokens/<ns>` = `{"tokens":..,"last_ms":..}`, no lease), taken from with
//! compare-and-swap. (Builds before the hosts' watch cache kept them at `P/quota/<ns>`,
//! inside the range every host watches: each take was an event to every host of the
//! cluster. A tier upgraded host by host has both keys for a while, so a namespace may
//! be admitted up to twice its rate until every host runs the new build.)

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::clock::SharedClock;
use crate::quota::{refilled, QuotaBudget, Rate};

#[derive(Debug, Serialize, Deserialize)]
struct BucketRecord {
    tokens: f64,
    last_ms: i64,
}

/// The tier's quota token buckets, one etcd key per namespace, taken from with
/// compare-and-swap (see [`crate::quota`] for the algorithm and its bounds).
pub struct EtcdBudget {
    client: Client,
    prefix: String,
    clock: SharedClock,
}

/// Compare-and-swap attempts before a take gives up (and admits nothing this time).
const BUDGET_ATTEMPTS_MAX: usize = 8;

impl EtcdBudget {
    pub fn new(client: Client, prefix: &str, clock: SharedClock) -> EtcdBudget {
        EtcdBudget {
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
            clock,
        }
    }

    async fn try_take(&self, ns: &str, rate: Rate, want: u64) -> Result<u64, String> {
        let mut client = self.client.clone();
        let key = format!("{}/tokens/{ns}", self.prefix);
        for _ in 0..BUDGET_ATTEMPTS_MAX {
            let now = self.clock.now_ms();
            let resp = client
                .get(key.clone(), None)
                .await
                .map_err(|e| e.to_string())?;
            let (bucket, guard) = match resp.kvs().first() {
                Some(kv) => (
                    serde_json::from_slice::<BucketRecord>(kv.value())
                        .map_err(|e| e.to_string())?,
                    Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision()),
                ),
                None => (
                    BucketRecord {
                        tokens: rate.burst(),
                        last_ms: now,
                    },
                    Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                ),
            };
            let tokens = refilled(bucket.tokens, bucket.last_ms, now, rate);
            let got = (tokens.floor() as u64).min(want);
            if got == 0 {
                // Nothing to take: no write (the refill is worked out from `last_ms` the
                // same way next time), so that hosts asking an empty bucket cost etcd
                // reads only.
                return Ok(0);
            }
            let next = BucketRecord {
                tokens: tokens - got as f64,
                last_ms: now.max(bucket.last_ms),
            };
            let txn = Txn::new().when([guard]).and_then([TxnOp::put(
                key.clone(),
                serde_json::to_vec(&next).expect("serializable"),
                None,
            )]);
            if client
                .txn(txn)
                .await
                .map_err(|e| e.to_string())?
                .succeeded()
            {
                return Ok(got);
            }
        }
        Err("too much contention on the quota key".into())
    }
}

impl QuotaBudget for EtcdBudget {
    fn take(&self, ns: &str, rate: Rate, want: u64) -> BoxFuture<'_, u64> {
        let ns = ns.to_string();
        Box::pin(async move {
            match self.try_take(&ns, rate, want).await {
                Ok(n) => n,
                // Quota unknown: refuse (retryably) rather than admit without a limit.
                Err(e) => {
                    tracing::warn!(ns, error = %e, "quota budget unavailable");
                    0
                }
            }
        })
    }
}
