//! What the console changes, through the host's own calls under the console's caller:
//! a test enqueue, the requeue of dead letters (by id, or a topic's all), and a purge,
//! which the pages and the JSON API both make here, under one confirmation rule.

use super::Console;
use crate::core::EnqueueRequestItem;
use crate::error::{Error, Result};
use crate::model::Progress;

impl Console {
    /// Enqueues one item as a client would (the namespace's defaults apply); its id.
    pub async fn enqueue_test(
        &self,
        ns: &str,
        topic: &str,
        payload: Vec<u8>,
        priority: i32,
        delay_ms: i64,
    ) -> Result<String> {
        let now = self.host.clock_ms();
        let item = EnqueueRequestItem {
            ns: ns.to_string(),
            topic: topic.to_string(),
            priority,
            payload,
            deliver_after_ms: (delay_ms > 0).then(|| now.saturating_add(delay_ms)),
            ..Default::default()
        };
        let mut out = self
            .host
            .enqueue(&self.caller, vec![item], (None, None), None)
            .await?;
        match out.pop() {
            Some(Ok((id, _))) => Ok(id.to_string()),
            Some(Err(e)) => Err(e),
            None => Err(Error::new(
                crate::error::ErrorCode::Internal,
                "the enqueue returned no outcome",
            )),
        }
    }

    /// Makes dead items ready again; the ids that failed, with why (a call that failed
    /// as a whole, e.g. a bad batch, is the error).
    pub async fn dlq_requeue(&self, ids: &[String]) -> Result<Vec<(String, Error)>> {
        let out = self
            .host
            .dlq_requeue(&self.caller, ids.to_vec(), (None, None), None)
            .await?;
        Ok(ids
            .iter()
            .zip(out)
            .filter_map(|(id, r)| r.err().map(|e| (id.clone(), e)))
            .collect())
    }

    /// Makes every dead item of a topic ready again (over the tier, within the host's
    /// bound for a call: `more` when some are left).
    pub async fn dlq_requeue_all(&self, ns: &str, topic: &str) -> Result<Progress> {
        self.host
            .dlq_requeue_all(&self.caller, ns, topic, None, false)
            .await
    }

    /// Deletes a topic's dead items, only when `confirm` is the topic's name.
    pub async fn dlq_purge(&self, ns: &str, topic: &str, confirm: &str) -> Result<Progress> {
        if confirm != topic {
            return Err(Error::invalid(
                "Nothing was deleted: type the topic's exact name to confirm a purge.",
            ));
        }
        self.host.dlq_purge(&self.caller, ns, topic, false).await
    }
}
