"""The report bench/suite.py writes (bench/results.md), as parts that can be put together again.

A report is a header (title, when and where it was measured, threads, time per part), the
summary table, and the sections of each part (a workload of bench/, or "cpp": the C++
benchmarks' own reports), in the suite's order. Two HTML comments, invisible when the markdown
is shown, make it parseable: after the summary table, how many of its rows each part gave;
before each part's sections, the part's name. With them, `suite.py --only PART ... --merge`
re-measures some parts and replaces only theirs (sections, summary rows, time) in an existing
report, naming what was re-measured and when in the header, so that no figure is ever copied
by hand.
"""

import re

from harness import table

PART_MARK = "<!-- bench/suite.py part: {} -->"
ROWS_MARK = "<!-- bench/suite.py summary rows: {} -->"
SUMMARY_HEADER = ["workload", "lazyrt path", "lazyrt", "unit", "peer or limit", "peer", "ratio"]
SUMMARY_ALIGN = "lllllrr"
_PART_RE = re.compile(r"^<!-- bench/suite\.py part: (\S+) -->$")
_ROWS_RE = re.compile(r"^<!-- bench/suite\.py summary rows: (.*) -->$")


class ReportError(ValueError):
    """The report cannot be merged into (written by an older suite, or measured otherwise)."""


def summary_lines(rows):
    """The markdown lines of summary rows (what harness.table writes for them)."""
    return table(SUMMARY_HEADER, rows, SUMMARY_ALIGN).splitlines()[2:]


def render(title, measured, threads, durations, parts):
    """The report. measured: the paragraphs saying when it was measured (the first from the
    whole run, then any re-measurements); durations: [(part or binary, 'N s')]; parts: [(name,
    summary row lines, markdown)] in the suite's order."""
    head = table(SUMMARY_HEADER, [], SUMMARY_ALIGN)
    rows = [line for _, lines, _ in parts for line in lines]
    counts = ", ".join(f"{name} {len(lines)}" for name, lines, _ in parts)
    out = [title + "\n"] + [m + "\n" for m in measured] + [
        threads + "\n",
        f"Time per part: {', '.join(f'{n} {t}' for n, t in durations)}.\n",
        "## Summary\n",
        "ratio = peer / lazyrt (for a limit: the limit's time over lazyrt's, the share of the limit reached).\n",
        "\n".join([head] + rows) + "\n",
        ROWS_MARK.format(counts) + "\n",
    ]
    for name, _, markdown in parts:
        out += [PART_MARK.format(name) + "\n", markdown.rstrip() + "\n"]
    return "\n".join(out).rstrip() + "\n"


def parse(text):
    """(title, measured paragraphs, threads paragraph, durations, parts) of a report render()
    wrote; ReportError for one without the part marks."""
    lines = text.split("\n")
    try:
        summary_at = lines.index("## Summary")
    except ValueError:
        raise ReportError("the report has no '## Summary'") from None
    paragraphs = [p.strip() for p in "\n".join(lines[:summary_at]).split("\n\n") if p.strip()]
    if len(paragraphs) < 4 or not paragraphs[0].startswith("# ") or not paragraphs[-1].startswith("Time per part: "):
        raise ReportError("the report's header is not the suite's (title, when, threads, time per part)")
    title, measured, threads = paragraphs[0], paragraphs[1:-2], paragraphs[-2]
    durations = []
    for entry in paragraphs[-1][len("Time per part: "):].rstrip(".").split(", "):
        name, _, seconds = entry.partition(" ")
        durations.append((name, seconds))
    rest = lines[summary_at + 1:]
    table_at = next((i for i, line in enumerate(rest) if line.startswith("|")), None)
    if table_at is None:
        raise ReportError("the report has no summary table")
    end = table_at
    while end < len(rest) and rest[end].startswith("|"):
        end += 1
    rows = rest[table_at + 2:end]
    mark_at = next((i for i in range(end, len(rest)) if _ROWS_RE.match(rest[i])), None)
    if mark_at is None:
        raise ReportError("the report has no summary row counts: it was written before reports could be merged")
    counts = []
    for entry in _ROWS_RE.match(rest[mark_at]).group(1).split(", "):
        name, _, n = entry.partition(" ")
        counts.append((name, int(n)))
    if sum(n for _, n in counts) != len(rows):
        raise ReportError(f"the summary has {len(rows)} rows, its counts say {sum(n for _, n in counts)}")
    sections, current = {}, None
    for line in rest[mark_at + 1:]:
        m = _part_of(line)
        if m:
            current = m
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    parts, i = [], 0
    for name, n in counts:
        parts.append((name, rows[i:i + n], "\n".join(sections.pop(name, [])).strip()))
        i += n
    parts += [(name, [], "\n".join(body).strip()) for name, body in sections.items()]
    return title, measured, threads, durations, parts


def _part_of(line):
    m = _PART_RE.match(line)
    return m.group(1) if m else None


def merge(old_text, order, new_measured, threads, new_durations, new_parts, binaries=()):
    """old_text with the parts of new_parts ([(name, row lines, markdown)]) replaced or added in
    `order` (the suite's part names), their durations replaced (a part's, or for "cpp" those of
    the C++ binaries, `binaries`), and new_measured added to the header, naming them; any
    earlier re-measurement paragraph of the same parts drops their names. ReportError when the
    old report was measured with other thread settings."""
    title, measured, old_threads, durations, parts = parse(old_text)
    if old_threads != threads:
        raise ReportError(f"the report was measured with other threads:\n  {old_threads}\nnot\n  {threads}")
    new_names = [name for name, _, _ in new_parts]
    replaced = set(new_names) | ({b for b in binaries} if "cpp" in new_names else set())
    by_name = {name: (name, rows, md) for name, rows, md in parts}
    by_name.update({name: (name, rows, md) for name, rows, md in new_parts})
    merged_parts = [by_name[n] for n in order if n in by_name] + [p for n, p in by_name.items() if n not in order]
    kept = [(n, t) for n, t in durations if n not in replaced]
    added = dict(new_durations)
    rank = {n: i for i, n in enumerate(order)}

    def position(name):
        return rank.get(name, rank.get("cpp", len(order)))
    merged_durations = sorted(kept + list(added.items()), key=lambda d: position(d[0]))
    remeasured = [m for m in measured[1:] if m.startswith("Re-measured")]
    others = [m for m in measured[1:] if not m.startswith("Re-measured")]
    kept_remeasured = []
    for m in remeasured:
        names = re.match(r"Re-measured: (.*?) \(", m)
        if names:
            left = [n for n in names.group(1).replace("`", "").split(", ") if n not in new_names]
            if not left:
                continue
            m = m.replace(names.group(1), ", ".join(f"`{n}`" for n in left), 1)
        kept_remeasured.append(m)
    return render(title, measured[:1] + others + kept_remeasured + [new_measured], threads, merged_durations,
                  merged_parts)
