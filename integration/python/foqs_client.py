"""A small helper for Python clients of foqsd: connects with the Apache Thrift library and
the stubs generated into gen/py, over any transport foqsd serves (framed, unframed,
THeader, HTTP) with either protocol.

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

from thrift.protocol import TBinaryProtocol, TCompactProtocol, THeaderProtocol  # noqa: E402
from thrift.transport import THeaderTransport, THttpClient, TSocket, TSSLSocket, TTransport  # noqa: E402

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

    `transport` is how messages are framed; foqsd detects each per connection:
    - "framed" (a length before each message),
    - "unframed" (`TBufferedTransport`, the library's default),
    - "header" (`THeaderProtocol`, as fbthrift clients speak; `zlib=True` adds the zlib
      transform, `headers` are info headers to send, e.g. {b"client_timeout": b"5000"}),
    - "http" (`THttpClient`: POST with Content-Type application/x-thrift).

    For a foqsd whose port speaks TLS, pass `ssl_context` (an `ssl.SSLContext` that trusts
    the server's CA, and holds this client's certificate when the server requires one);
    see `tls_context`.
    """

    def __init__(self, host="127.0.0.1", port=9090, protocol="binary", timeout_ms=10000,
                 ssl_context=None, transport="framed", zlib=False, headers=None):
        if protocol not in ("binary", "compact"):
            raise ValueError("protocol must be 'binary' or 'compact'")
        if transport == "http":
            if ssl_context is not None:
                raise ValueError("this helper speaks HTTP without TLS")
            self.transport = THttpClient.THttpClient("http://%s:%d/" % (host, port))
            self.transport.setTimeout(timeout_ms)
            proto = self._protocol(protocol, self.transport)
        else:
            if ssl_context is None:
                sock = TSocket.TSocket(host, port)
            else:
                sock = TSSLSocket.TSSLSocket(host, port, ssl_context=ssl_context,
                                             server_hostname=host)
            sock.setTimeout(timeout_ms)
            if transport == "framed":
                self.transport = TTransport.TFramedTransport(sock)
                proto = self._protocol(protocol, self.transport)
            elif transport == "unframed":
                self.transport = TTransport.TBufferedTransport(sock)
                proto = self._protocol(protocol, self.transport)
            elif transport == "header":
                sub = (THeaderTransport.THeaderSubprotocolID.BINARY if protocol == "binary"
                       else THeaderTransport.THeaderSubprotocolID.COMPACT)
                proto = THeaderProtocol.THeaderProtocol(
                    sock, [THeaderTransport.THeaderClientType.HEADERS], default_protocol=sub)
                self.transport = proto.trans
                if zlib:
                    proto.add_transform(THeaderTransport.THeaderTransformID.ZLIB)
                self._header_protocol = proto
                self._headers = dict(headers or {})
            else:
                raise ValueError("transport must be framed, unframed, header or http")
        self.client = Foqs.Client(proto)
        if transport == "header" and self._headers:
            self._send_headers_with_every_call()

    @staticmethod
    def _protocol(protocol, transport):
        if protocol == "binary":
            return TBinaryProtocol.TBinaryProtocol(transport)
        return TCompactProtocol.TCompactProtocol(transport)

    def _send_headers_with_every_call(self):
        # THeaderTransport sends its info headers with the next message only, then forgets
        # them: set them again before each call.
        proto, headers = self._header_protocol, self._headers
        for name in [n for n in dir(Foqs.Client) if n.startswith("send_")]:
            send = getattr(self.client, name)

            def wrapped(*args, _send=send, **kw):
                for k, v in headers.items():
                    proto.set_header(k, v)
                return _send(*args, **kw)

            setattr(self.client, name, wrapped)

    def __enter__(self):
        self.transport.open()
        return self.client

    def __exit__(self, *exc):
        self.transport.close()
        return False
