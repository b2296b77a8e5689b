"""One instance of a fleet, in its own process, driven by tests/test_fleet_processes.py.

``python fleet_worker.py PORT NAMESPACE INSTANCE INTERVAL SYNC_TIMEOUT OPTIONS_JSON``: a
BreakerMap and a FleetCoordinator synced every INTERVAL seconds by a loop this worker runs
explicitly. Commands are JSON lines on stdin, one JSON reply line each on stdout.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import redis

import fastbreaker as fb
from fastbreaker.contrib.redis import FleetCoordinator


def main() -> None:
    port, namespace, instance = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    interval, sync_timeout = float(sys.argv[4]), float(sys.argv[5])
    options = json.loads(sys.argv[6])
    m = fb.BreakerMap(**options)
    client = redis.Redis(host="127.0.0.1", port=port)
    coord = FleetCoordinator(
        client, namespace=namespace, instance_id=instance, sync_timeout=sync_timeout
    )
    coord.add_map(m, "hosts")
    opened: dict[str, float] = {}
    lock = threading.Lock()
    stats: dict[str, Any] = {"max_sync": 0.0, "ok_syncs": 0, "failed_syncs": 0}

    def on_change(key: Any, old: fb.State, new: fb.State) -> None:
        if new == fb.State.OPEN:
            opened.setdefault(key, time.monotonic())

    m.on_state_change(on_change)
    stop_sync = threading.Event()

    def sync_loop() -> None:
        while not stop_sync.is_set():
            t0 = time.monotonic()
            report = coord.sync_once()
            with lock:
                stats["max_sync"] = max(stats["max_sync"], report.seconds)
                stats["ok_syncs" if report.ok else "failed_syncs"] += 1
            stop_sync.wait(max(0.0, interval - (time.monotonic() - t0)))

    threading.Thread(target=sync_loop, daemon=True).start()
    traffic: dict[str, Any] = {}

    def run_traffic(key: str, fail: bool, period: float, halt: threading.Event) -> None:
        while not halt.is_set():
            t0 = time.monotonic()
            b = m[key]
            if m.allow(key):
                probe = b.state == fb.State.HALF_OPEN
                if fail:
                    m.record_failure(key)
                else:
                    m.record_success(key)
                with lock:
                    traffic["calls"] += 1
                    traffic["probes"] += probe
            took = time.monotonic() - t0
            with lock:
                traffic["max_call"] = max(traffic["max_call"], took)
            halt.wait(period)

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        reply: dict[str, Any] = {}
        if op == "calls":
            key = cmd["key"]
            for _ in range(cmd.get("ok", 0)):
                if m.allow(key):
                    m.record_success(key)
            for _ in range(cmd.get("fail", 0)):
                if m.allow(key):
                    m.record_failure(key)
            reply = {"last": time.monotonic()}
        elif op == "state":
            b = m.get(cmd["key"])
            reply = {
                "state": int(b.state) if b is not None else 0,
                "opened": opened.get(cmd["key"]),
            }
        elif op == "traffic":
            halt = threading.Event()
            thread = threading.Thread(
                target=run_traffic,
                args=(cmd["key"], cmd.get("fail", False), cmd.get("period", 0.005), halt),
                daemon=True,
            )
            traffic.update(halt=halt, thread=thread, calls=0, probes=0, max_call=0.0)
            thread.start()
        elif op == "stop_traffic":
            traffic["halt"].set()
            traffic["thread"].join(10)
            with lock:
                reply = {k: traffic[k] for k in ("calls", "probes", "max_call")}
        elif op == "stats":
            metrics = coord.metrics()
            with lock:
                reply = dict(stats)
            reply.update(
                syncs=metrics.syncs,
                failures=metrics.fleet_sync_failures,
                degraded=metrics.fleet_degraded,
            )
        elif op == "quit":
            stop_sync.set()
            print(json.dumps({}), flush=True)
            return
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
