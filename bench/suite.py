"""The benchmark suite: lazyrt side by side with PyTorch and with the machine's limits.

Runs the C++ benchmarks of the build tree (build/bench/*_bench) and the Python workloads of this
folder (seed_step, torch_frontend, mlp_step, adamw_update, fused_rows, conv_layers, resnet_step, gpt_step,
dynamic_shapes, loop_scaling, loop_grad, distributed, peers: PyTorch/XLA and JAX), checks every peer's results against
lazyrt's before timing anything, and writes one markdown report with a summary table, and PNG
plots of the scaling studies. `make bench` runs it:

    PYTHONPATH=build/python .venv/bin/python bench/suite.py --build build \\
        --out bench/results.md --plots bench/plots [--threads 1] [--quick] [--only NAME ...] [--merge]

With --merge, the parts run (--only) replace their own sections, summary rows and times in the
report at --out, and the others stay as they were measured (bench/report.py); the header names
what was re-measured, and when.

Every peer gets the same thread count (--threads, default 1: the CPUs of a shared machine
stay comparable between runs): LAZYRT_NUM_THREADS, OPENBLAS_NUM_THREADS and OMP_NUM_THREADS
are set before any library loads, and torch.set_num_threads. Exit status 1 when any peer
disagrees with lazyrt (harness.BenchmarkError) or a benchmark fails.
"""

import argparse
import datetime
import glob
import importlib
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = ("seed_step", "torch_frontend", "programs", "mlp_step", "adamw_update", "fused_rows", "conv_layers", "resnet_step",
             "gpt_step", "dynamic_shapes", "loop_scaling", "loop_grad", "distributed", "peers")
# Run by the workloads themselves (seed_step reads replay_bench --json), not reported alone.
CPP_USED_BY_WORKLOADS = ("replay_bench",)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="the CMake build tree (default: build/)")
    p.add_argument("--out", help="write the markdown report here (default: stdout)")
    p.add_argument("--plots", help="folder for the PNG plots (default: none drawn)")
    p.add_argument("--threads", type=int, default=1, help="threads for every peer (default 1)")
    p.add_argument("--quick", action="store_true", help="few repetitions, no C++ benchmarks: a smoke run")
    p.add_argument("--only", nargs="+", choices=WORKLOADS + ("cpp",), help="run only these parts")
    p.add_argument("--merge", action="store_true",
                   help="with --out: replace only the parts run in the report there (their sections, summary rows "
                        "and times), keeping the others, and say in its header what was re-measured when")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # a workload's child process
    return p.parse_args(argv)


def pin_threads(n):
    """Every peer gets n threads and n CPUs: the thread settings, and an affinity of n CPUs that
    child processes inherit. Thread settings alone do not bound XLA's CPU runtime: torch_xla
    runs independent ops of a step on a thread pool of its own whatever
    --xla_cpu_multi_thread_eigen says (the GPT step used 1.8 s of CPU a 0.96 s step at "1
    thread" on 2 CPUs; 1.8 s a step on one)."""
    for name in ("LAZYRT_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[name] = str(n)
    os.environ.pop("LAZYRT_CACHE_DIR", None)  # no persistent cache unless a benchmark sets one
    try:
        cpus = sorted(os.sched_getaffinity(0))
        if n < len(cpus):
            os.sched_setaffinity(0, cpus[:n])
    except (AttributeError, OSError):  # no affinity on this system: the thread settings only
        pass


def cpu_line():
    """The CPUs the run may use (its affinity), as a phrase."""
    try:
        return f"on {len(os.sched_getaffinity(0))} of {os.cpu_count()} CPUs (affinity, inherited by every child process)"
    except (AttributeError, OSError):
        return "on any CPU (no affinity on this system)"


def import_lazyrt(build):
    """lazyrt from PYTHONPATH, else from the build tree's Python package."""
    try:
        importlib.import_module("lazyrt")
    except ImportError:
        sys.path.insert(0, os.path.join(build, "python"))
        importlib.import_module("lazyrt")


def machine_line():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} hardware threads"


def cpp_binaries(build):
    """The C++ benchmark binaries of the build tree not run by a workload: the "cpp" part."""
    return [os.path.basename(exe) for exe in sorted(glob.glob(os.path.join(build, "bench", "*_bench")))
            if os.path.basename(exe) not in CPP_USED_BY_WORKLOADS and os.access(exe, os.X_OK)]


def run_cpp(build):
    """[(name, markdown, seconds)] of every C++ benchmark binary not run by a workload."""
    out = []
    for name in cpp_binaries(build):
        exe = os.path.join(build, "bench", name)
        print(f"running {exe}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        r = subprocess.run([exe], capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            raise SystemExit(f"{exe} failed with status {r.returncode}")
        out.append((name, r.stdout, time.perf_counter() - t0))
    return out


def main(argv):
    args = parse_args(argv)
    if args.merge and not (args.out and os.path.exists(args.out)):
        raise SystemExit("--merge needs --out naming an existing report")
    pin_threads(args.threads)
    import_lazyrt(args.build)
    sys.path.insert(0, HERE)
    import numpy as np
    import torch
    import lazyrt as lr
    import report
    from harness import BenchmarkError, load_average, thread_settings
    torch.set_num_threads(args.threads)

    if args.child:
        if args.child[0] == "mlp-memory":
            import mlp_step
            mlp_step.child_peak_memory(args.child[1], int(args.child[2]))
            return 0
        if args.child[0] == "model-memory":
            from harness import child_model_memory
            child_model_memory(importlib.import_module(args.child[1]).workload(), args.child[2], args.child[3],
                               int(args.child[4]))
            return 0
        if args.child[0] == "model-torch-lazy":
            from harness import child_torch_lazy
            child_torch_lazy(importlib.import_module(args.child[1]).workload(), int(args.child[2]),
                             int(args.child[3]))
            return 0
        if args.child[0] == "loop-grad":
            import loop_grad
            loop_grad.child(args.child[1], int(args.child[2]))
            return 0
        if args.child[0] == "torch-frontend-lazy":
            import torch_frontend
            torch_frontend.child_lazy_probe()
            return 0
        if args.child[0] == "peers-loop":
            import peers
            peers.child_loop(args.child[1], int(args.child[2]), int(args.child[3]))
            return 0
        if args.child[0] == "gpt-xla":
            import gpt_step
            gpt_step.child_xla(int(args.child[1]))
            return 0
        if args.child[0] == "dynamic-xla":
            import dynamic_shapes
            dynamic_shapes.child_xla(args.child[1], [int(n) for n in args.child[2].split(",")])
            return 0
        if args.child[0] == "mlp-xla":
            import mlp_step
            mlp_step.child_xla(int(args.child[1]))
            return 0
        if args.child[0] == "peers-xla-step":
            import peers
            peers.child_xla_step(int(args.child[1]))
            return 0
        raise SystemExit(f"unknown child {args.child[0]}")

    parts = args.only or (WORKLOADS + (() if args.quick else ("cpp",)))
    if args.plots:
        args.plots = os.path.abspath(args.plots)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = load_average()
    results, durations = [], []
    for name in WORKLOADS:
        if name not in parts:
            continue
        print(f"running {name}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            result = __import__(name).run(args)
        except BenchmarkError as e:
            print(f"{name}: {e}", file=sys.stderr)
            return 1
        durations.append((name, f"{time.perf_counter() - t0:.0f} s"))
        results.append((name, result["summary"], result["markdown"]))
    cpp = run_cpp(args.build) if "cpp" in parts else []
    durations += [(name, f"{seconds:.0f} s") for name, _, seconds in cpp]

    title = "# Benchmarks: lazyrt against PyTorch and the machine's limits"
    measured = (f"on {started:%Y-%m-%d %H:%M} UTC. Machine: {machine_line()}; load average {load_start} at the start, "
                f"{load_average()} at the end (other processes share the CPUs: read the spreads). Python "
                f"{platform.python_version()}, PyTorch {torch.__version__}, NumPy {np.__version__}, lazyrt "
                f"{lr.__version__}.")
    threads = (f"Threads, equal for every peer: {thread_settings()}, torch.set_num_threads({torch.get_num_threads()}), "
               f"{cpu_line()}. "
               "Every peer starts from lazyrt's initial values and its results are checked against lazyrt's (stated "
               "per section) before it is timed; a mismatch fails the run. Warm-up runs are never counted. Cells: "
               "median [min, max] of repeated runs.")
    new_parts = [(name, report.summary_lines(rows), md) for name, rows, md in results]
    if cpp:
        new_parts.append(("cpp", [], "\n".join(md.rstrip() + "\n" for _, md, _ in cpp)))
    if args.merge:
        with open(args.out) as f:
            old = f.read()
        try:
            text = report.merge(old, WORKLOADS + ("cpp",),
                                f"Re-measured: {', '.join(f'`{n}`' for n, _, _ in new_parts)} (`bench/suite.py "
                                f"--only {' '.join(parts)} --merge`) " + measured, threads, durations, new_parts,
                                binaries=cpp_binaries(args.build))
        except report.ReportError as e:
            print(f"--merge: {args.out}: {e}", file=sys.stderr)
            return 1
    else:
        text = report.render(title, ["Written by `make bench` (bench/suite.py) " + measured], threads, durations,
                             new_parts)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
