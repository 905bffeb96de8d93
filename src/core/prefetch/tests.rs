use super::*;

const CFG: PrefetchConfig = PrefetchConfig {
    window_ms: 100,
    items_max: 1000,
    stage_max_ms: 1000,
};

fn topic() -> TopicName {
    TopicName {
        ns: "n".into(),
        topic: "t".into(),
    }
}

fn item(key: u64, priority: i32, lease_expires_ms: i64) -> Item {
    Item {
        priority,
        lease_expires_ms,
        lease_ms: lease_expires_ms,
        lease_token: 1,
        ..Item::for_test(key)
    }
}

#[test]
fn an_idle_topic_stages_nothing_ahead() {
    let p = Prefetch::new(CFG);
    let t = p.take(&topic(), 10, 0);
    assert!(t.items.is_empty());
    assert_eq!(t.ahead, 0, "10 items/s * 100 ms rounds down to nothing");
}

#[test]
fn a_busy_topic_stages_about_one_window_of_its_rate() {
    let p = Prefetch::new(CFG);
    // 100 items every 10 ms for 3 s: 10k items/s.
    let mut ahead = 0;
    for i in 0..300 {
        ahead = p.take(&topic(), 100, i * 10).ahead;
    }
    assert!(
        (800..=1000).contains(&ahead),
        "about 10k/s * 100 ms, got {ahead}"
    );
}

#[test]
fn staged_items_come_out_in_order_and_unfit_ones_are_released() {
    let p = Prefetch::new(CFG);
    // Staged at t=0 with a 30 s lease; one with a 100 ms lease.
    let refused = p.stage(
        &topic(),
        vec![item(3, 5, 30_000), item(1, 9, 30_000), item(2, 1, 100)],
        0,
    );
    assert!(refused.is_empty());
    let t = p.take(&topic(), 2, 60);
    let keys: Vec<u64> = t.items.iter().map(|i| i.id.key).collect();
    assert_eq!(keys, vec![3, 1], "key 2 has less than half its lease left");
    assert_eq!(
        t.release.iter().map(|i| i.id.key).collect::<Vec<_>>(),
        vec![2]
    );
    // Aged out: released by the sweep.
    let _ = p.stage(&topic(), vec![item(4, 0, 30_000)], 100);
    let (_, release) = p.sweep(1_101, |_| true);
    assert_eq!(
        release.iter().map(|i| i.id.key).collect::<Vec<_>>(),
        vec![4]
    );
}

#[test]
fn expired_ttl_is_never_handed_out() {
    let p = Prefetch::new(CFG);
    let mut i = item(1, 0, 30_000);
    i.expires_at_ms = Some(50);
    let _ = p.stage(&topic(), vec![i], 0);
    let t = p.take(&topic(), 1, 50);
    assert!(t.items.is_empty());
    assert_eq!(t.release.len(), 1);
}

#[test]
fn counts_and_drain_cover_every_staged_item() {
    let p = Prefetch::new(CFG);
    let _ = p.stage(&topic(), vec![item(1, 0, 30_000), item(2, 0, 30_000)], 0);
    assert_eq!(p.staged_counts("n", |_| true).get("t"), Some(&2));
    assert!(p.staged_counts("other", |_| true).is_empty());
    assert_eq!(p.drain().len(), 2);
    assert!(p.staged_counts("n", |_| true).is_empty());
}

#[test]
fn dead_copies_are_neither_shown_nor_counted_and_leave_at_the_sweep() {
    let p = Prefetch::new(CFG);
    let _ = p.stage(&topic(), vec![item(1, 0, 30_000), item(2, 1, 30_000)], 0);
    // Key 1 was acked: its copy is dead.
    let live = |i: &Item| i.id.key != 1;
    assert_eq!(p.staged_counts("n", live).get("t"), Some(&1));
    assert_eq!(p.staged_summary(&topic(), live).0, 1);
    let shown: Vec<u64> = p
        .peek(&topic(), 10, 1, live)
        .iter()
        .map(|i| i.id.key)
        .collect();
    assert_eq!(shown, vec![2]);
    // The head is the most urgent live copy's.
    let head = Head {
        priority: 1,
        deliver_after_ms: 0,
    };
    assert_eq!(
        p.staged_topics(live),
        vec![ReadyTopic {
            topic: topic(),
            ready: 1,
            head: Some(head),
            heads: vec![head],
        }]
    );
    assert_eq!(p.staged_heads(&topic(), 10, 1, live), vec![head]);
    let first = Head {
        priority: 0,
        ..head
    };
    assert_eq!(p.staged_heads(&topic(), 10, 1, |_| true), vec![first, head]);
    assert_eq!(p.staged_heads(&topic(), 1, 1, |_| true), vec![first]);
    // A take with a bound leaves what is not before it where it is.
    let t = p.take_before(&topic(), 10, Some(head), 1, false);
    assert_eq!(
        t.items.iter().map(|i| i.id.key).collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(p.staged_heads(&topic(), 10, 1, |_| true), vec![head]);
    let (_, release) = p.sweep(1, live);
    assert!(release.is_empty(), "a dead copy has nothing to release");
    assert_eq!(p.drain().len(), 1);
}

#[test]
fn hand_overs_for_a_drained_shard_are_refused_until_it_is_served_again() {
    let p = Prefetch::new(CFG);
    assert!(p
        .stage_handed(&topic(), vec![item(1, 0, 30_000)], 0)
        .is_empty());
    assert_eq!(p.drain_shard(0).len(), 1);
    let refused = p.stage_handed(&topic(), vec![item(2, 0, 30_000)], 0);
    assert_eq!(refused.len(), 1, "nobody would release it");
    p.open_shard(0);
    assert!(p
        .stage_handed(&topic(), vec![item(3, 0, 30_000)], 0)
        .is_empty());
    assert_eq!(p.drain().len(), 1);
    assert_eq!(
        p.stage_handed(&topic(), vec![item(4, 0, 30_000)], 0).len(),
        1
    );
}

#[test]
fn at_most_once_items_are_not_staged_and_pause_staging_ahead() {
    let p = Prefetch::new(CFG);
    let mut busy = 0;
    for i in 0..300 {
        busy = p.take(&topic(), 100, i * 10).ahead;
    }
    assert!(busy > 0);
    let mut amo = item(7, 0, 30_000);
    amo.policy = Policy::AtMostOnce;
    let refused = p.stage(&topic(), vec![amo, item(8, 0, 30_000)], 3_000);
    assert_eq!(
        refused.iter().map(|i| i.id.key).collect::<Vec<_>>(),
        vec![7]
    );
    assert_eq!(p.take(&topic(), 1, 3_010).ahead, 0, "paused");
    let (restock, _) = p.sweep(3_020, |_| true);
    assert!(restock.is_empty(), "paused");
    assert!(p.take(&topic(), 100, 3_000 + AT_MOST_ONCE_PAUSE_MS).ahead > 0);
}

#[test]
fn a_stage_never_holds_more_than_its_bound_and_keeps_the_most_urgent() {
    let p = Prefetch::new(PrefetchConfig {
        items_max: 3,
        ..CFG
    });
    assert_eq!(p.room(&topic()), 3);
    // Claimed ahead: five items for a stage of three; the two least urgent come back.
    let back = p.stage(
        &topic(),
        (1..=5).map(|k| item(k, 10 - k as i32, 10_000)).collect(),
        0,
    );
    let mut keys: Vec<u64> = back.iter().map(|i| i.id.key).collect();
    keys.sort();
    assert_eq!(keys, vec![1, 2], "priorities 9 and 8 go back");
    assert_eq!(p.room(&topic()), 0);
    // Handed to a waiting consumer with the stage full: the handing shard gets its own
    // item back (it releases it), even a more urgent one; what is staged stays.
    let back = p.stage_handed(&topic(), vec![item(6, 0, 10_000)], 0);
    assert_eq!(back.iter().map(|i| i.id.key).collect::<Vec<_>>(), vec![6]);
    assert_eq!(p.staged(), (3, 3));
    let t = p.take(&topic(), 1, 1);
    assert_eq!(
        t.items.iter().map(|i| i.id.key).collect::<Vec<_>>(),
        vec![5]
    );
    // Room for one: the most urgent of the handed items is staged, the rest go back.
    let back = p.stage_handed(
        &topic(),
        vec![item(7, 3, 10_000), item(8, 1, 10_000), item(9, 2, 10_000)],
        2,
    );
    let mut keys: Vec<u64> = back.iter().map(|i| i.id.key).collect();
    keys.sort();
    assert_eq!(keys, vec![7, 9]);
    let t = p.take(&topic(), 10, 3);
    assert_eq!(
        t.items.iter().map(|i| i.id.key).collect::<Vec<_>>(),
        vec![8, 4, 3]
    );
    assert_eq!(p.room(&topic()), 3);
}
