"""Bytes of one getHostInfo answer (the summary each peer polls every peer_poll_ms) by
the number of topics with ready items: enqueues one item to each of T topics (namespace
"default", topics "topic-000001".., priorities 0-49), then serializes the answer with
the binary and compact protocols. Run by `bash scripts/summary-bytes.sh`.

    python3 scripts/summary-bytes.py PORT T1 [T2 ...]      # increasing T
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration", "python"))
from foqs_client import Client, ttypes  # noqa: E402
from thrift.protocol import TBinaryProtocol, TCompactProtocol  # noqa: E402
from thrift.transport import TTransport  # noqa: E402


def size(info, proto):
    buf = TTransport.TMemoryBuffer()
    info.write(proto(buf))
    return len(buf.getvalue())


def main():
    port = int(sys.argv[1])
    done = 0
    with Client("127.0.0.1", port) as c:
        for target in [int(x) for x in sys.argv[2:]]:
            while done < target:
                n = min(500, target - done)
                items = [
                    ttypes.EnqueueItem(ns="default", topic="topic-%06d" % (done + i),
                                       priority=(done + i) % 50, payload=b"x")
                    for i in range(n)
                ]
                c.enqueue(ttypes.EnqueueRequest(items=items))
                done += n
            # The summary is built from the shards' counts, refreshed in the background.
            deadline = time.time() + 30
            while True:
                info = c.getHostInfo()
                ready = len(info.ready_topics or [])
                if ready >= min(target, 10000) or time.time() > deadline:
                    break
                time.sleep(0.2)
            heads = sum(len(t.heads or []) for t in (info.ready_topics or []))
            print('{"topics": %d, "ready_topics": %d, "head_keys": %d, "binary_bytes": %d, "compact_bytes": %d}'
                  % (target, ready, heads, size(info, TBinaryProtocol.TBinaryProtocol),
                     size(info, TCompactProtocol.TCompactProtocol)))


if __name__ == "__main__":
    main()
