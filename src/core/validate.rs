//! Request validation: the limits of the API, and the resolution of an enqueued item's
//! optional fields against its namespace's defaults.

use super::api::EnqueueRequestItem;
use crate::config::NamespacePolicy;
use crate::error::{Error, ErrorCode, Result};
use crate::model::{NewItem, Policy};

/// The API's limits; documented in docs/api.md.
pub mod limits {
    pub const NAME_BYTES_MAX: usize = 255;
    pub const PAYLOAD_BYTES_MAX: usize = 10_240;
    pub const METADATA_BYTES_MAX: usize = 4_096;
    pub const ITEMS_PER_REQUEST_MAX: usize = 1_000;
    /// The most bytes one item takes in a reply: its payload, metadata, names, id and the
    /// fixed fields, with room for the encoding's field headers.
    pub const ITEM_WIRE_BYTES_MAX: usize =
        PAYLOAD_BYTES_MAX + METADATA_BYTES_MAX + 2 * NAME_BYTES_MAX + 256;
    pub const DEQUEUE_COUNT_MAX: i32 = 1_000;
    pub const TOPICS_PER_DEQUEUE_MAX: usize = 100;
    pub const DLQ_PAGE_DEFAULT: i32 = 100;
    pub const DLQ_PAGE_MAX: i32 = 1_000;
    /// Dead items requeued or purged per shard worker turn.
    pub const DLQ_BATCH: usize = 1_000;
    /// Longest long poll.
    pub const WAIT_MS_MAX: i64 = 30_000;
    pub const ACTIVE_TOPICS_LIMIT_DEFAULT: i32 = 1_000;
    pub const ACTIVE_TOPICS_LIMIT_MAX: i32 = 10_000;
    /// Longest lease, TTL or nack delay: far beyond any real use, and small enough that
    /// `now + duration` can never overflow a BIGINT.
    pub const DURATION_MS_MAX: i64 = 100 * 365 * 24 * 3600 * 1000;
}

pub fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > limits::NAME_BYTES_MAX {
        return Err(Error::invalid(format!(
            "{what} must be 1..={} bytes, got {}",
            limits::NAME_BYTES_MAX,
            name.len()
        )));
    }
    Ok(())
}

pub fn check_duration(what: &str, ms: i64) -> Result<()> {
    if !(0..=limits::DURATION_MS_MAX).contains(&ms) {
        return Err(Error::invalid(format!(
            "{what} must be in 0..={} ms, got {ms}",
            limits::DURATION_MS_MAX
        )));
    }
    Ok(())
}

fn check_positive_duration(what: &str, ms: i64) -> Result<()> {
    check_duration(what, ms)?;
    if ms == 0 {
        return Err(Error::invalid(format!(
            "{what} must be > 0 (leave it out for the namespace default)"
        )));
    }
    Ok(())
}

/// Checks one item and applies its namespace's defaults. `ns_policy` is `None` when the
/// namespace is not configured.
pub fn validate_item(
    it: EnqueueRequestItem,
    ns_policy: Option<NamespacePolicy>,
    now_ms: i64,
) -> Result<NewItem> {
    check_name("ns", &it.ns)?;
    check_name("topic", &it.topic)?;
    if it.payload.len() > limits::PAYLOAD_BYTES_MAX {
        return Err(Error::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "payload is {} bytes; at most {}",
                it.payload.len(),
                limits::PAYLOAD_BYTES_MAX
            ),
        ));
    }
    let metadata = it.metadata.unwrap_or_default();
    if metadata.len() > limits::METADATA_BYTES_MAX {
        return Err(Error::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "metadata is {} bytes; at most {}",
                metadata.len(),
                limits::METADATA_BYTES_MAX
            ),
        ));
    }
    // Zero is refused too: a zero lease or TTL would expire the item the moment it is
    // delivered or enqueued, and Thrift clients whose generated defaults fill optional
    // numbers with 0 (the Rust generator's `Default` does) would lose items silently.
    if let Some(l) = it.lease_ms {
        check_positive_duration("lease_ms", l)?;
    }
    if let Some(t) = it.ttl_ms {
        check_positive_duration("ttl_ms", t)?;
    }
    let policy = match it.policy {
        None => None,
        Some(p) => Some(
            Policy::from_i32(p)
                .ok_or_else(|| Error::invalid(format!("unknown delivery policy {p}")))?,
        ),
    };
    if let Some(m) = it.max_attempts {
        if m <= 0 {
            return Err(Error::invalid(format!("max_attempts must be > 0, got {m}")));
        }
    }
    if let Some(k) = &it.dedup_key {
        check_name("dedup_key", k)?;
    }
    let deliver_after_ms = it.deliver_after_ms.unwrap_or(now_ms);
    if !(0..=i64::MAX / 2).contains(&deliver_after_ms) {
        return Err(Error::invalid(format!(
            "deliver_after_ms {deliver_after_ms} is not a plausible time"
        )));
    }
    let ns = ns_policy.ok_or_else(|| {
        Error::new(
            ErrorCode::UnknownNamespace,
            format!("unknown namespace {:?}", it.ns),
        )
    })?;
    let ttl_ms = it.ttl_ms.or(ns.ttl_ms);
    Ok(NewItem {
        ns: it.ns,
        topic: it.topic,
        priority: it.priority,
        payload: it.payload,
        metadata,
        deliver_after_ms,
        enqueued_at_ms: now_ms,
        lease_ms: it.lease_ms.unwrap_or(ns.lease_ms),
        expires_at_ms: ttl_ms.map(|t| now_ms.saturating_add(t)),
        policy: policy.unwrap_or(ns.policy),
        max_attempts: it.max_attempts.unwrap_or(ns.max_attempts),
        dedup_key: it.dedup_key,
    })
}

/// A checked item as a request again, with every default resolved, to forward it to a
/// peer. Its TTL counts from `now_ms` (the original enqueue time on this host).
pub fn as_request(n: NewItem, now_ms: i64) -> EnqueueRequestItem {
    EnqueueRequestItem {
        ns: n.ns,
        topic: n.topic,
        priority: n.priority,
        payload: n.payload,
        metadata: Some(n.metadata),
        deliver_after_ms: Some(n.deliver_after_ms),
        lease_ms: Some(n.lease_ms),
        ttl_ms: n.expires_at_ms.map(|e| (e - now_ms).max(1)),
        policy: Some(n.policy as i32),
        max_attempts: Some(n.max_attempts),
        dedup_key: n.dedup_key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: NamespacePolicy = NamespacePolicy {
        lease_ms: 30_000,
        ttl_ms: None,
        policy: Policy::AtLeastOnce,
        max_attempts: 5,
        enqueues_per_minute: None,
        quota_burst_ms: crate::quota::BURST_MS_DEFAULT,
        topics_max: 100,
    };

    fn item() -> EnqueueRequestItem {
        EnqueueRequestItem {
            ns: "ns".into(),
            topic: "t".into(),
            payload: b"x".to_vec(),
            ..Default::default()
        }
    }

    fn code(it: EnqueueRequestItem) -> ErrorCode {
        validate_item(it, Some(NS), 1000).unwrap_err().code
    }

    #[test]
    fn defaults_come_from_the_namespace() {
        let n = validate_item(item(), Some(NS), 1000).unwrap();
        assert_eq!(
            (n.deliver_after_ms, n.enqueued_at_ms, n.lease_ms),
            (1000, 1000, 30_000)
        );
        assert_eq!(
            (n.expires_at_ms, n.policy, n.max_attempts),
            (None, Policy::AtLeastOnce, 5)
        );
        assert!(n.metadata.is_empty());
        let n = validate_item(
            EnqueueRequestItem {
                ttl_ms: Some(50),
                policy: Some(2),
                max_attempts: Some(1),
                lease_ms: Some(1),
                ..item()
            },
            Some(NS),
            1000,
        )
        .unwrap();
        assert_eq!(
            (n.expires_at_ms, n.policy, n.max_attempts, n.lease_ms),
            (Some(1050), Policy::AtMostOnce, 1, 1)
        );
    }

    #[test]
    fn bad_fields_are_rejected_with_the_right_code() {
        use ErrorCode::*;
        assert_eq!(
            code(EnqueueRequestItem {
                ns: "".into(),
                ..item()
            }),
            InvalidArgument
        );
        assert_eq!(
            code(EnqueueRequestItem {
                topic: "x".repeat(256),
                ..item()
            }),
            InvalidArgument
        );
        assert_eq!(
            code(EnqueueRequestItem {
                lease_ms: Some(-1),
                ..item()
            }),
            InvalidArgument
        );
        assert_eq!(
            code(EnqueueRequestItem {
                ttl_ms: Some(-1),
                ..item()
            }),
            InvalidArgument
        );
        assert_eq!(
            code(EnqueueRequestItem {
                ttl_ms: Some(0),
                ..item()
            }),
            InvalidArgument
        );
        assert_eq!(
            code(EnqueueRequestItem {
                lease_ms: Some(0),
                ..item()
            }),
            InvalidArgument
        );
        assert_eq!(
            code(EnqueueRequestItem {
                policy: Some(3),
                ..item()
            }),
            InvalidArgument
        );
        assert_eq!(
            code(EnqueueRequestItem {
                max_attempts: Some(0),
                ..item()
            }),
            InvalidArgument
        );
        assert_eq!(
            code(EnqueueRequestItem {
                payload: vec![0; 10_241],
                ..item()
            }),
            PayloadTooLarge
        );
        assert_eq!(
            code(EnqueueRequestItem {
                metadata: Some(vec![0; 4_097]),
                ..item()
            }),
            PayloadTooLarge
        );
        assert_eq!(
            validate_item(item(), None, 0).unwrap_err().code,
            UnknownNamespace
        );
    }

    #[test]
    fn limits_are_inclusive() {
        let ok = EnqueueRequestItem {
            topic: "t".repeat(255),
            payload: vec![0; 10_240],
            metadata: Some(vec![0; 4_096]),
            ..item()
        };
        assert!(validate_item(ok, Some(NS), 0).is_ok());
    }
}
