"""Rendering: the report's result as text, Markdown and a PNG bar chart."""

from __future__ import annotations

import textwrap
from typing import Any, Mapping, Optional

from . import _mpl, _scaling
from ._format import WIDTH, fmt, ratio, times
from ._registry import SECTIONS, section_results
from ._targets import target_lines

Table = tuple[str, list[str], list[list[str]]]


def tables(result: Mapping[str, Any]) -> list[Table]:
    """The tables as text cells: ``(title, headers, rows)`` each, section by section."""
    m = result["method"]
    out = []
    for section, part in section_results(result):
        for title, keys in section.tables:
            headers = ["system"] + [section.header(k) for k in keys]
            rows = [[row["label"]] + [fmt(k, row.get(k)) for k in keys] for row in part["rows"]]
            out.append((title.format(rounds=m["rounds"], hosts=m["hosts"]), headers, rows))
    return out


def _lines(result: Mapping[str, Any]) -> list[str]:
    """Everything under the tables: the summaries, the notes, the targets' verdicts."""
    summary = [line for section, part in section_results(result) for line in section.summary(part)]
    scaling = _scaling.lines(result)
    return (
        summary + ([""] + scaling if scaling else []) + [""] + _notes(result) + target_lines(result)
    )


def format_text(result: Mapping[str, Any]) -> str:
    out: list[str] = []
    for title, headers, rows in tables(result):
        widths = [max(len(r[i]) for r in [headers] + rows) for i in range(len(headers))]

        def line(cells: list[str], widths: list[int] = widths) -> str:
            first = [cells[0].ljust(widths[0])]
            return "  ".join(first + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])

        out += [title, line(headers), "  ".join("-" * w for w in widths)]
        out += [line(r) for r in rows] + [""]
    for note in _lines(result):
        indent = " " * (len(note) - len(note.lstrip(" ")))
        out += textwrap.wrap(note, WIDTH, subsequent_indent=indent + "  ") or [""]
    return "\n".join(out)


def format_markdown(result: Mapping[str, Any]) -> str:
    out: list[str] = []
    for title, headers, rows in tables(result):
        out += [f"**{title}**", "", "| " + " | ".join(headers) + " |"]
        out.append("|" + "|".join([" --- "] + [" ---: "] * (len(headers) - 1)) + "|")
        out += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    for note in _lines(result):
        if not note:
            out.append("")
            continue
        depth = (len(note) - len(note.lstrip(" "))) // 2  # two spaces a level, as in the text
        bullet = "  " * depth + "- " + note.strip()
        out += textwrap.wrap(bullet, WIDTH, subsequent_indent="  " * (depth + 1))
    return "\n".join(out)


def _notes(result: Mapping[str, Any]) -> list[str]:
    m, mach, th = result["method"], result["machine"], result["threads"]
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    parts = section_results(result)
    notes = [
        f"ns per operation, median of {m['rounds']} interleaved rounds (~{m['batch_ms']:g} ms "
        f"batches, {m['unroll']}x unrolled), baseline loop subtracted; GC {m['gc']}.",
        *(line for section, _ in parts for line in section.notes(result)),
        f"threading.active_count(): {th['before']} before, {th['after']} after.",
        f"{result['date']}; {mach['python']}; {mach['platform']}; "
        f"{mach['cpu']} ({mach['cpus']} CPUs).",
        f"versions: {versions}.",
        "how each system is driven:",
    ]
    for section, part in parts:
        for row in part["rows"]:
            how = "; ".join(f"[{section.header(k)}] {v}" for k, v in row["api"].items())
            notes.append(f"  {row['label']}: {how}")
    for _, part in parts:
        for skip in part["skipped"]:
            hint = (
                "  (pip install 'fastbreaker[bench]')" if skip["reason"] == "not installed" else ""
            )
            notes.append(f"  skipped {skip['label']}: {skip['reason']}{hint}")
    notes.append(
        "Shared machines are noisy: absolute numbers vary from run to run, the ratios carry over."
    )
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
