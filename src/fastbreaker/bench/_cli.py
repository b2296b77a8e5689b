"""The command line: ``python -m fastbreaker [--quick] [--json PATH] [--plot PATH] ...``, and
``python -m fastbreaker overload [--quick] [--plot PATH]`` (``--tiny`` for either: a smoke run)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from .._version import __version__
from ._render import format_markdown, format_text, plot, require_matplotlib
from ._run import Progress, run_report
from ._targets import missed_targets


def _core_name() -> str:
    import fastbreaker

    return "compiled core" if fastbreaker.COMPILED else "pure-Python core"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fastbreaker``: run the headline benchmark and print the table;
    ``python -m fastbreaker overload ...``: the overload curve (``_overload``)."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["overload"]:
        from ._overload import main as overload_main

        return overload_main(args_in[1:])
    parser = argparse.ArgumentParser(
        prog="python -m fastbreaker",
        description="Measure fastbreaker against its pure-Python twin, every installed peer and "
        "the floor (an empty Cython method call), on this machine, in this run.",
        epilog="A full run takes 1.5-2 minutes on 2 cores (85 s and 116 s measured on a shared "
        "machine; the verdict at the end gives each run's time). The library starts no thread; on a "
        "free-threaded build the scaling rows run 1 and 2 threads of the benchmark's own, joined "
        "before it goes on. Peers: "
        "pip install 'fastbreaker[bench]'. --verbose prints how each cell is measured. "
        "`python -m fastbreaker overload --help`: the overload curve of a real uvicorn service.",
    )
    parser.add_argument(
        "--version", action="version", version=f"fastbreaker {__version__} ({_core_name()})"
    )
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (seconds)")
    parser.add_argument(
        "--json", metavar="PATH", help="also write the results as JSON to PATH ('-': stdout)"
    )
    parser.add_argument(
        "--plot", metavar="PATH", help="also draw the table as a PNG bar chart (needs matplotlib)"
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print how each cell is measured and each system driven (above the tables)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--check-targets",
        action="store_true",
        help="also check the compiled core against the developers' targets (ratios to "
        "Floor().allow()); exit with status 1 when one is missed",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="a smoke run of seconds, for tests and CI: every row and output path runs, but its "
        "numbers mean nothing (2 rounds of 0.5 ms batches, 500 hosts)",
    )
    hidden = argparse.SUPPRESS  # the tiny run's knobs, one by one
    parser.add_argument("--rounds", type=int, default=None, help=hidden)
    parser.add_argument("--batch-ms", type=float, default=None, help=hidden)
    parser.add_argument("--hosts", type=int, default=None, help=hidden)
    args = parser.parse_args(argv)
    tiny = args.tiny
    if tiny:
        args.rounds = args.rounds or 2
        args.batch_ms = args.batch_ms or 0.5
    if args.hosts is None:
        args.hosts = 500 if tiny else 10_000
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.hosts < 1:
        parser.error("--hosts must be >= 1")
    if args.plot:
        problem = require_matplotlib()
        if problem:
            print(f"python -m fastbreaker: {problem}", file=sys.stderr)
            return 2

    progress = Progress(sys.stderr, quiet=args.quiet)
    result = run_report(
        quick=args.quick,
        rounds=args.rounds,
        batch_ms=args.batch_ms,
        hosts=args.hosts,
        tiny=tiny,
        progress=progress,
    )
    if tiny:
        result["method"]["smoke"] = "--tiny: a smoke run, its numbers mean nothing"
    result["command"] = "python -m fastbreaker" + "".join(
        " " + a for a in (sys.argv[1:] if argv is None else argv)
    )
    result["check_targets"] = args.check_targets
    if args.json == "-":
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        fmt = format_markdown if args.markdown else format_text
        print(fmt(result, verbose=args.verbose))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(result, fh, indent=2)
                fh.write("\n")
            progress(f"wrote {args.json}")
    if args.plot:
        plot(result, args.plot)
        progress(f"wrote {args.plot}")
    if args.check_targets:
        missed = missed_targets(result)
        if not result.get("targets"):
            print(
                "python -m fastbreaker: --check-targets needs the compiled core and the floor",
                file=sys.stderr,
            )
            return 1
        if missed:
            print(f"python -m fastbreaker: targets missed: {'; '.join(missed)}", file=sys.stderr)
            return 1
    return 0
