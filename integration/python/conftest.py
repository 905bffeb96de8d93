import os
import uuid

import pytest

from foqs_client import Client


def _addr():
    host, port = os.environ.get("FOQS_ADDR", "127.0.0.1:9090").rsplit(":", 1)
    return host, int(port)


@pytest.fixture(params=["binary", "compact"])
def client(request):
    host, port = _addr()
    with Client(host, port, protocol=request.param) as c:
        yield c


@pytest.fixture
def topic():
    """A topic no other test uses, so tests can share one foqsd."""
    return "py-" + uuid.uuid4().hex[:12]
