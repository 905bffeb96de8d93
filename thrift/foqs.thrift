// foqs: the FOQS Thrift API.
//
// Clients in other languages are written against these names and field ids:
// never renumber or rename a field; add new ones with new ids.
// Times are milliseconds since the Unix epoch (i64); durations are milliseconds (i64).
// The server applies every default itself (the Rust generator ignores IDL defaults).

namespace rs foqs
namespace py foqs

enum DeliveryPolicy {
  AT_LEAST_ONCE = 1,
  AT_MOST_ONCE = 2,
}

enum ErrorCode {
  INVALID_ARGUMENT = 1,
  PAYLOAD_TOO_LARGE = 2,
  RATE_LIMITED = 3,
  UNAVAILABLE = 4,
  NOT_FOUND = 5,
  WRONG_HOST = 6,
  UNKNOWN_NAMESPACE = 7,
  INTERNAL = 8,
  // The caller's identity may not make this call in this namespace ([[access]] rules).
  PERMISSION_DENIED = 9,
}

exception FoqsError {
  1: ErrorCode code,
  2: string message,
  // "host:port" of the host that can serve the request (WRONG_HOST).
  3: optional string redirect_host,
  // True when the same request may succeed later (UNAVAILABLE, RATE_LIMITED).
  4: optional bool retryable,
  // True when the change may have been applied (sent to storage or to the owning host,
  // and no answer came back within its bound): UNAVAILABLE otherwise means that nothing
  // was applied. Absent: false.
  5: optional bool outcome_unknown,
  // RATE_LIMITED: how long to wait before retrying, in milliseconds (a hint).
  6: optional i64 retry_after_ms,
}

struct ItemError {
  1: ErrorCode code,
  2: string message,
  3: optional string redirect_host,
  // As FoqsError.outcome_unknown, for this item.
  4: optional bool outcome_unknown,
  // As FoqsError.retry_after_ms, for this item.
  5: optional i64 retry_after_ms,
}

struct EnqueueItem {
  // The namespace (tenant). `namespace` is reserved in Thrift IDL.
  1: string ns,
  2: string topic,
  // Lower = more urgent; the whole i32 range is allowed.
  3: i32 priority,
  // At most 10240 bytes; immutable.
  4: binary payload,
  // At most 4096 bytes; replaced by nack.
  5: optional binary metadata,
  // Absent = now.
  6: optional i64 deliver_after_ms,
  // Absent = the namespace default (30000 unless configured).
  7: optional i64 lease_ms,
  // Absent = the namespace default (none unless configured).
  8: optional i64 ttl_ms,
  // Absent = the namespace default (AT_LEAST_ONCE unless configured).
  9: optional DeliveryPolicy policy,
  // Absent = the namespace default (5 unless configured).
  10: optional i32 max_attempts,
  // While an item with the same (ns, topic, dedup_key) exists, in any state, another
  // enqueue with this key writes nothing and returns the existing item's id.
  11: optional string dedup_key,
}

struct EnqueueRequest {
  1: list<EnqueueItem> items,
  // Set by a foqs host that forwards the request to the host that can serve it (its own
  // host id). A request carrying it is never forwarded again (one hop at most) and is not
  // charged against the namespace's quota a second time. Clients leave it out.
  2: optional string forwarded_by,
  // Set with forwarded_by: a token the forwarding host drew for this request. The host
  // that writes the items records, in the same transaction, each item's id under it, so
  // that when the call's answer is lost (that host died or went silent mid-call) the
  // forwarding host learns what was stored (enqueueOutcome) instead of answering that the
  // outcome is unknown. Clients leave it out.
  3: optional i64 forward_token,
  // Set by a foqs host that routes or forwards the call to a peer: the identity of the
  // client it acts for, whose rights the peer checks (only a peer may send it, see
  // PeerLoginRequest). Clients leave it out.
  4: optional string forwarded_for,
}

struct EnqueueResult {
  // "<shard_id>:<primary_key>", set when the item was committed.
  1: optional string id,
  2: optional ItemError error,
  // True when the id is that of an existing item with the same dedup_key.
  3: optional bool deduplicated,
}

struct EnqueueResponse {
  // Same order as the request's items.
  1: list<EnqueueResult> results,
}

struct TopicRequest {
  1: string ns,
  2: string topic,
  // 1..1000
  3: i32 count,
  // Set by a foqs host that routes a dequeue to a peer (with local_only): only items more
  // urgent than this place in the delivery order (a lower priority, or the same priority
  // and an older deliver_after_ms) are wanted, because the routing host holds items up to
  // it already. Both or neither. Clients leave them out.
  4: optional i32 before_priority,
  5: optional i64 before_deliver_after_ms,
}

struct DequeueRequest {
  1: list<TopicRequest> topics,
  // Long poll: when none of the topics has a ready item, wait up to this long (at most
  // 30000) for one to become ready, and return as soon as one does. Absent or 0: no wait.
  2: optional i64 wait_ms,
  // True: only this host's shards (hosts set it when they route a call to each other).
  // Absent: the whole tier of the namespace, this host's shards and its peers'.
  3: optional bool local_only,
  // Set by a foqs host that routes the dequeue to a peer (its own host id): served from
  // the peer's own shards only. Clients leave it out.
  4: optional string forwarded_by,
  // Set by a foqs host that routes or forwards the call to a peer: the identity of the
  // client it acts for, whose rights the peer checks (only a peer may send it, see
  // PeerLoginRequest). Clients leave it out.
  5: optional string forwarded_for,
}

struct Item {
  1: string id,
  2: string ns,
  3: string topic,
  4: i32 priority,
  5: binary payload,
  // Empty when none.
  6: binary metadata,
  7: i64 deliver_after_ms,
  8: i64 enqueued_at_ms,
  // 1 on the first delivery.
  9: i32 delivery_count,
  10: i64 lease_expires_ms,
  11: DeliveryPolicy policy,
  // Names this delivery (a receipt handle, as SQS calls it): a fresh value every time the
  // item is handed out. Pass it back with nack or touch so that the call acts only on this
  // delivery's lease: once the lease ended (expired, or the item was delivered again),
  // such a call answers NOT_FOUND instead of changing another consumer's lease. 0 for
  // items that are not leased (peek).
  12: i64 lease_id,
  // How long each delivery of this item is leased for (its EnqueueItem.lease_ms): extend a
  // long job's lease by this much with touch. On peeked items: what a delivery would get.
  13: optional i64 lease_ms,
}

struct DequeueResponse {
  // Each topic's items in delivery order.
  1: list<Item> items,
}

struct AckRequest {
  1: list<string> ids,
  // Set by a foqs host that forwards the request to the host that can serve it (its own
  // host id). A request carrying it is never forwarded again (one hop at most) and is not
  // charged against the namespace's quota a second time. Clients leave it out.
  2: optional string forwarded_by,
  // Set with forwarded_by when access rules apply: the identity of the client the
  // forwarding host acts for, checked by the host that owns the items. Clients leave it out.
  3: optional string forwarded_for,
  // When given, as long as ids: lease_ids[i] is the Item.lease_id of the delivery that
  // ids[i] answers (0: none named). An ack naming a lease deletes the item only while it
  // is on that delivery's lease (else NOT_FOUND, "lease ended"). Either way, an ack
  // repeated within engine.ack_memory_ms of the one that deleted the item answers OK
  // again (a retry after a lost reply), unless it names another lease.
  4: optional list<i64> lease_ids,
}

struct NackItem {
  1: string id,
  // Ready again at now + delay_ms (absent = 0).
  2: optional i64 delay_ms,
  // Replaces the item's metadata when given.
  3: optional binary metadata,
  // Straight to the dead letters, whatever attempts are left.
  4: optional bool to_dlq,
  // The Item.lease_id of the delivery this nack answers. When given and that delivery's
  // lease has ended, the item is left alone and its result is NOT_FOUND ("lease ended").
  // Absent: the nack applies to whatever lease the item is on.
  5: optional i64 lease_id,
}

struct NackRequest {
  1: list<NackItem> items,
  // Set by a foqs host that forwards the request to the host that can serve it (its own
  // host id). A request carrying it is never forwarded again (one hop at most) and is not
  // charged against the namespace's quota a second time. Clients leave it out.
  2: optional string forwarded_by,
  // Set with forwarded_by when access rules apply: the identity of the client the
  // forwarding host acts for, checked by the host that owns the items. Clients leave it out.
  3: optional string forwarded_for,
  // Set by the host that took the client's call, on the calls it forwards: an item a nack
  // without lease_id settles remembers it, so that a retry of a nack whose answer was
  // lost knows its own work (OK) and does not settle the item's next delivery. Clients
  // leave it out (a host ignores it on a call not forwarded).
  4: optional i64 nack_token,
}

struct ItemResult {
  1: string id,
  2: optional ItemError error,
}

struct AckResponse {
  1: list<ItemResult> results,
}

struct NackResponse {
  1: list<ItemResult> results,
}

struct TouchItem {
  1: string id,
  // The lease is extended to now + extend_ms (> 0).
  2: i64 extend_ms,
  // As NackItem.lease_id: when given, only that delivery's lease is extended.
  3: optional i64 lease_id,
}

struct TouchRequest {
  1: list<TouchItem> items,
  // Set by a foqs host that forwards the request to the host that can serve it (its own
  // host id). A request carrying it is never forwarded again (one hop at most) and is not
  // charged against the namespace's quota a second time. Clients leave it out.
  2: optional string forwarded_by,
  // Set with forwarded_by when access rules apply: the identity of the client the
  // forwarding host acts for, checked by the host that owns the items. Clients leave it out.
  3: optional string forwarded_for,
}

struct TouchResponse {
  1: list<ItemResult> results,
}

struct PeekRequest {
  1: string ns,
  2: string topic,
  // 1..1000
  3: i32 count,
  // True: only this host's shards (hosts set it when they route a call to each other).
  // Absent: the whole tier of the namespace, this host's shards and its peers'.
  4: optional bool local_only,
  // Set by a foqs host that routes or forwards the call to a peer: the identity of the
  // client it acts for, whose rights the peer checks (only a peer may send it, see
  // PeerLoginRequest). Clients leave it out.
  5: optional string forwarded_for,
}

struct PeekResponse {
  // The next ready items in delivery order, not leased: lease_expires_ms is 0 and
  // delivery_count counts past deliveries only.
  1: list<Item> items,
}

struct DeadItem {
  1: Item item,
  2: i64 died_at_ms,
}

struct DlqListRequest {
  1: string ns,
  2: string topic,
  // Absent = 100; at most 1000.
  3: optional i32 limit,
  // Opaque cursor from a previous page's next_after.
  4: optional string after,
  // True: only this host's shards (hosts set it when they route a call to each other).
  // Absent: the whole tier of the namespace, this host's shards and its peers'.
  5: optional bool local_only,
  // Set by a foqs host that routes or forwards the call to a peer: the identity of the
  // client it acts for, whose rights the peer checks (only a peer may send it, see
  // PeerLoginRequest). Clients leave it out.
  6: optional string forwarded_for,
}

struct DlqListResponse {
  // In delivery order (priority, deliver_after, id).
  1: list<DeadItem> items,
  // Absent on the last page.
  2: optional string next_after,
}

struct DlqRequeueRequest {
  1: list<string> ids,
  // As in AckRequest: set by a foqs host that forwards ids to the host owning their
  // shards. Clients leave them out.
  2: optional string forwarded_by,
  3: optional string forwarded_for,
  // Set by the host that took the client's call, on the calls it forwards: the item rows
  // a requeue makes ready remember it, so that a retry of a requeue whose answer was lost
  // knows its own work (OK) from an item that was not dead (NOT_FOUND). Clients leave it
  // out.
  4: optional i64 requeue_token,
}

struct DlqRequeueResponse {
  // NOT_FOUND for an id that is not a dead item.
  1: list<ItemResult> results,
}

struct DlqRequeueAllRequest {
  1: string ns,
  2: string topic,
  // Absent: all of them.
  3: optional i64 max,
  // True: only this host's shards (hosts set it when they route a call to each other).
  // Absent: the whole tier of the namespace, this host's shards and its peers'.
  4: optional bool local_only,
  // Set by a foqs host that routes or forwards the call to a peer: the identity of the
  // client it acts for, whose rights the peer checks (only a peer may send it, see
  // PeerLoginRequest). Clients leave it out.
  5: optional string forwarded_for,
}

struct DlqPurgeRequest {
  1: string ns,
  2: string topic,
  // True: only this host's shards (hosts set it when they route a call to each other).
  // Absent: the whole tier of the namespace, this host's shards and its peers'.
  3: optional bool local_only,
  // Set by a foqs host that routes or forwards the call to a peer: the identity of the
  // client it acts for, whose rights the peer checks (only a peer may send it, see
  // PeerLoginRequest). Clients leave it out.
  4: optional string forwarded_for,
}

struct DlqCountResponse {
  1: i64 count,
  // True when the call stopped at its time bound (engine.dlq_call_ms_max) with dead items
  // left to requeue or purge: call again for the rest. Absent or false: all done.
  2: optional bool more,
}

struct TopicStatsRequest {
  1: string ns,
  2: string topic,
  // True: only this host's shards (hosts set it when they route a call to each other).
  // Absent: the whole tier of the namespace, this host's shards and its peers'.
  3: optional bool local_only,
  // Set by a foqs host that routes or forwards the call to a peer: the identity of the
  // client it acts for, whose rights the peer checks (only a peer may send it, see
  // PeerLoginRequest). Clients leave it out.
  4: optional string forwarded_for,
}

struct TopicStats {
  // Items now: ready (staged by the prefetch buffer included), deferred, leased, dead.
  1: i64 ready,
  2: i64 deferred,
  3: i64 leased,
  4: i64 dead,
  // Totals since the topic's first item (saved with the shards' checkpoints, so up to
  // about a second behind, and a crash may lose that second): items enqueued, handed
  // out, acked, nacked, and leases that ran out without ack or nack.
  5: i64 enqueued,
  6: i64 delivered,
  7: i64 acked,
  8: i64 nacked,
  9: i64 expired,
  // How long the oldest ready item has been ready (now - its deliver_after); 0 when none.
  10: i64 oldest_ready_age_ms,
}

struct GetActiveTopicsRequest {
  1: string ns,
  // Absent = 1000; at most 10000.
  2: optional i32 limit,
  // Cursor: return topics whose name sorts after this one (bytewise).
  3: optional string after,
  // True: only this host's shards (hosts set it when they ask each other). Absent: the
  // whole tier of the namespace, gathered from this host's peers.
  4: optional bool local_only,
  // Set by a foqs host that routes or forwards the call to a peer: the identity of the
  // client it acts for, whose rights the peer checks (only a peer may send it, see
  // PeerLoginRequest). Clients leave it out.
  5: optional string forwarded_for,
}

struct ActiveTopic {
  1: string topic,
  2: i64 ready,
  3: i64 deferred,
  4: i64 leased,
  // Host ids of the hosts whose shards hold items of the topic: dequeue there.
  5: optional list<string> hosts,
}

struct GetActiveTopicsResponse {
  // Sorted by name (bytewise).
  1: list<ActiveTopic> topics,
  // Absent on the last page.
  2: optional string next_after,
}

struct ShardInfo {
  1: i32 shard_id,
  2: bool healthy,
  3: i64 items,
  // "serving", "breaker_open" (its storage is failing or slow: no new enqueues go to it),
  // "worker_dead" (its worker died; it is reopened by itself) or "stopped".
  4: optional string state,
}

// Another host of the cluster, as this host sees it.
struct PeerInfo {
  1: string host_id,
  // "host:port" clients and peers use.
  2: string addr,
  3: string tier,
  // The shards the shard manager says it owns.
  4: list<i32> shards,
  // False when this host's last call to it failed.
  5: bool reachable,
  // Its spare_capacity when this host last asked.
  6: i64 spare_capacity,
}

// The delivery-order key of one ready item (the id left out).
struct HeadKey {
  1: i32 priority,
  2: i64 deliver_after_ms,
}

struct ReadyTopic {
  1: string ns,
  2: string topic,
  3: i64 ready,
  // The topic's head on this host: its most urgent ready item's priority and
  // deliver_after_ms (or a bound no ready item of it is more urgent than). Absent when
  // the host does not know it (a shard has not read the topic's index since it opened).
  // A host routing a dequeue asks the peers whose head beats what it holds.
  4: optional i32 head_priority,
  5: optional i64 head_deliver_after_ms,
  // The keys of the topic's most urgent ready items on this host, most urgent first: at
  // most 32, and fewer where the host cannot tell what comes next (every ready item not
  // listed is no more urgent than the last one listed). A host routing a dequeue merges
  // them to know how many items to take from each host.
  6: optional list<HeadKey> heads,
}

struct HostInfo {
  1: string host_id,
  2: string version,
  // The shards this host owns and serves now.
  3: list<ShardInfo> shards,
  4: optional string tier,
  5: optional string addr,
  // Enqueue batches this host's healthy shards can still queue; hosts forward enqueues
  // to the peer with the most.
  6: optional i64 spare_capacity,
  // The peers this host polls (cluster.peer_fanout of each tier), as it last saw them.
  7: optional list<PeerInfo> peers,
  // "single", "static" or "etcd".
  8: optional string manager,
  // Topics with ready items on this host's shards (at most 10000, the fullest first):
  // the summary peers poll to know where to route dequeues.
  9: optional list<ReadyTopic> ready_topics,
  // True: this host's shards mark the items of forwarded requests under their
  // forward_token, so a host that forwarded to it can learn what it stored after it went
  // silent (enqueueOutcome). A host that never said so (an older build) is not assumed to.
  10: optional bool forward_marks,
  // This host's wall clock when it answered, in milliseconds since the epoch: peers that
  // poll it compare their clocks with it (cluster.clock_skew_max_ms).
  11: optional i64 now_ms,
}

// Between hosts of a cluster: the first call on a connection from one host to another,
// proving that the caller is a member of the cluster (cluster.peer_secret). Calls that
// only hosts may make (notifyReady, enqueueOutcome) and requests carrying the fields only
// hosts set (forwarded_by and the tokens) are answered only on a connection that proved
// this, or whose TLS certificate is allowed "peer". Clients never call it.
struct PeerLoginRequest {
  1: string host_id,
  2: binary secret,
}

// Between hosts of a cluster: what became of an enqueue whose answer was lost. Asked of
// the host serving the shards now; each shard decides for good (a record written now
// makes a late commit of the lost insert fail). Only for peers (see PeerLoginRequest).
struct EnqueueOutcomeRequest {
  // The shards to ask. A shard this host does not serve now answers "unserved".
  1: list<i32> shards,
  // A forwarded request's token (EnqueueRequest.forward_token) and its number of items,
  2: optional i64 forward_token,
  3: optional i32 items,
  // or an insert's batch token (the token a shard's insert marks itself with).
  4: optional i64 batch_token,
}

struct ForwardedItem {
  // The item's position in the forwarded request.
  1: i32 position,
  2: string id,
  3: bool deduplicated,
}

struct ShardEnqueueOutcome {
  1: i32 shard_id,
  // "committed": the items listed (a forwarded request) or the insert (a batch token)
  // were stored, and nothing else of the request was, on this shard. "not_committed":
  // nothing of it was, and never will be. "forgotten": past the shard's memory (10
  // minutes): the items listed were stored; of the rest nothing is known. "unserved":
  // not served by this host now. "error": not answered (see error).
  2: string state,
  3: optional list<ForwardedItem> items,
  4: optional string error,
}

struct EnqueueOutcomeResponse {
  1: list<ShardEnqueueOutcome> shards,
}

struct NotifyReadyRequest {
  // The host whose shards now have ready items of these topics.
  1: string host_id,
  2: list<ReadyTopic> topics,
}

// Replicated shards (see README, "Replication and region drain"). A replica set is a
// primary server and its replicas; the shards on one server switch together.
struct SwitchoverRequest {
  1: i32 shard_id,
  // "host:port" (or a mysql:// URL) of the replica to promote; absent: the most caught-up
  // replica outside the primary's region.
  2: optional string to,
}

struct RegionDrainRequest {
  // Every replica set whose primary is in this region moves out of it.
  1: string from_region,
  // Absent: to the most caught-up replica in any other region.
  2: optional string to_region,
}

struct FailoverRequest {
  1: i32 shard_id,
  // Promote even when no semi-synchronous replica can vouch for every acknowledged
  // transaction (some acknowledged items may be lost).
  2: optional bool allow_loss,
}

struct SwitchReport {
  // "switchover" or "failover".
  1: string kind,
  2: list<i32> shards,
  3: string from_server,
  4: string to_server,
  5: string to_region,
  // The generation the shards have now (every switch raises it, an undone one too).
  6: i64 generation,
  // False: nothing moved (the reason in error).
  7: bool ok,
  8: optional string error,
  // Pause asked for -> every owner paused.
  9: i64 pause_ms,
  // Old primary read-only (failover: fenced) -> new primary writable and serving.
  10: i64 read_only_ms,
  11: i64 catchup_ms,
  // Transactions the promoted replica lacks (only with allow_loss).
  12: i64 lost_transactions,
}

struct SwitchResponse {
  1: list<SwitchReport> switches,
  // The whole call, as the host that answered timed it (a region drain: from the request
  // to the last set's switch done, its sets switched up to replication.drain_parallel_max
  // at once).
  2: optional i64 elapsed_ms,
}

struct ReplicaInfo {
  1: string server,
  2: string region,
  3: bool reachable,
  4: bool read_only,
  // Transactions the primary has that it has not applied.
  5: optional i64 lag_transactions,
  // From the heartbeat row the primary's owner writes every replication.probe_interval_ms.
  6: optional i64 lag_ms,
  7: bool io_running,
  8: bool sql_running,
  // It acknowledges commits (semi-synchronous replica).
  9: bool semi_sync,
  10: optional string error,
}

struct ShardReplicationInfo {
  1: i32 shard_id,
  // "host:port" of the current primary (no account, no password).
  2: string primary,
  3: string primary_region,
  4: i64 generation,
  // "serving" or "paused" (a switch is under way).
  5: string state,
  6: optional string owner,
  7: bool primary_reachable,
  // The primary waits for a replica's acknowledgement of every commit.
  8: bool semi_sync_on,
  // Commits that fell back to asynchronous (should stay 0: an alert otherwise).
  9: i64 semi_sync_no_tx,
  10: list<ReplicaInfo> replicas,
}

struct ReplicationResponse {
  1: list<ShardReplicationInfo> shards,
}

service Foqs {
  EnqueueResponse enqueue(1: EnqueueRequest req) throws (1: FoqsError err),
  DequeueResponse dequeue(1: DequeueRequest req) throws (1: FoqsError err),
  AckResponse ack(1: AckRequest req) throws (1: FoqsError err),
  NackResponse nack(1: NackRequest req) throws (1: FoqsError err),
  GetActiveTopicsResponse getActiveTopics(1: GetActiveTopicsRequest req) throws (1: FoqsError err),
  HostInfo getHostInfo() throws (1: FoqsError err),
  // Extends the leases of items still leased; NOT_FOUND for an item that is not.
  TouchResponse touch(1: TouchRequest req) throws (1: FoqsError err),
  // The next ready items of a topic, in delivery order, without leasing them.
  PeekResponse peek(1: PeekRequest req) throws (1: FoqsError err),
  TopicStats topicStats(1: TopicStatsRequest req) throws (1: FoqsError err),
  // Dead letters: items whose attempts ran out, or nacked with to_dlq.
  DlqListResponse dlqList(1: DlqListRequest req) throws (1: FoqsError err),
  // Ready again with delivery_count reset.
  DlqRequeueResponse dlqRequeue(1: DlqRequeueRequest req) throws (1: FoqsError err),
  DlqCountResponse dlqRequeueAll(1: DlqRequeueAllRequest req) throws (1: FoqsError err),
  DlqCountResponse dlqPurge(1: DlqPurgeRequest req) throws (1: FoqsError err),
  // Between hosts of a cluster: topics that just got ready items on the sender, so that
  // long polls routed elsewhere wake at once. Only for peers (see PeerLoginRequest).
  void notifyReady(1: NotifyReadyRequest req) throws (1: FoqsError err),
  // Between hosts of a cluster: what became of an enqueue whose answer was lost (see
  // EnqueueOutcomeRequest). Only for peers (see PeerLoginRequest).
  EnqueueOutcomeResponse enqueueOutcome(1: EnqueueOutcomeRequest req) throws (1: FoqsError err),
  // Between hosts of a cluster: proves the connection is a peer's (see PeerLoginRequest).
  // PERMISSION_DENIED for a wrong secret and on a host with no peers.
  void peerLogin(1: PeerLoginRequest req) throws (1: FoqsError err),
  // Replication (needs "admin" on every namespace, "*", under access rules). Any host
  // drives the switch through etcd; a call returns when the switch is done or undone.
  SwitchResponse shardSwitchover(1: SwitchoverRequest req) throws (1: FoqsError err),
  SwitchResponse regionDrain(1: RegionDrainRequest req) throws (1: FoqsError err),
  SwitchResponse shardFailover(1: FailoverRequest req) throws (1: FoqsError err),
  ReplicationResponse getReplication() throws (1: FoqsError err),
}
