"""Drives a redis-server with batches of tollgate's decision script (see redis_instructions.sh).

usage: redis_instructions.py PORT SCRIPT BATCHES REQUESTS distinct|hot

Each batch is one EVALSHA of REQUESTS sliding-window-counter requests charging 1 unit, on
REQUESTS distinct keys or all on one key, in the argument layout of lua/decide.lua. With
SCRIPT "trivial" the same keys and arguments go to `return 1` instead (the cost of the call
itself).
"""
import socket
import struct
import sys

port, script, batches, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
hot = sys.argv[5] == "hot"
sock = socket.create_connection(("127.0.0.1", port))
replies = sock.makefile("rb")


def read():
    line = replies.readline()
    kind, rest = line[:1], line[1:-2]
    if kind in (b"+", b":"):
        return rest
    if kind == b"-":
        raise RuntimeError(line.decode(errors="replace"))
    if kind == b"$":
        size = int(rest)
        return None if size < 0 else replies.read(size + 2)[:-2]
    if kind == b"*":
        return [read() for _ in range(int(rest))]
    raise RuntimeError(f"unexpected reply {line!r}")


def call(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    sock.sendall(b"".join(out))
    return read()


source = "return 1" if script == "trivial" else open(script).read()
sha = call("SCRIPT", "LOAD", source).decode()
limit, window = 100_000_000, 1_000
states = 1 if hot else n
keys = [f"bench{{x}}:{i}" for i in range(states)]
# One policy: sliding window counter (id 1), limit, window ms, capacity, max delay.
args = ["", 1, 1, limit, window, limit, 0]
args.append(struct.pack("<I", 1) * states)
args.append(b"".join(struct.pack("<BIId", 1, 1, (0 if hot else r) + 1, 1.0) for r in range(n)))
for _ in range(batches):
    reply = call("EVALSHA", sha, states, *keys, *args)
    if script != "trivial":
        # Per request: allowed (i8), then allowed (i8) and four f64 for its one policy.
        assert isinstance(reply, bytes) and len(reply) == 34 * n and reply[0] == 1, reply[:34]
