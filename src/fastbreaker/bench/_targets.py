"""The developers' targets for the compiled core (``--check-targets``), as ratios to the floor.

These are the project's targets, not the user's: they are printed only with ``--check-targets``
(and always stored in ``--json``), and a missed one makes that run exit with status 1.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ._section import System

TARGETS = [
    ("allow_ns", "allow() in CLOSED", 1.15),
    ("allow_record_ns", "allow() + record_success()", 2.5),
    ("call_ns", "call(f) minus f()", 3.0),
    ("open_allow_ns", "rejection in OPEN: allow() -> False", 3.0),
    ("open_call_ns", "rejection in OPEN: call(f) raising CircuitOpenError", None),
]
# Targets of further sections, by section key: (metric, what, limit, floor). Each is a ratio to
# the same metric of that section's ``floor`` row (named by ``floor``), timeit-style as above.
SECTION_TARGETS = {
    "paths": [
        (
            "rejected_ns",
            "rejected call(f) raising CircuitOpenError",
            2.0,
            "raise E('svc', 1, 30.0), caught",
        ),
    ],
    "bulkheads": [
        (
            "try_release_ns",
            "Bulkhead try_acquire() + release()",
            2.5,
            "Floor().allow(); Floor().record_success()",
        ),
    ],
}

# Targets between two rows of the breaker section: (row, metric, what, limit, reference row,
# its label), a ratio of the same metric, loop included on both sides. A dry run must cost what
# a normal breaker costs: its limit leaves 5% for the noise between two rows of one run. (The
# texts are short: a verdict line must fit in the report's 100 columns.)
PAIR_TARGETS = [
    (
        "fastbreaker_time_window",
        "allow_record_ns",
        "time window allow+record",
        1.5,
        "fastbreaker_count_window",
        "window=100",
    ),
    ("fastbreaker_dry_run", "call_ns", "dry_run call(f)-f()", 1.05, "fastbreaker", "plain"),
    # (the shared map's target, allow(key) <= 2x the local map's over 10,000 keys, is checked by
    # benchmarks/bench_region.py, which times both maps alone, interleaved)
    ("fastbreaker_shared", "allow_ns", "SharedRegion allow()", 1.3, "fastbreaker", "local"),
]
# Targets between two rows of a further section, by section key, in ``PAIR_TARGETS``' shape.
# The rate limiters' (issue 29): every limiter admits every call, so these are admissions.
SECTION_PAIR_TARGETS = {
    "ratelimits": [
        (
            "fastbreaker",
            "try_ns",
            "RateLimiter.try_acquire()",
            1.5,
            "fastbreaker_breaker",
            "allow()",
        ),
        (
            "fastbreaker",
            "hosts_call_ns",
            "RateLimiterMap.try_acquire(key)",
            1.5,
            "fastbreaker_breaker",
            "BreakerMap.allow(key)",
        ),
        # GCRA reads the clock on every call and allow() does not: CLOCK_MONOTONIC alone costs
        # about 2x allow() (21 ns against 9.5 on the 2-core VM), so the first target cannot be
        # met by a limiter that reads it. This one is to a floor that reads it.
        (
            "fastbreaker",
            "try_ns",
            "try_acquire() vs clock read",
            1.5,
            "floor_clock",
            "Floor().now()",
        ),
        ("fastbreaker_shared", "try_ns", "shared try_acquire()", 2.0, "fastbreaker", "local"),
    ],
}


def compute_targets(
    systems: Sequence[System],
    loop_ns: float,
    sections: Optional[Mapping[str, Sequence[System]]] = None,
) -> dict[str, Any]:
    """The compiled core against the ratios its developers aim for.

    The breaker's ratios are to one floor, ``Floor().allow()``, as ``timeit`` reports it: the
    call plus one loop iteration (``loop_ns``). ``allow()`` and the rejections are taken the same
    way, loop included; ``call(f)`` minus ``f()`` is a difference, so the loop cancels out of it.
    A further section's targets (``SECTION_TARGETS``, from ``sections``: key -> its systems) are
    to its own floor row, loop included on both sides; such a check names its ``floor``.
    """
    by_key = {s.key: s.results for s in systems}
    fb, floor = by_key.get("fastbreaker"), by_key.get("floor")
    if fb is None or floor is None or floor.get("allow_ns") is None:
        return {}
    unit = floor["allow_ns"] + loop_ns
    checks = []
    for metric, what, limit in TARGETS:
        if fb.get(metric) is None:
            continue
        loop = 0.0 if metric == "call_ns" else loop_ns
        ratio = (fb[metric] + loop) / unit
        met = None if limit is None else ratio <= limit  # unrounded: what is printed may round
        checks.append(
            {"what": what, "ns": fb[metric] + loop, "x_floor": ratio, "target": limit, "met": met}
        )
    checks += _pair_checks(by_key, PAIR_TARGETS, loop_ns)
    for key, targets in SECTION_TARGETS.items():
        rows = {s.key: s.results for s in (sections or {}).get(key, ())}
        sec_fb, sec_floor = rows.get("fastbreaker"), rows.get("floor")
        if sec_fb is None or sec_floor is None:
            continue
        for metric, what, limit, floor_name in targets:
            if sec_fb.get(metric) is None or sec_floor.get(metric) is None:
                continue
            floor_ns = sec_floor[metric] + loop_ns
            ratio = (sec_fb[metric] + loop_ns) / floor_ns
            checks.append(
                {
                    "what": what,
                    "ns": sec_fb[metric] + loop_ns,
                    "x_floor": ratio,
                    "target": limit,
                    "met": ratio <= limit,
                    "floor": floor_name,
                    "floor_ns": floor_ns,
                }
            )
    for key, pairs in SECTION_PAIR_TARGETS.items():
        rows = {s.key: s.results for s in (sections or {}).get(key, ())}
        checks += _pair_checks(rows, pairs, loop_ns)
    return {"floor": "Floor().allow()", "floor_ns": unit, "loop_ns": loop_ns, "checks": checks}


def _pair_checks(
    by_key: Mapping[str, Mapping[str, Any]],
    pairs: Sequence[tuple[str, str, str, float, str, str]],
    loop_ns: float,
) -> list[dict[str, Any]]:
    """The checks of ``pairs`` (``PAIR_TARGETS``' shape) over the rows ``by_key``."""
    checks = []
    for row, metric, what, limit, ref, ref_label in pairs:
        mine, theirs = by_key.get(row, {}), by_key.get(ref, {})
        if mine.get(metric) is None or theirs.get(metric) is None:
            continue
        loop = 0.0 if metric == "call_ns" else loop_ns
        ratio = (mine[metric] + loop) / (theirs[metric] + loop)
        checks.append(
            {
                "what": what,
                "ns": mine[metric] + loop,
                "x_floor": ratio,
                "target": limit,
                "met": ratio <= limit,
                "floor": ref_label,
                "row": ref,
                "floor_ns": theirs[metric] + loop,
            }
        )
    return checks


def missed_targets(result: Mapping[str, Any]) -> list[str]:
    """The targets the compiled core missed in ``result`` (``--check-targets`` fails on them)."""
    from . import _scaling

    checks = result.get("targets", {}).get("checks", [])
    return [t["what"] for t in checks if t["met"] is False] + _scaling.missed(result)


def ratio_vs(ratio: float, limit: float) -> str:
    """``ratio`` with enough decimals that a missed target never prints as equal to it."""
    for digits in range(2, 7):
        text = f"{ratio:.{digits}f}"
        if (ratio <= limit) == (float(text) <= limit):
            return text
    return repr(ratio)


def target_lines(result: Mapping[str, Any]) -> list[str]:
    """The verdicts printed under the table with ``--check-targets`` (nothing without it)."""
    targets = result.get("targets") or {}
    if not result.get("check_targets"):
        return []
    if not targets:
        return ["--check-targets: no compiled core or no floor in this run; nothing was checked."]
    out = [
        f"--check-targets: the developers' targets for the compiled core, timeit-style (one loop "
        f"iteration, {targets['loop_ns']:.1f} ns, included); every ratio is to the floor "
        f"{targets['floor']} = {targets['floor_ns']:.1f} ns, unless the line names another:"
    ]
    for t in targets["checks"]:
        floor = targets["floor"]
        if "floor" in t:
            what = t["floor"] if "row" in t else f"the floor {t['floor']}"
            floor = f"{what} ({t['floor_ns']:.1f} ns)"
        if t["target"] is None:
            out.append(f"  {t['what']}: {t['ns']:.1f} ns = {t['x_floor']:.2f}x {floor}")
            continue
        verdict = "met" if t["met"] else "MISSED"
        out.append(
            f"  {t['what']}: {t['ns']:.1f} ns = {ratio_vs(t['x_floor'], t['target'])}x "
            f"{floor}, target <= {t['target']:g}x: {verdict}"
        )
    return out
