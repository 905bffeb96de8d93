import os, sys; sys.path.insert(0, "integration/python")
from foqs_client import Client, ttypes          # Apache Thrift + the stubs in gen/py

host, port = os.environ.get("FOQS_ADDR", "127.0.0.1:9090").split(":")
with Client(host, int(port)) as c:              # protocol="compact" works too
    r = c.enqueue(ttypes.EnqueueRequest(items=[
        ttypes.EnqueueItem(ns="tour", topic="emails", priority=10, payload=b"welcome #1"),
        ttypes.EnqueueItem(ns="tour", topic="emails", priority=1, payload=b"password reset"),
    ]))
    print([x.id for x in r.results])            # e.g. ['2:17', '2:18']: "<shard>:<key>"
    items = c.dequeue(ttypes.DequeueRequest(topics=[
        ttypes.TopicRequest(ns="tour", topic="emails", count=2)])).items
    print([(i.priority, i.payload) for i in items])
    assert [i.payload for i in items] == [b"password reset", b"welcome #1"]  # most urgent first
    c.ack(ttypes.AckRequest(ids=[items[0].id], lease_ids=[items[0].lease_id]))
    c.nack(ttypes.NackRequest(items=[ttypes.NackItem(id=items[1].id, delay_ms=5000,
                                                     lease_id=items[1].lease_id)]))
