"""foqsd over TLS with client certificates and namespace access rules, through Apache
Thrift's TSSLSocket: the identity "alice" may produce and consume in namespace "a" only.
scripts/test.sh starts that foqsd (FOQS_TLS_ADDR) with certificates from scripts/certs.sh
(FOQS_CERTS)."""

import os

import pytest
from thrift.transport.TTransport import TTransportException

from foqs_client import Client, tls_context, ttypes

CERTS = os.environ.get("FOQS_CERTS")
ADDR = os.environ.get("FOQS_TLS_ADDR")
pytestmark = pytest.mark.skipif(
    not (CERTS and ADDR), reason="needs FOQS_CERTS and FOQS_TLS_ADDR (scripts/test.sh sets them)"
)


def client(who=None, ca="ca.pem", protocol="binary", transport="framed"):
    host, port = ADDR.rsplit(":", 1)
    cert = os.path.join(CERTS, who + ".pem") if who else None
    key = os.path.join(CERTS, who + ".key") if who else None
    ctx = tls_context(os.path.join(CERTS, ca), cert, key)
    return Client(host, int(port), protocol=protocol, ssl_context=ctx, transport=transport)


# Inside TLS the transport is detected as on a plain port.
@pytest.mark.parametrize("protocol,transport", [
    ("binary", "framed"), ("compact", "framed"), ("binary", "unframed"), ("compact", "header"),
])
def test_alice_works_in_her_namespace_only(protocol, transport, topic):
    with client("alice", protocol=protocol, transport=transport) as c:
        r = c.enqueue(ttypes.EnqueueRequest(items=[
            ttypes.EnqueueItem(ns="a", topic=topic, payload=b"mine"),
            ttypes.EnqueueItem(ns="b", topic=topic, payload=b"not mine"),
        ]))
        assert r.results[0].error is None
        assert r.results[1].error.code == ttypes.ErrorCode.PERMISSION_DENIED
        items = c.dequeue(ttypes.DequeueRequest(topics=[
            ttypes.TopicRequest(ns="a", topic=topic, count=10)])).items
        assert [i.payload for i in items] == [b"mine"]
        assert items[0].lease_id > 0
        with pytest.raises(ttypes.FoqsError) as e:
            c.dequeue(ttypes.DequeueRequest(topics=[
                ttypes.TopicRequest(ns="b", topic=topic, count=1)]))
        assert e.value.code == ttypes.ErrorCode.PERMISSION_DENIED
        assert not e.value.retryable
        ack = c.ack(ttypes.AckRequest(ids=[items[0].id]))
        assert ack.results[0].error is None


def test_a_client_without_a_certificate_is_refused():
    with pytest.raises(TTransportException):
        with client(None) as c:
            c.getHostInfo()


def test_a_certificate_from_another_ca_is_refused():
    with pytest.raises(TTransportException):
        with client("intruder") as c:
            c.getHostInfo()
