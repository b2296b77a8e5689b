"""``python -m fastbreaker overload``: the overload curve, for real.

A service of known capacity (``_overload_app``: C slots of S ms each, so C / S requests per
second) is served by uvicorn in its own process on 127.0.0.1, once without and once with
``LoadSheddingMiddleware``, and driven by an open-loop client at offered loads from 0.5x to 3x its
capacity: requests start on schedule whether or not earlier ones have answered, as real clients'
do. Each request carries a deadline (``x-request-timeout``) and gives up after it. Goodput is the
answers that arrived within their deadline, per second, as a share of the capacity.

Without shedding, goodput collapses past 1x: the queue grows, every request waits behind ones
whose clients have left, and the service spends its capacity on answers nobody reads. With the
shedder it plateaus near the capacity: what cannot be served in time is refused at once (503 with
Retry-After), and what is served is served in time.

Every run is bounded: ``--warmup`` then ``--seconds`` of sending per point, then at most one
deadline of waiting; a fresh server per point, so a backlog never leaks into the next one. Only
the requests sent after the warm-up are counted: a fresh server answers its first requests in
time before its queue builds up, which made short points flatter the run without shedding
(issue 26: 17-20% goodput at 2-3x with 1.5 s points, 2-4% with 10 s points). Needs
``pip install 'fastbreaker[asgi,httpx]'`` (and matplotlib for ``--plot``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

from . import _mpl

LOADS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
QUICK_LOADS = (0.5, 1.0, 2.0, 3.0)
TINY_LOADS = (1.0, 3.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """uvicorn serving ``_overload_app`` in a child process on 127.0.0.1."""

    def __init__(self, *, shed: bool, capacity: int, service_ms: float) -> None:
        self.port = _free_port()
        env = dict(
            os.environ,
            FB_OVERLOAD_SHED="1" if shed else "0",
            FB_OVERLOAD_CAPACITY=str(capacity),
            FB_OVERLOAD_SERVICE_MS=str(service_ms),
        )
        cmd = [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "fastbreaker.bench._overload_app:make_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            "--no-access-log",
            "--backlog",
            "4096",
        ]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        end = time.monotonic() + 30.0
        while True:  # until it listens (bounded)
            if self.proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with status {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > end:
                    self.stop()
                    raise RuntimeError("uvicorn did not start within 30 s") from None
                time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}/work"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


async def _drive(
    url: str, rate: float, seconds: float, deadline: float, warmup: float = 0.0
) -> dict[str, int]:
    """Open loop: ``rate`` requests per second for ``warmup`` + ``seconds``; count how each of
    those sent after the warm-up ends (``warmup_sent``: the others, sent and not counted)."""
    import httpx

    counts = {"sent": 0, "good": 0, "late": 0, "shed": 0, "timeout": 0, "error": 0}
    warm_tasks: list[asyncio.Future[None]] = []
    last_good = [0.0]
    headers = {"x-request-timeout": f"{deadline:.3f}"}
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)

    async def one(client: httpx.AsyncClient, tally: dict[str, int]) -> None:
        start = time.monotonic()
        try:
            r = await client.get(url, headers=headers, timeout=deadline)
        except httpx.TimeoutException:
            tally["timeout"] += 1
            return
        except httpx.HTTPError:
            tally["error"] += 1
            return
        if r.status_code == 503:
            tally["shed"] += 1
        elif r.status_code == 200 and time.monotonic() - start <= deadline:
            tally["good"] += 1
            if tally is counts:  # a warm-up answer does not stretch the time base
                last_good[0] = max(last_good[0], time.monotonic())
        elif r.status_code == 200:
            tally["late"] += 1
        else:
            tally["error"] += 1

    ignored = dict(counts)  # the warm-up's outcomes
    async with httpx.AsyncClient(limits=limits) as client:
        n_warm, n = int(rate * warmup), max(1, int(rate * seconds))
        start = time.monotonic()
        t0 = start + n_warm / rate  # the measured window starts here
        tasks = []
        for i in range(n_warm + n):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            into = ignored if i < n_warm else counts
            task = asyncio.ensure_future(one(client, into))
            if i >= n_warm:
                tasks.append(task)
            else:
                warm_tasks.append(task)
            into["sent"] += 1
        # every request has its own timeout: this wait is bounded by one deadline (plus slack)
        done, pending = await asyncio.wait(tasks + warm_tasks, timeout=deadline + 5.0)
        for t in pending:
            t.cancel()
        counts["error"] += len([t for t in pending if t not in warm_tasks])
    # goodput's time base: the sending window, or until the last good answer if that is later
    counts["elapsed_ms"] = int(1000 * max(seconds, last_good[0] - t0))
    counts["warmup_sent"] = ignored["sent"]
    return counts


def run_curve(
    *,
    loads: Sequence[float],
    seconds: float,
    capacity: int,
    service_ms: float,
    deadline_factor: float,
    warmup: float = 0.0,
    progress: Any = None,
) -> dict[str, Any]:
    """The experiment: for each mode and offered load, a fresh server and one open-loop run."""
    capacity_rps = capacity / (service_ms / 1000.0)
    deadline = deadline_factor * service_ms / 1000.0
    rows = []
    for load in loads:
        row: dict[str, Any] = {"load": load, "offered_rps": load * capacity_rps}
        for mode, shed in (("without", False), ("with", True)):
            if progress:
                progress(f"offered {load:g}x capacity, {mode} shedding")
            server = Server(shed=shed, capacity=capacity, service_ms=service_ms)
            try:
                rate = load * capacity_rps
                counts = asyncio.run(_drive(server.url, rate, seconds, deadline, warmup))
            finally:
                server.stop()
            elapsed = counts["elapsed_ms"] / 1000.0
            row[mode] = dict(counts, goodput=counts["good"] / elapsed / capacity_rps)
        rows.append(row)
    return {
        "capacity": capacity,
        "service_ms": service_ms,
        "capacity_rps": capacity_rps,
        "deadline_s": deadline,
        "seconds": seconds,
        "warmup_s": warmup,
        "rows": rows,
    }


def format_table(result: dict[str, Any]) -> str:
    """The curve as text: goodput as a share of capacity, with and without shedding."""
    out = [
        f"overload: a service of {result['capacity']} slots x {result['service_ms']:g} ms "
        f"= {result['capacity_rps']:.0f} rps; clients with a {result['deadline_s'] * 1000:.0f} ms "
        "deadline;",
        f"{result['seconds']:g} s of open-loop load per point, counted after "
        f"{result.get('warmup_s', 0):g} s of warm-up (sent, not counted: a fresh server's queue",
        "is still short), a fresh uvicorn per point",
        "goodput = answers within the deadline per second (from the first request to the last good",
        "answer), as a share of the capacity",
        "",
        f"{'offered':>8}  {'rps':>6}  {'goodput without':>15}  {'goodput with':>12}  "
        f"{'shed (503) with':>15}  {'timeouts without':>16}",
    ]
    for r in result["rows"]:
        out.append(
            f"{r['load']:>7g}x  {r['offered_rps']:>6.0f}  {r['without']['goodput']:>15.0%}  "
            f"{r['with']['goodput']:>12.0%}  {r['with']['shed']:>15,}  "
            f"{r['without']['timeout']:>16,}"
        )
    return "\n".join(out)


def plot_curve(result: dict[str, Any], path: str) -> None:
    """Goodput against offered load, with and without the shedder, as a PNG."""
    plt = _mpl.pyplot()
    loads = [r["load"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(
        loads, [r["with"]["goodput"] * 100 for r in result["rows"]], "o-", label="with LoadShedder"
    )
    ax.plot(loads, [r["without"]["goodput"] * 100 for r in result["rows"]], "s--", label="without")
    ax.plot(loads, [min(x, 1.0) * 100 for x in loads], ":", color="grey", label="ideal")
    ax.set_xlabel("offered load (x capacity)")
    ax.set_ylabel("goodput (% of capacity)")
    ax.set_ylim(0, 110)
    ax.set_title(
        f"uvicorn, {result['capacity']} x {result['service_ms']:g} ms slots, "
        f"{result['deadline_s'] * 1000:.0f} ms client deadline"
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fastbreaker overload``: run the curve and print (and plot) it."""
    parser = argparse.ArgumentParser(
        prog="python -m fastbreaker overload",
        description="Goodput against offered load (0.5x-3x capacity) of a real uvicorn service, "
        "with and without fastbreaker's LoadSheddingMiddleware.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer, shorter points")
    parser.add_argument("--plot", metavar="PATH", help="also draw the curve as a PNG")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--seconds", type=float, default=None, help="seconds of load per point")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds of load per point before counting starts (default 1)",
    )
    parser.add_argument("--capacity", type=int, default=4, help="the service's slots")
    parser.add_argument("--service-ms", type=float, default=50.0, help="ms per request")
    parser.add_argument(
        "--deadline", type=float, default=4.0, help="the client deadline, in service times"
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="a smoke run of seconds, for tests and CI: every path runs, but its numbers mean "
        "nothing",
    )
    args = parser.parse_args(argv)
    tiny = args.tiny
    loads = TINY_LOADS if tiny else QUICK_LOADS if args.quick else LOADS
    seconds = args.seconds or (0.5 if tiny else 1.5 if args.quick else 3.0)
    warmup = args.warmup if args.warmup is not None else (0.2 if tiny else 1.0)
    if args.capacity < 1 or args.service_ms <= 0 or args.deadline <= 1 or seconds <= 0:
        parser.error("--capacity >= 1, --service-ms > 0, --deadline > 1 and --seconds > 0")
    if not 0 <= warmup <= 60:
        parser.error(f"--warmup must be in [0, 60] seconds, got {warmup:g}")
    for module in ("uvicorn", "httpx"):
        try:
            __import__(module)
        except ImportError:
            print(
                f"python -m fastbreaker overload: {module} is not installed "
                "(pip install 'fastbreaker[asgi,httpx]')",
                file=sys.stderr,
            )
            return 2
    if args.plot and _mpl.missing():
        print("python -m fastbreaker overload: --plot needs matplotlib", file=sys.stderr)
        return 2

    def progress(text: str) -> None:
        print(f"[overload] {text}", file=sys.stderr, flush=True)

    result = run_curve(
        loads=loads,
        seconds=seconds,
        capacity=args.capacity,
        service_ms=args.service_ms,
        deadline_factor=args.deadline,
        warmup=warmup,
        progress=progress,
    )
    result["command"] = "python -m fastbreaker overload" + "".join(
        " " + a for a in (sys.argv[2:] if argv is None else argv)
    )
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    if args.plot:
        plot_curve(result, args.plot)
        progress(f"wrote {args.plot}")
    return 0
