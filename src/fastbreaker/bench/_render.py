"""Rendering: the report's result as text, Markdown and a PNG bar chart."""

from __future__ import annotations

import textwrap
from typing import Any, Mapping, Optional

from . import _mpl, _scaling
from ._format import WIDTH, fmt, ratio, times
from ._registry import SECTIONS, section_results
from ._targets import target_lines
from ._verdict import verdict_lines

Table = tuple[str, list[str], list[list[str]]]


def tables(result: Mapping[str, Any]) -> list[Table]:
    """The tables as text cells: ``(title, headers, rows)`` each, section by section."""
    m = result["method"]
    out = []
    for section, part in section_results(result):
        for title, keys in section.tables:
            headers = ["system"] + [section.header(k) for k in keys]
            rows = [[row["label"]] + [fmt(k, row.get(k)) for k in keys] for row in part["rows"]]
            rows = [r for r in rows if any(c != "-" for c in r[1:])]  # nothing measured: no row
            out.append((title.format(rounds=m["rounds"], hosts=m["hosts"]), headers, rows))
    return out


def _lines(result: Mapping[str, Any]) -> list[str]:
    """Everything under the tables: the summaries, a few notes, the targets' verdicts, and
    last fastbreaker's own figures (the methodology is ``--verbose``'s, above the tables)."""
    summary = [line for section, part in section_results(result) for line in section.summary(part)]
    scaling = _scaling.lines(result)
    verdict = verdict_lines(result)
    return (
        summary
        + ([""] + scaling if scaling else [])
        + [""]
        + _brief_notes(result)
        + target_lines(result)
        + ([""] + verdict if verdict else [])
    )


def _wrap(notes: list[str]) -> list[str]:
    out: list[str] = []
    for note in notes:
        indent = " " * (len(note) - len(note.lstrip(" ")))
        out += textwrap.wrap(note, WIDTH, subsequent_indent=indent + "  ") or [""]
    return out


def _text_table(title: str, headers: list[str], rows: list[list[str]]) -> list[str]:
    """A table within WIDTH columns: the widest headers wrapped onto lines (at spaces and after
    a ``+``) until it fits, and the columns that still do not fit continued in a second table
    (with the system column again)."""
    heads = [h.replace("+", "+ ") for h in headers]
    data = [max(len(r[i]) for r in rows) if rows else 0 for i in range(len(headers))]
    narrow = [max(data[i], max(len(w) for w in h.split())) for i, h in enumerate(heads)]
    widths = [max(data[i], len(headers[i])) for i in range(len(headers))]
    while sum(widths) + 2 * (len(widths) - 1) > WIDTH and widths != narrow:
        i = max(range(len(widths)), key=lambda c: (widths[c] - narrow[c], c))  # ties: the later
        widths[i] = narrow[i]
    parts, cols = [], [0]
    for i in range(1, len(headers)):
        if len(cols) > 1 and sum(widths[c] + 2 for c in cols) + widths[i] > WIDTH:
            parts.append(cols)
            cols = [0]
        cols.append(i)
    parts.append(cols)
    out: list[str] = []
    for n, cols in enumerate(parts):
        head = [
            [w.replace("+ ", "+") for w in textwrap.wrap(heads[c], widths[c] + 1)]
            if len(headers[c]) > widths[c]
            else [headers[c]]
            for c in cols
        ]
        depth = max(len(h) for h in head)
        head = [[""] * (depth - len(h)) + h for h in head]  # bottom-aligned

        def line(cells: list[str], cols: list[int] = cols) -> str:
            text = [cells[0].ljust(widths[0])]
            text += [cells[i].rjust(widths[c]) for i, c in enumerate(cols) if c]
            return "  ".join(text).rstrip()

        out += textwrap.wrap(title if n == 0 else f"{title} (continued)", WIDTH)
        out += [line([h[k].strip() for h in head]) for k in range(depth)]
        out.append("  ".join("-" * widths[c] for c in cols))
        out += [line([r[c] for c in cols]) for r in rows] + [""]
    return out


def format_text(result: Mapping[str, Any], verbose: bool = False) -> str:
    out: list[str] = _wrap(_method_notes(result)) + [""] if verbose else []
    for title, headers, rows in tables(result):
        out += _text_table(title, headers, rows)
    return "\n".join(out + _wrap(_lines(result)))


def format_markdown(result: Mapping[str, Any], verbose: bool = False) -> str:
    out: list[str] = []
    if verbose:
        out += _markdown_notes(_method_notes(result)) + [""]
    for title, headers, rows in tables(result):
        out += [f"**{title}**", "", "| " + " | ".join(headers) + " |"]
        out.append("|" + "|".join([" --- "] + [" ---: "] * (len(headers) - 1)) + "|")
        out += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    return "\n".join(out + _markdown_notes(_lines(result)))


def _markdown_notes(notes: list[str]) -> list[str]:
    out: list[str] = []
    for note in notes:
        if not note:
            out.append("")
            continue
        depth = (len(note) - len(note.lstrip(" "))) // 2  # two spaces a level, as in the text
        bullet = "  " * depth + "- " + note.strip()
        out += textwrap.wrap(bullet, WIDTH, subsequent_indent="  " * (depth + 1))
    return out


def _method_notes(result: Mapping[str, Any]) -> list[str]:
    """How each cell is measured and each system driven (``--verbose``, above the tables)."""
    m, mach = result["method"], result["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    parts = section_results(result)
    notes = [
        f"How this report measures (--verbose). ns per operation, median of {m['rounds']} "
        f"interleaved rounds (~{m['batch_ms']:g} ms batches, {m['unroll']}x unrolled), baseline "
        f"loop subtracted; GC {m['gc']}.",
        *(line for section, _ in parts for line in section.notes(result)),
        "one CircuitBreaker(): tracemalloc, bytes allocated while building as many standalone "
        "breakers (default options) as there are hosts, in a list, divided by their number.",
        f"{mach['platform']}; {mach['cpu']}.",
        f"versions: {versions}.",
        "how each system is driven:",
    ]
    for section, part in parts:
        for row in part["rows"]:
            how = "; ".join(f"[{section.header(k)}] {v}" for k, v in row["api"].items())
            notes.append(f"  {row['label']}: {how}")
    return notes


def _brief_notes(result: Mapping[str, Any]) -> list[str]:
    """The notes every run prints: what the numbers are, what is missing, the noise."""
    m, mach = result["method"], result["machine"]
    notes = [
        f"ns per operation, median of {m['rounds']} interleaved rounds, baseline subtracted; "
        f"--verbose prints how each cell is measured and each system driven.",
        f"{result['date']}; {mach['python']}; {mach['cpus']} CPUs.",
    ]
    for _, part in section_results(result):
        for skip in part["skipped"]:
            hint = (
                " (pip install 'fastbreaker[bench]')" if skip["reason"] == "not installed" else ""
            )
            notes.append(f"skipped {skip['label']}: {skip['reason']}{hint}")
    notes.append("Shared machines are noisy: absolute numbers vary by run, the ratios carry over.")
    if m.get("smoke"):
        notes.append(m["smoke"] + ".")
    return notes


_COLORS = {"fastbreaker": "#d62728", "fastbreaker_py": "#f4a582", "floor": "#7f7f7f"}


def plot(result: Mapping[str, Any], path: str) -> None:
    """A PNG bar chart of the table (matplotlib must be importable; see ``require_matplotlib``)."""
    plt = _mpl.pyplot()
    fig = figure(result)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(result: Mapping[str, Any]) -> Any:
    """The chart of the first section: one panel per measurement, each bar labelled with its
    ratio to its reference."""
    plt = _mpl.pyplot()
    rows = result["rows"]
    hosts = result["method"]["hosts"]
    panels = [
        (key, title.format(hosts=hosts), ref_key, ref_name)
        for key, title, ref_key, ref_name in SECTIONS[0].panels
    ]
    labels = [r["label"] for r in rows]
    height = 0.45 * len(rows) + 1.4
    fig, axes = plt.subplots(2, 2, figsize=(14, 2 * height + 1.0), sharey=True)
    by_key = {r["key"]: r for r in rows}
    for ax, (key, title, ref_key, ref_name) in zip(axes.flat, panels):
        values = [r.get(key) for r in rows]
        shown = [v if v is not None and v > 0 else 0 for v in values]
        colors = [_COLORS.get(r["key"], "#1f77b4") for r in rows]
        ax.barh(range(len(rows)), shown, color=colors)
        ax.set_title(f"{title}  (x = times {ref_name})", fontsize=10)
        ax.set_xlabel("ns per operation (shorter is faster)")
        top = max(shown) if any(shown) else 1
        ax.set_xlim(0, top * 1.5)  # room for the labels
        base = by_key.get(ref_key, {}).get(key)
        for i, v in enumerate(values):
            if v is None or v <= 0:
                ax.text(top * 0.02, i, "n/a", va="center", fontsize=9, color="#555555")
                continue
            text = f"{v:,.0f} ns" if v >= 100 else f"{v:.1f} ns"
            r = ratio(v, base)
            if r is not None and rows[i]["key"] != ref_key:
                text += f"  ({times(r)})"
            ax.text(v + top * 0.02, i, text, va="center", fontsize=9)
        ax.grid(axis="x", which="major", alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_yticks(list(range(len(rows))))
        ax.set_yticklabels(labels)
    axes[0, 0].invert_yaxis()
    mach = result["machine"]
    fig.suptitle(
        f"python -m fastbreaker: ns per operation, median of {result['method']['rounds']} rounds"
        f"\n{mach['python']}, {mach['cpu']} ({mach['cpus']} CPUs), "
        f"{result['date'][:10]}; shared machines are noisy, the ratios carry over",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def require_matplotlib() -> Optional[str]:
    """Why ``--plot`` cannot work here, or None."""
    return _mpl.missing()
