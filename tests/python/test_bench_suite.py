"""bench/suite.py runs end to end in its quick mode: the peers agree with lazyrt and a report
comes out, and --merge replaces only the parts it ran. A smoke test of the benchmark code, not a
measurement."""

import os
import subprocess
import sys

import pytest

import lazyrt

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
SUITE = os.path.join(BENCH, "suite.py")
# The build tree of the lazyrt under test (its bench/ holds the C limits and Gloo's benchmark).
BUILD = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(lazyrt.__file__))))


def test_quick_suite_checks_its_peers_and_writes_a_report(tmp_path):
    out = tmp_path / "results.md"
    # Inductor compiles its C++ kernels with g++ from a fresh cache: tens of seconds on a loaded machine.
    r = subprocess.run([sys.executable, SUITE, "--quick", "--only", "seed_step", "loop_scaling", "torch_frontend",
                        "--out", str(out), "--plots", str(tmp_path / "plots")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    report = out.read_text()
    assert "## Summary" in report
    assert "### The step's kernels besides its products" in report and "kernels reach 70% of their limit" in report
    assert "PyTorch eager (Python)" in report
    assert "TorchScript scripted loop" in report
    seed = report.split("## Seed step")[1].split("### ")[0]
    assert_compiled_rows(seed, 'torch.compile(backend="lazyrt") (torch Linear and AdamW)',
                         "torch.compile (Inductor, its default backend) (torch Linear and AdamW)",
                         "| PyTorch eager (Python) |")
    assert '| seed step (Python, torch model) | torch.compile(backend="lazyrt") |' in report
    assert (tmp_path / "plots" / "while_loop_scaling.png").stat().st_size > 0

    # torch._lazy aborts its process on the transformer layer step in some PyTorch builds: the
    # suite still succeeds, and the row gives either figures or why there are none. The same for
    # Inductor, which compiles C++ with g++ at run time (tens of seconds on a loaded machine).
    assert "| PyTorch eager |" in report
    section = report.split("## Transformer encoder layer")[1]
    assert_compiled_rows(section, 'torch.compile(backend="lazyrt")', "torch.compile (Inductor, its default backend)",
                         "| PyTorch eager |")
    assert '| transformer layer step d64 h4, batch 8x16 | torch.compile(backend="lazyrt") |' in report
    row = [line for line in report.splitlines() if line.startswith("| PyTorch lazy tensors (torch._lazy")]
    assert row, report
    assert "failed" in row[-1] or row[-1].split("|")[2].strip()[0].isdigit(), row
    if "failed" in row[-1]:
        assert "no figures, it failed on this step" in report

    # The C limits and the distributed workload (tiny sizes), merged into that report.
    # Registered only where the benchmarks are built (tests/python/tests.cmake).
    assert os.path.exists(os.path.join(BUILD, "bench", "liblazyrt_limits.so")), f"the benchmarks are not built in {BUILD}"
    r = subprocess.run([sys.executable, SUITE, "--build", BUILD, "--quick", "--only", "adamw_update", "distributed",
                        "--merge", "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    merged = out.read_text()
    assert merged.startswith(report.split("## Summary")[0].split("\n\nThreads")[0])  # the first run's header
    assert "Re-measured: `adamw_update`, `distributed` (`bench/suite.py --only adamw_update distributed --merge`)" \
        in merged
    for kept in ("## Seed step", "## while_loop, unrolled host loop", "| seed step (Python) |"):
        assert merged.count(kept) == report.count(kept) >= 1, kept
    assert "| AdamW's update in C (the limit) |" in merged
    assert "| triad | 12 |" in merged and "| copy | 8 |" in merged
    assert "| AdamW update: bandwidth limit | lazyrt replayed |" in merged
    assert "| Gloo directly (C++) |" in merged and "| torch.distributed (gloo) |" in merged
    assert "| all-reduce of 100,000 f32, 2 processes | lazyrt in place (replayed) |" in merged
    # A row for 1 and 2 processes in the step table and in the table of where the added time goes.
    assert "| processes | step without all-reduce, ms |" in merged and "| processes | added (median above), ms |" in merged
    distributed = merged.split("<!-- bench/suite.py part: distributed -->")[1]
    dp_rows = [line for line in distributed.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert len(dp_rows) == 4, merged
    assert "Time per part: seed_step" in merged and "distributed" in merged.split("Time per part:")[1].split("\n")[0]


def test_merge_replaces_only_the_parts_run_and_refuses_other_threads():
    sys.path.insert(0, BENCH)
    try:
        import report
    finally:
        sys.path.remove(BENCH)
    threads = "Threads, equal for every peer: LAZYRT_NUM_THREADS=1."
    row = ("w", "lazyrt", "1.00", "ms", "peer", "2.00", "2.00x")
    old = report.render("# Title", ["Written by `make bench` on day 1."], threads,
                        [("a", "3 s"), ("b", "4 s"), ("x_bench", "5 s")],
                        [("a", report.summary_lines([row, row]), "## A\n\nold a"),
                         ("b", report.summary_lines([row]), "## B\n\nold b"),
                         ("cpp", [], "## X\n\nold x")])
    order = ("a", "b", "c", "cpp")
    new_row = ("w", "lazyrt", "9.00", "ms", "peer", "8.00", "0.89x")
    merged = report.merge(old, order, "Re-measured: `b`, `c` (`--only b c --merge`) on day 2.", threads,
                          [("b", "6 s"), ("c", "7 s")],
                          [("b", report.summary_lines([new_row]), "## B\n\nnew b"),
                           ("c", report.summary_lines([new_row, new_row]), "## C\n\nnew c")])
    assert "old a" in merged and "old x" in merged and "new b" in merged and "new c" in merged
    assert "old b" not in merged
    assert merged.index("## A") < merged.index("## B") < merged.index("## C") < merged.index("## X")
    assert merged.count("| 1.00 |") == 2 and merged.count("| 9.00 |") == 3
    assert "Time per part: a 3 s, b 6 s, c 7 s, x_bench 5 s." in merged
    assert "Written by `make bench` on day 1.\n\nRe-measured: `b`, `c`" in merged
    title, measured, _, _, parts = report.parse(merged)
    assert [name for name, _, _ in parts] == ["a", "b", "c", "cpp"]
    assert [len(rows) for _, rows, _ in parts] == [2, 1, 2, 0]
    # A later re-measurement of c alone leaves b named in the earlier one.
    again = report.merge(merged, order, "Re-measured: `c` (`--only c --merge`) on day 3.", threads, [("c", "1 s")],
                         [("c", [], "## C\n\nnewer c")])
    assert "Re-measured: `b` (`--only b c --merge`) on day 2." in again and "on day 3." in again
    assert report.parse(again)[4][2] == ("c", [], "## C\n\nnewer c")
    with pytest.raises(report.ReportError, match="other threads"):
        report.merge(old, order, "Re-measured: `b` on day 2.", threads.replace("=1", "=2"), [], [])
    with pytest.raises(report.ReportError, match="before reports could be merged"):
        report.merge(old.replace("<!-- bench/suite.py summary rows", "<!-- "), order, "x", threads, [], [])
    # The committed reports can be merged into, and parse into the suite's parts.
    for name in ("results.md", "results-2-threads.md"):
        with open(os.path.join(BENCH, name)) as f:
            text = f.read()
        if name == "results.md" or report.ROWS_MARK.split(":")[0] in text:
            parts = report.parse(text)[4]
            assert [p for p, _, _ in parts] == [p for p in suite_parts() if p in {q for q, _, _ in parts}], name
            assert report.render(*report.parse(text)) == text


def suite_parts():
    sys.path.insert(0, BENCH)
    try:
        import suite
    finally:
        sys.path.remove(BENCH)
    return suite.WORKLOADS + ("cpp",)


def assert_compiled_rows(section, dynamo, inductor, eager):
    """torch.compile's rows in a workload's section: lazyrt's Dynamo backend with figures, its ratio
    to eager and its first call; Inductor's with figures and a first call, or failed and why."""
    timed = section.split("| path | first call, ms |")[0]
    rows = {line.split("|")[1].strip(): line for line in timed.splitlines() if line.startswith("| ")}
    assert eager in section
    for name in (dynamo, inductor):
        assert name in rows, (name, section)
    cells = [c.strip() for c in rows[dynamo].split("|")[1:-1]]
    assert cells[1][0].isdigit() and cells[-1].endswith("x"), rows[dynamo]  # us per step, ratio to eager
    first_calls = section.split("| path | first call, ms |")[1]
    assert f"| {dynamo} | " in first_calls
    if "failed" in rows[inductor]:
        assert f"{inductor}: no figures, it cannot run here" in section
    else:
        assert rows[inductor].split("|")[2].strip()[0].isdigit(), rows[inductor]
        assert f"| {inductor} | " in first_calls


def test_quick_fused_rows_reports_each_workload_against_its_limit(tmp_path):
    out = tmp_path / "fused_rows.md"
    r = subprocess.run([sys.executable, SUITE, "--build", BUILD, "--quick", "--only", "fused_rows", "--out", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    for workload in ("layer norm", "softmax, written out", "row MSE"):
        assert f"| {workload} | " in text and f"| {workload}: bandwidth limit | lazyrt replayed |" in text, workload
    assert text.count("| the limit: a C copy of the same bytes |") == 3
    assert "| workload | modules | kernels | compile ms | ms per kernel |" in text
