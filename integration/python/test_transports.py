"""Every transport the Apache Thrift library offers a client, against one foqsd port:
framed and unframed (the library's default, TBufferedTransport) with either protocol,
THeader (THeaderProtocol) with either protocol, with and without the zlib transform and
with info headers, and HTTP (THttpClient); and unframed calls pipelined in one packet."""

import os
import socket
import urllib.request

import pytest
from thrift.protocol import TBinaryProtocol
from thrift.transport import TSocket, TTransport

from foqs_client import Client, Foqs, ttypes
from conftest import _addr

NS = "transports"

CASES = [
    ("framed", "binary", False),
    ("framed", "compact", False),
    ("unframed", "binary", False),
    ("unframed", "compact", False),
    ("header", "binary", False),
    ("header", "compact", False),
    ("header", "binary", True),
    ("header", "compact", True),
    ("http", "binary", False),
    ("http", "compact", False),
]


def served(transport, protocol):
    """Requests foqsd has served over `transport` and `protocol`, from its metrics
    (FOQS_METRICS_ADDR, which scripts/test.sh sets): proof of what went over the wire."""
    addr = os.environ["FOQS_METRICS_ADDR"]
    text = urllib.request.urlopen("http://%s/metrics" % addr, timeout=10).read().decode()
    series = 'foqs_transport_requests_total{transport="%s",protocol="%s"} ' % (transport, protocol)
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series))


@pytest.mark.parametrize("transport,protocol,zlib", CASES)
def test_round_trip(transport, protocol, zlib, topic):
    host, port = _addr()
    before = served(transport, protocol)
    headers = {b"client_id": b"pytest", b"client_timeout": b"5000"} if transport == "header" else None
    with Client(host, port, protocol=protocol, transport=transport, zlib=zlib, headers=headers) as c:
        items = [
            ttypes.EnqueueItem(ns=NS, topic=topic, priority=p, payload=b"x" * 300 + bytes([p]))
            for p in (7, 3, 5)
        ]
        results = c.enqueue(ttypes.EnqueueRequest(items=items)).results
        assert all(r.error is None for r in results)
        got = c.dequeue(ttypes.DequeueRequest(
            topics=[ttypes.TopicRequest(ns=NS, topic=topic, count=10)])).items
        assert [i.priority for i in got] == [3, 5, 7]
        assert got[0].payload == b"x" * 300 + bytes([3])
        acked = c.ack(ttypes.AckRequest(ids=[i.id for i in got])).results
        assert all(r.error is None for r in acked)
        # A declared error comes back in the same transport.
        with pytest.raises(ttypes.FoqsError) as e:
            c.dequeue(ttypes.DequeueRequest(
                topics=[ttypes.TopicRequest(ns=NS, topic=topic, count=1)], wait_ms=-1))
        assert e.value.code == ttypes.ErrorCode.INVALID_ARGUMENT
    # Four calls, each seen by foqsd in this transport and protocol.
    assert served(transport, protocol) - before >= 4


def test_http_several_calls_in_a_row(topic):
    # THttpClient opens a connection per call (keep-alive is tested in Rust,
    # integration/rust/transports.rs); several calls in a row all work.
    host, port = _addr()
    with Client(host, port, transport="http") as c:
        for n in range(3):
            c.enqueue(ttypes.EnqueueRequest(items=[
                ttypes.EnqueueItem(ns=NS, topic=topic, priority=n, payload=b"h")]))
        stats = c.topicStats(ttypes.TopicStatsRequest(ns=NS, topic=topic))
        assert stats.ready == 3


def test_unframed_calls_pipelined_in_one_packet_are_answered_in_order(topic):
    host, port = _addr()
    # Three calls written into one buffer with the library's own client...
    buf = TTransport.TMemoryBuffer()
    writer = Foqs.Client(TBinaryProtocol.TBinaryProtocol(buf))
    item = lambda p: ttypes.EnqueueItem(ns=NS, topic=topic, priority=p, payload=b"p")  # noqa: E731
    writer.send_enqueue(ttypes.EnqueueRequest(items=[item(2)]))
    writer.send_enqueue(ttypes.EnqueueRequest(items=[item(1)]))
    writer.send_dequeue(ttypes.DequeueRequest(
        topics=[ttypes.TopicRequest(ns=NS, topic=topic, count=10)]))
    packet = buf.getvalue()
    # ...sent in one write, then the replies read back in order: the dequeue, last, sees
    # both enqueues.
    s = socket.create_connection((host, port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(packet)
    sock = TSocket.TSocket()
    sock.setHandle(s)
    reader = Foqs.Client(TBinaryProtocol.TBinaryProtocol(TTransport.TBufferedTransport(sock)))
    first = reader.recv_enqueue().results[0].id
    second = reader.recv_enqueue().results[0].id
    got = reader.recv_dequeue().items
    assert [i.id for i in got] == [second, first]
    s.close()
