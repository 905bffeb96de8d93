"""The Python side of the contract: the Apache Thrift library and the generated stubs in
gen/py against a running foqsd, over binary and compact protocol."""

import time

import pytest

from foqs_client import ttypes

NS = "python"


def enqueue(c, items):
    resp = c.enqueue(ttypes.EnqueueRequest(items=items))
    return resp.results


def test_full_round_trip(client, topic):
    items = [
        ttypes.EnqueueItem(ns=NS, topic=topic, priority=p, payload=bytes([p, 0, 255]))
        for p in (30, 10, 20)
    ]
    results = enqueue(client, items)
    assert all(r.error is None for r in results)
    ids = [r.id for r in results]
    assert all(":" in i for i in ids)

    topics = client.getActiveTopics(ttypes.GetActiveTopicsRequest(ns=NS, after=topic[:-1] + "\x00"))
    mine = [t for t in topics.topics if t.topic == topic]
    assert mine and (mine[0].ready, mine[0].deferred, mine[0].leased) == (3, 0, 0)

    got = client.dequeue(ttypes.DequeueRequest(topics=[ttypes.TopicRequest(ns=NS, topic=topic, count=10)])).items
    assert [i.priority for i in got] == [10, 20, 30]
    assert got[0].payload == bytes([10, 0, 255])
    assert got[0].delivery_count == 1
    assert got[0].policy == ttypes.DeliveryPolicy.AT_LEAST_ONCE
    assert got[0].lease_expires_ms > int(time.time() * 1000)

    # Nack the most urgent with new metadata; it comes straight back.
    nacked = client.nack(ttypes.NackRequest(items=[ttypes.NackItem(id=got[0].id, metadata=b"retry")]))
    assert nacked.results[0].error is None
    again = client.dequeue(ttypes.DequeueRequest(topics=[ttypes.TopicRequest(ns=NS, topic=topic, count=10)])).items
    assert len(again) == 1 and again[0].metadata == b"retry" and again[0].delivery_count == 2

    acked = client.ack(ttypes.AckRequest(ids=ids + ["bogus"]))
    assert [r.error for r in acked.results[:3]] == [None, None, None]
    assert acked.results[3].error.code == ttypes.ErrorCode.INVALID_ARGUMENT
    empty = client.dequeue(ttypes.DequeueRequest(topics=[ttypes.TopicRequest(ns=NS, topic=topic, count=10)])).items
    assert empty == []

    info = client.getHostInfo()
    assert info.version and len(info.shards) == 4


def test_item_errors_come_back_per_item(client, topic):
    results = enqueue(client, [
        ttypes.EnqueueItem(ns=NS, topic=topic, priority=0, payload=b"x" * 10241),
        ttypes.EnqueueItem(ns=NS, topic=topic, priority=0, payload=b"fine"),
    ])
    assert results[0].error.code == ttypes.ErrorCode.PAYLOAD_TOO_LARGE and results[0].id is None
    assert results[1].error is None
    client.ack(ttypes.AckRequest(ids=[results[1].id]))


def test_declared_error_is_a_python_exception(client, topic):
    bad = ttypes.DequeueRequest(topics=[ttypes.TopicRequest(ns=NS, topic=topic, count=0)])
    with pytest.raises(ttypes.FoqsError) as caught:
        client.dequeue(bad)
    assert caught.value.code == ttypes.ErrorCode.INVALID_ARGUMENT
    assert "count" in caught.value.message
    assert caught.value.retryable is False
    # Raised through a `with` block, where Python sets __traceback__ (THRIFT-5715): the
    # shim in foqs_client keeps that from turning into a TypeError.
    class Block:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    with pytest.raises(ttypes.FoqsError):
        with Block():
            client.dequeue(bad)
    # The fields themselves stay immutable.
    with pytest.raises(TypeError):
        caught.value.code = 5
    # And the connection still works.
    assert client.getHostInfo().shards
