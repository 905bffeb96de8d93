"""A small helper for Python clients of foqsd: connects with the Apache Thrift library and
the stubs generated into gen/py, over the framed transport with either protocol.

It also carries the shim that Python 3.11 needs with stubs from thrift-compiler 0.17:
their exceptions refuse every attribute assignment, and Python assigns `__traceback__`
to an exception leaving a `with` block (THRIFT-5715), so a FoqsError would surface as
`TypeError: can't modify immutable instance`. The shim lets dunder attributes through;
the declared fields stay immutable.
"""

import os
import ssl
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "gen", "py"))

from thrift.protocol import TBinaryProtocol, TCompactProtocol  # noqa: E402
from thrift.transport import TSocket, TSSLSocket, TTransport  # noqa: E402

from foqs import Foqs, ttypes  # noqa: E402


def _allow_dunders(cls):
    frozen_setattr = cls.__setattr__
    frozen_delattr = cls.__delattr__

    def __setattr__(self, name, value):
        if name.startswith("__") and name.endswith("__"):
            object.__setattr__(self, name, value)
        else:
            frozen_setattr(self, name, value)

    def __delattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            object.__delattr__(self, name)
        else:
            frozen_delattr(self, name)

    cls.__setattr__ = __setattr__
    cls.__delattr__ = __delattr__


_allow_dunders(ttypes.FoqsError)


def tls_context(ca_file, cert_file=None, key_file=None):
    """An SSLContext for foqsd: verifies the server against `ca_file`, and presents
    `cert_file`/`key_file` (PEM) as this client's identity when given."""
    ctx = ssl.create_default_context(cafile=ca_file)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


class Client:
    """`with Client("127.0.0.1", 9090) as c: c.enqueue(...)`

    For a foqsd whose port speaks TLS, pass `ssl_context` (an `ssl.SSLContext` that trusts
    the server's CA, and holds this client's certificate when the server requires one);
    see `tls_context`.
    """

    def __init__(self, host="127.0.0.1", port=9090, protocol="binary", timeout_ms=10000,
                 ssl_context=None):
        if ssl_context is None:
            sock = TSocket.TSocket(host, port)
        else:
            sock = TSSLSocket.TSSLSocket(host, port, ssl_context=ssl_context,
                                         server_hostname=host)
        sock.setTimeout(timeout_ms)
        self.transport = TTransport.TFramedTransport(sock)
        if protocol == "binary":
            proto = TBinaryProtocol.TBinaryProtocol(self.transport)
        elif protocol == "compact":
            proto = TCompactProtocol.TCompactProtocol(self.transport)
        else:
            raise ValueError("protocol must be 'binary' or 'compact'")
        self.client = Foqs.Client(proto)

    def __enter__(self):
        self.transport.open()
        return self.client

    def __exit__(self, *exc):
        self.transport.close()
        return False
