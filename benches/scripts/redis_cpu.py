"""Redis CPU per decision: usec_per_call of the script command from `INFO commandstats`.

usage: redis_cpu.py PORT SIDE N KEYS

Sends N sequential (uncoalesced: one decision per call, one call in flight) EVALSHA calls of
tollgate's decision script, in the argument layout src/store/redis/wire.rs sends for one
request of one policy (the state key and its override key, ARGV[1] "" so the script reads
TIME, ARGV[2] the policy, the state's policy index and the request as one binary string), on KEYS distinct keys with a quota no request reaches, after a warm-up that creates
every key; then prints one line of JSON with Redis's own usec_per_call for EVALSHA (after
CONFIG RESETSTAT, so only the measured calls count). SIDE: tollgate_fixed,
tollgate_swc, tollgate_gcra, tollgate_bucket, or trivial (`return 1` with the same keys and
arguments: the cost of a script call itself); each of them prefixed with fcall_ runs the same
text as a Redis Functions library called with FCALL (Redis 7+). The script is the concatenation
src/store/redis/script.rs builds (TOLLGATE_SCRIPT: a file holding it). before_fixed,
before_swc, before_gcra, before_bucket send BEFORE_SCRIPT (the script of an earlier commit)
the earlier argument layout (each policy parameter a decimal argument).

BATCH=<b> (tollgate and trivial sides only): each call decides b requests on b distinct
keys (the general path of decide.lua, as a coalesced batch of one policy sends it: the
policy, b state policy indices and b requests as three arguments), so N calls make N * b
decisions; KEYS is then ignored (the b keys of a call are the same in every call).
"""
import json
import os
import socket
import struct
import sys

ALGORITHMS = {"swc": 1, "bucket": 3, "fixed": 4, "gcra": 5}


def connect(port):
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

    return call


def main():
    port, side, n, nkeys = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    call = connect(port)
    before = side.startswith("before_")
    script = os.environ["BEFORE_SCRIPT" if before else "TOLLGATE_SCRIPT"] if side != "trivial" else None
    source = open(script).read() if script else "return 1"
    # fcall_<side>: the same script as a Redis Functions library (Redis 7+), called with FCALL:
    # the whole text is the body of one registered function.
    fcall = side.startswith("fcall_")
    if fcall:
        side = side[len("fcall_"):]
        if side == "trivial":
            source = "return 1"
        else:
            source = open(os.environ["TOLLGATE_SCRIPT"]).read()
        library = ("#!lua name=tollgate_bench\nlocal function decide(KEYS, ARGV)\n" + source +
                   "\nend\nredis.register_function{function_name='tollgate_bench_decide', callback=decide}\n")
        call("FUNCTION", "LOAD", "REPLACE", library)
    sha = call("SCRIPT", "LOAD", source).decode()
    alg = ALGORITHMS.get(side.split("_", 1)[-1], 1)
    limit, window = 10**12, 3_600_000
    # One policy: algorithm id, limit, window ms, capacity, max delay ms.
    request = struct.pack("<I", 1) + struct.pack("<BIId", 1, 1, 1, 1.0)
    batch = int(os.environ.get("BATCH", "0"))
    if batch:
        assert not before
        nkeys = batch
        requests = b"".join(struct.pack("<BIId", 1, 1, k + 1, 1.0) for k in range(batch))
        args = ["", struct.pack("<5d", alg, limit, window, limit, 0), struct.pack("<I", 1) * batch, requests]
    elif before:
        # The layout of be00374: five decimal parameters, then the two binary strings.
        args = ["", 1, alg, limit, window, limit, 0, request[:4], request[4:]]
    else:
        args = ["", struct.pack("<5d", alg, limit, window, limit, 0) + request]
    keys = [f"cpubench{os.getpid()}:{side}:{k}" for k in range(nkeys)]

    def decide(k):
        if batch:
            reply = call("EVALSHA", sha, 2 * batch, *keys, *[k + ":ovr" for k in keys], *args)
            if side != "trivial" and not os.environ.get("NOCHECK"):
                assert isinstance(reply, bytes) and len(reply) == 34 * batch, reply
                assert all(reply[34 * j:34 * j + 2] == b"\x01\x01" for j in range(batch)), reply
            return
        if fcall:
            reply = call("FCALL", "tollgate_bench_decide", 2, keys[k], keys[k] + ":ovr", *args)
        else:
            reply = call("EVALSHA", sha, 2, keys[k], keys[k] + ":ovr", *args)
        if side != "trivial" and not os.environ.get("NOCHECK"):
            assert isinstance(reply, bytes) and reply[:2] == b"\x01\x01", reply

    if os.environ.get("WARM_SCRIPT"):
        # Experiments: keys created by another script, then the measured one.
        warm_sha = call("SCRIPT", "LOAD", open(os.environ["WARM_SCRIPT"]).read()).decode()
        for k in range(nkeys):
            call("EVALSHA", warm_sha, 2, keys[k], keys[k] + ":ovr", *args)
    for k in range(nkeys):
        decide(k)
    call("CONFIG", "RESETSTAT")
    for i in range(n):
        decide(i % nkeys)
    stats = call("INFO", "commandstats").decode()
    commands = {}
    for line in stats.splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_"):].split(":", 1)
            fields = dict(f.split("=") for f in rest.split(","))
            commands[name] = {"calls": int(fields["calls"]), "usec_per_call": float(fields["usec_per_call"])}
    command = "fcall" if fcall else "evalsha"
    print(json.dumps({"side": side, "usec_per_call": commands[command]["usec_per_call"],
                      "calls": commands[command]["calls"], "commands": commands}))


if __name__ == "__main__":
    main()
