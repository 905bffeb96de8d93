//! Namespaces in the configuration: `[defaults]`, `[[namespaces]]`, their checks, and the
//! lookup of a namespace's effective settings.

use std::collections::HashMap;

use serde::Deserialize;

use super::{Config, LEASE_MS_DEFAULT, MAX_ATTEMPTS_DEFAULT};
use crate::cluster::config::{self as cluster_config, TIER_DEFAULT};
use crate::model::{Policy, ShardId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyName {
    AtLeastOnce,
    AtMostOnce,
}

impl From<PolicyName> for Policy {
    fn from(p: PolicyName) -> Policy {
        match p {
            PolicyName::AtLeastOnce => Policy::AtLeastOnce,
            PolicyName::AtMostOnce => Policy::AtMostOnce,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceDefaults {
    pub lease_ms: i64,
    /// Absent: items live until acked.
    pub ttl_ms: Option<i64>,
    pub policy: PolicyName,
    pub max_attempts: i32,
    /// The tier serving namespaces that name none.
    pub tier: String,
    /// Guaranteed (and enforced) enqueues per minute across the tier; absent: no limit.
    pub enqueues_per_minute: Option<u64>,
    /// How much of its rate a namespace's quota bucket holds, in ms of the rate: what a
    /// producer may send at once after being idle or held up (see `crate::quota`).
    pub quota_burst_ms: u64,
    /// Topics with items a namespace may have on one shard: an enqueue that would start
    /// another there is refused (a client creating topics without end grew every shard's
    /// topic table and every per-topic structure for ever).
    pub topics_max: u64,
}

/// `defaults.topics_max`'s default.
pub const TOPICS_MAX_DEFAULT: u64 = 100_000;

impl Default for NamespaceDefaults {
    fn default() -> Self {
        NamespaceDefaults {
            lease_ms: LEASE_MS_DEFAULT,
            ttl_ms: None,
            policy: PolicyName::AtLeastOnce,
            max_attempts: MAX_ATTEMPTS_DEFAULT,
            tier: TIER_DEFAULT.to_string(),
            enqueues_per_minute: None,
            quota_burst_ms: crate::quota::BURST_MS_DEFAULT,
            topics_max: TOPICS_MAX_DEFAULT,
        }
    }
}

/// A listed namespace; absent settings come from `[defaults]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    pub name: String,
    pub lease_ms: Option<i64>,
    pub ttl_ms: Option<i64>,
    pub policy: Option<PolicyName>,
    pub max_attempts: Option<i32>,
    pub tier: Option<String>,
    pub enqueues_per_minute: Option<u64>,
    pub quota_burst_ms: Option<u64>,
    /// Overrides `engine.dlq_max_items_per_topic` for this namespace (0: unbounded).
    pub dlq_max_items_per_topic: Option<u64>,
    pub topics_max: Option<u64>,
}

/// The effective settings of one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespacePolicy {
    pub lease_ms: i64,
    pub ttl_ms: Option<i64>,
    pub policy: Policy,
    pub max_attempts: i32,
    /// Enqueues per minute across the namespace's tier; `None`: no limit.
    pub enqueues_per_minute: Option<u64>,
    /// The quota bucket's size, in ms of the rate.
    pub quota_burst_ms: u64,
    /// Topics with items the namespace may have on one shard.
    pub topics_max: u64,
}

impl NamespacePolicy {
    /// The namespace's quota, if it has one.
    pub fn quota(&self) -> Option<crate::quota::Rate> {
        self.enqueues_per_minute
            .map(|per_minute| crate::quota::Rate {
                per_minute,
                burst_ms: self.quota_burst_ms,
            })
    }
}

/// The namespace sections' problems, added to `problems`.
pub(super) fn check(cfg: &Config, problems: &mut Vec<String>) {
    check_policy(
        "defaults",
        Some(cfg.defaults.lease_ms),
        cfg.defaults.ttl_ms,
        Some(cfg.defaults.max_attempts),
        problems,
    );
    let mut names = HashMap::new();
    for ns in &cfg.namespaces {
        if ns.name.is_empty() || ns.name.len() > 255 {
            problems.push(format!(
                "namespace {:?}: name must be 1..=255 bytes",
                ns.name
            ));
        }
        if names.insert(ns.name.as_str(), ()).is_some() {
            problems.push(format!("namespace {:?} is listed twice", ns.name));
        }
        check_policy(
            &format!("namespace {:?}", ns.name),
            ns.lease_ms,
            ns.ttl_ms,
            ns.max_attempts,
            problems,
        );
    }
    let shard_ids: Vec<ShardId> = cfg.shards.iter().map(|s| s.id).collect();
    let tiers = cluster_config::tier_shards(&cfg.tiers, &shard_ids);
    let named = std::iter::once(("defaults".to_string(), &cfg.defaults.tier)).chain(
        cfg.namespaces
            .iter()
            .filter_map(|n| Some((format!("namespace {:?}", n.name), n.tier.as_ref()?))),
    );
    for (what, tier) in named {
        if !tiers.contains_key(tier) {
            problems.push(format!("{what}: tier {tier:?} is not a tier"));
        }
    }
    let d = &cfg.defaults;
    let quotas = std::iter::once((
        "defaults".to_string(),
        d.enqueues_per_minute,
        Some(d.quota_burst_ms),
    ))
    .chain(cfg.namespaces.iter().map(|n| {
        (
            format!("namespace {:?}", n.name),
            n.enqueues_per_minute,
            n.quota_burst_ms,
        )
    }));
    let topics_max = std::iter::once(("defaults".to_string(), Some(d.topics_max))).chain(
        cfg.namespaces
            .iter()
            .map(|n| (format!("namespace {:?}", n.name), n.topics_max)),
    );
    for (what, max) in topics_max {
        if max == Some(0) {
            problems.push(format!("{what}: topics_max must be > 0"));
        }
    }
    for (what, q, b) in quotas {
        if q == Some(0) {
            problems.push(format!(
                "{what}: enqueues_per_minute must be > 0 (leave it out for no limit)"
            ));
        }
        if b.is_some_and(|b| !(1..=crate::quota::BURST_MS_MAX).contains(&b)) {
            problems.push(format!(
                "{what}: quota_burst_ms must be between 1 and {} (ms of the rate the \
                     quota bucket holds)",
                crate::quota::BURST_MS_MAX
            ));
        }
    }
}

fn check_policy(
    what: &str,
    lease_ms: Option<i64>,
    ttl_ms: Option<i64>,
    max_attempts: Option<i32>,
    problems: &mut Vec<String>,
) {
    if lease_ms.is_some_and(|v| v <= 0) {
        problems.push(format!("{what}: lease_ms must be > 0"));
    }
    if ttl_ms.is_some_and(|v| v <= 0) {
        problems.push(format!(
            "{what}: ttl_ms must be > 0 (leave it out for no TTL)"
        ));
    }
    if max_attempts.is_some_and(|v| v <= 0) {
        problems.push(format!("{what}: max_attempts must be > 0"));
    }
}

/// Namespace lookup: listed namespaces with their overrides, or any name with the defaults
/// when none are listed.
#[derive(Debug, Clone)]
pub struct Namespaces {
    defaults: NamespacePolicy,
    listed: HashMap<String, NamespacePolicy>,
    default_tier: String,
    tiers: HashMap<String, String>,
}

impl Namespaces {
    pub fn from_config(cfg: &Config) -> Namespaces {
        let d = &cfg.defaults;
        let defaults = NamespacePolicy {
            lease_ms: d.lease_ms,
            ttl_ms: d.ttl_ms,
            policy: d.policy.into(),
            max_attempts: d.max_attempts,
            enqueues_per_minute: d.enqueues_per_minute,
            quota_burst_ms: d.quota_burst_ms,
            topics_max: d.topics_max,
        };
        let listed = cfg
            .namespaces
            .iter()
            .map(|n| {
                let p = NamespacePolicy {
                    lease_ms: n.lease_ms.unwrap_or(defaults.lease_ms),
                    ttl_ms: n.ttl_ms.or(defaults.ttl_ms),
                    policy: n.policy.map(Policy::from).unwrap_or(defaults.policy),
                    max_attempts: n.max_attempts.unwrap_or(defaults.max_attempts),
                    enqueues_per_minute: n.enqueues_per_minute.or(defaults.enqueues_per_minute),
                    quota_burst_ms: n.quota_burst_ms.unwrap_or(defaults.quota_burst_ms),
                    topics_max: n.topics_max.unwrap_or(defaults.topics_max),
                };
                (n.name.clone(), p)
            })
            .collect();
        let tiers = cfg
            .namespaces
            .iter()
            .filter_map(|n| Some((n.name.clone(), n.tier.clone()?)))
            .collect();
        Namespaces {
            defaults,
            listed,
            default_tier: d.tier.clone(),
            tiers,
        }
    }

    /// The tier that serves `ns`.
    pub fn tier(&self, ns: &str) -> &str {
        self.tiers.get(ns).unwrap_or(&self.default_tier)
    }

    /// The listed namespaces (none: any name is accepted).
    pub fn listed(&self) -> impl Iterator<Item = &str> {
        self.listed.keys().map(String::as_str)
    }

    /// `None` when namespaces are listed and `ns` is not one of them.
    pub fn get(&self, ns: &str) -> Option<NamespacePolicy> {
        if self.listed.is_empty() {
            Some(self.defaults)
        } else {
            self.listed.get(ns).copied()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_namespaces_are_case_sensitive_and_exclusive() {
        let cfg = Config::from_toml(
            r#"
            [[shards]]
            id = 0
            url = "mysql://root@127.0.0.1:3306/x"
            [defaults]
            lease_ms = 1000
            [[namespaces]]
            name = "Orders"
            max_attempts = 2
            "#,
        )
        .unwrap();
        let ns = Namespaces::from_config(&cfg);
        let p = ns.get("Orders").unwrap();
        assert_eq!(
            (p.lease_ms, p.max_attempts, p.policy),
            (1000, 2, Policy::AtLeastOnce)
        );
        assert!(ns.get("orders").is_none());
    }

    #[test]
    fn no_listed_namespaces_accepts_any_name() {
        let cfg =
            Config::from_toml("[[shards]]\nid = 0\nurl = \"mysql://root@127.0.0.1/x\"\n").unwrap();
        let p = Namespaces::from_config(&cfg).get("anything").unwrap();
        assert_eq!(p.lease_ms, LEASE_MS_DEFAULT);
        assert_eq!(p.max_attempts, MAX_ATTEMPTS_DEFAULT);
        assert_eq!(p.ttl_ms, None);
    }
}
