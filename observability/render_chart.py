#!/usr/bin/env python3
"""Draws the chart in docs/observability.md of tollgate's metrics from a real run.

It starts a redis-server of its own on a free port, starts the `metrics` example against it
(limits in Redis behind a fail-open ResilientStore), sends real HTTP traffic from 20 clients
(each from its own loopback address, so each is its own key: 16 polite ones under the limit,
4 hammering it), pauses Redis with SIGSTOP for 20 seconds in the middle (timeouts: the store
fails, the breaker opens, decisions fail open), scrapes the Prometheus endpoint every second,
and plots the same queries as the Grafana dashboard (observability/grafana/).

Reproduce (Linux: the clients bind 127.0.0.x source addresses):

    cargo build --example metrics --features metrics,redis
    pip install matplotlib
    python3 observability/render_chart.py            # about 100 s
    # writes observability/dashboard.png; --out, --seconds, --example to change

Only this script needs matplotlib; CI does not run it (the image is committed).
"""

import argparse
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis():
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def start_app(example, redis_port):
    app_addr = f"127.0.0.1:{free_port()}"
    metrics_addr = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, ADDR=app_addr, METRICS_ADDR=metrics_addr, REDIS_URL=f"redis://127.0.0.1:{redis_port}")
    proc = subprocess.Popen([example], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "http://" not in line:
        raise SystemExit(f"the example did not start: {line!r}")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, app_addr, metrics_addr


def client(app_addr, source, path, interval, stop):
    host, port = app_addr.split(":")
    while not stop.is_set():
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=2, source_address=(source, 0))
            conn.request("GET", path)
            conn.getresponse().read()
            conn.close()
        except OSError:
            pass
        stop.wait(interval)


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(metrics_addr):
    text = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=2).read().decode()
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = tuple(sorted(LABEL.findall(m.group(3) or "")))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def series(samples, name, by, where=None):
    """Sums samples of `name` by the label names `by`: {label values: [value per scrape]}."""
    keys = set()
    for s in samples:
        for (n, labels), _ in s.items():
            if n == name:
                d = dict(labels)
                if where and any(d.get(k) != v for k, v in where.items()):
                    continue
                keys.add(tuple(d.get(b, "") for b in by))
    out = {}
    for key in keys:
        values = []
        for s in samples:
            total = 0.0
            for (n, labels), v in s.items():
                if n != name:
                    continue
                d = dict(labels)
                if where and any(d.get(k) != v2 for k, v2 in where.items()):
                    continue
                if tuple(d.get(b, "") for b in by) == key:
                    total += v
            values.append(total)
        out[key] = values
    return out


def rate(values, times, window=5):
    """Per-second rate over the last `window` scrapes (a counter starts at 0 when it first appears)."""
    out = []
    for i in range(len(values)):
        j = max(0, i - window)
        dt = times[i] - times[j]
        out.append((values[i] - values[j]) / dt if dt > 0 else 0.0)
    return out


def quantile(q, buckets):
    """histogram_quantile over {le: count} (counts cumulative)."""
    items = sorted(((float("inf") if le == "+Inf" else float(le)), c) for le, c in buckets.items())
    if not items or items[-1][1] <= 0:
        return None
    rank = q * items[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in items:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0)
        prev_le, prev_c = le, c
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", default=os.path.join(ROOT, "target/debug/examples/metrics"))
    ap.add_argument("--seconds", type=int, default=100)
    ap.add_argument("--pause-at", type=int, default=35, help="when Redis is stopped (s)")
    ap.add_argument("--pause-for", type=int, default=20, help="for how long (s)")
    ap.add_argument("--out", default=os.path.join(ROOT, "observability/dashboard.png"))
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    redis, redis_port = start_redis()
    app, app_addr, metrics_addr = start_app(args.example, redis_port)
    stop = threading.Event()
    threads = []
    for i in range(2, 22):
        source = f"127.0.0.{i}"
        if i < 18:  # polite: 4 a minute to /, under the 5-a-minute limit
            t = threading.Thread(target=client, args=(app_addr, source, "/", 15.0, stop), daemon=True)
        else:  # hammering / and /search
            path = "/search" if i % 2 else "/"
            t = threading.Thread(target=client, args=(app_addr, source, path, 0.1, stop), daemon=True)
        threads.append(t)
    start = time.time()
    for t in threads:
        t.start()
    samples, times, paused = [], [], False
    try:
        while time.time() - start < args.seconds:
            now = time.time() - start
            if not paused and args.pause_at <= now < args.pause_at + args.pause_for:
                redis.send_signal(signal.SIGSTOP)
                paused = True
            elif paused and now >= args.pause_at + args.pause_for:
                redis.send_signal(signal.SIGCONT)
                paused = False
            try:
                samples.append(scrape(metrics_addr))
                times.append(now)
            except OSError as e:
                print("scrape failed:", e, file=sys.stderr)
            time.sleep(1.0)
    finally:
        stop.set()
        if paused:
            redis.send_signal(signal.SIGCONT)
        app.terminate()
        redis.terminate()

    fig, axes = plt.subplots(2, 2, figsize=(11, 6.4), sharex=True)
    shade = lambda ax: ax.axvspan(args.pause_at, args.pause_at + args.pause_for, color="0.9", zorder=0)

    ax = axes[0][0]
    for (outcome, allowed), v in sorted(series(samples, "tollgate_decisions_total", ["outcome", "allowed"]).items()):
        ax.plot(times, rate(v, times), label=f"{outcome}, allowed={allowed}")
    ax.set_title("Decisions per second by outcome\nsum by (outcome, allowed) (rate(tollgate_decisions_total))", fontsize=9)

    ax = axes[0][1]
    for (kind,), v in sorted(series(samples, "tollgate_refusals_total", ["kind"]).items()):
        ax.plot(times, rate(v, times), label=kind)
    for (route, policy), v in sorted(
        series(samples, "tollgate_decisions_total", ["route", "policy"], {"allowed": "false"}).items()
    ):
        ax.plot(times, rate(v, times), "--", label=f"refused on {route} by {policy}")
    ax.set_title("Refusals per second\nrate(tollgate_refusals_total), refused decisions by route/policy", fontsize=9)

    ax = axes[1][0]
    for (outcome,), v in sorted(series(samples, "tollgate_degraded_total", ["outcome"]).items()):
        ax.plot(times, [x * 60 for x in rate(v, times)], label=f"degraded {outcome} (per minute)")
    for (kind,), v in sorted(series(samples, "tollgate_store_errors_total", ["kind"]).items()):
        ax.plot(times, [x * 60 for x in rate(v, times)], "--", label=f"store error {kind} (per minute)")
    for (state,), v in sorted(series(samples, "tollgate_breaker_transitions_total", ["state"]).items()):
        steps = [v[i] - v[max(0, i - 1)] for i in range(len(v))]
        ax.scatter([t for t, s in zip(times, steps) if s > 0], [0 for s in steps if s > 0], marker="|", s=200,
                   label=f"breaker {state}")
    ax.set_title("Store trouble per minute\ntollgate_degraded_total, tollgate_store_errors_total, breaker", fontsize=9)
    ax.set_xlabel("seconds (grey: Redis stopped with SIGSTOP)")

    ax = axes[1][1]
    buckets = series(samples, "tollgate_store_latency_seconds_bucket", ["le"])
    for q in (0.5, 0.99):
        ys = []
        for i in range(len(times)):
            j = max(0, i - 5)
            ys.append(quantile(q, {le: v[i] - v[j] for (le,), v in buckets.items()}))
        ax.plot(times, [y * 1000 if y is not None else float("nan") for y in ys], label=f"p{int(q * 100)}")
    ax.set_title("Store latency (ms)\nhistogram_quantile(tollgate_store_latency_seconds_bucket)", fontsize=9)
    ax.set_xlabel("seconds (grey: Redis stopped with SIGSTOP)")

    for row in axes:
        for ax in row:
            shade(ax)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
            ax.tick_params(labelsize=8)
    fig.suptitle("tollgate metrics from a real run: 20 clients, Redis stopped for "
                 f"{args.pause_for} s (fail-open)", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=72)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes) from {len(samples)} scrapes")


if __name__ == "__main__":
    main()
