"""lazyrt beside the peers a user would pick instead, on the two seed programs: PyTorch/XLA
(torch_xla 2.9.0, PJRT_DEVICE=CPU) and JAX (0.10, jit on the CPU). `make bench` installs them
(bench/install_peers.sh: bench/requirements.txt into the project's environment,
bench/requirements-jax.txt into .venv-jax, as jax 0.10 needs numpy>=2); a peer that is not
installed or cannot run gets a row saying why, and the rest goes on.

1. The counter loop (examples/seed/while_loop_counter.py, torch_while_loop.py): the seed itself
   on torch_xla (`torch._higher_order_ops.while_loop(cond_fn, body_fn, (iteri, init_val))`, count
   down from 10 while adding 1 to 3: 13), then c = 0 (i64), x = 0 (f32), while c < N: c + 1,
   x + 1, N = 10 .. 1,000,000 a tensor input, as torch_xla's while_loop and fori_loop, JAX's
   lax.while_loop and lax.fori_loop (jit), lazyrt.while_loop and lazyrt.torch.while_loop. Every
   (peer, N) runs in a fresh child process (torch_xla can abort or pollute a process; and so
   the first call compiles for every N): first call, warm calls (loop_timing.measure_loop), the
   child's peak resident size. c and x are checked equal to N before anything is timed.
2. The cached step (examples/seed/cached_graph_step.py): seed_step's Linear(5, 3) and AdamW step
   traced once on torch_xla and replayed with `_get_graph_hash`, `_xla_warm_up_cache`,
   `_get_tensors_xla_device_data_node`, a GraphInputMatcher and `_run_cached_graph` (as
   torch_xla/_dynamo/dynamo_bridge.py does), beside lazyrt's same low-level calls, compile_step
   and lazyrt.torch.compile. Checked against PyTorch eager step by step; torch_xla's replays
   are shown to recompute the first step from the traced values (its parameters and optimizer
   state do not change), which is reported, not failed.
"""

import os
import resource
import sys
import time

import numpy as np
import torch

import lazyrt as lr
import limits
from harness import (BenchmarkError, Samples, calls_for, check_close, num, ratio, run_child_or_why,
                     run_command_or_why, table, time_side_by_side, why_failed)
from loop_timing import WARMUP_S, measure_loop

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = (10, 1000, 100_000, 1_000_000)
QUICK_SIZES = (10, 1000)
# N = 1,000,000 runs for a peer only where its slowest form is projected (10x its time at
# 100,000) under this many seconds a call.
BIG_N_BUDGET_S = 20.0
CHILD_TIMEOUT_S = 240
STEP_REPLAYS = 5

LAZYRT_WHILE = "lazyrt.while_loop"
# The machine's limit: the same loop in C, -O3 -march=native (bench/limits.c), called through ctypes.
LIMIT_LOOP = "the loop in C (bench/limits.c: the machine's limit)"
LAZYRT_TORCH_WHILE = "lazyrt.torch.while_loop (torch tensors)"
XLA_WHILE = "torch_xla: while_loop, its lowering (experimental.fori_loop imported)"
XLA_WHILE_EAGER = "torch_xla: while_loop, PyTorch's generic loop (only torch_xla imported)"
XLA_FORI = "torch_xla: experimental.fori_loop"
# torch_xla twice: with its lowering of while_loop registered, and without (two processes, as the
# registration is global).
PEERS = ("lazyrt", "torch_xla", "torch_xla-generic", "JAX")

XLA_REPLAY = "torch_xla _run_cached_graph (traced once, GraphInputMatcher)"
XLA_PLAIN = "torch_xla traced step, torch_xla.sync() every step"
LAZYRT_REPLAY = "lazyrt run_cached_graph (the same low-level calls)"
LAZYRT_COMPILE_STEP = "lazyrt compile_step"
LAZYRT_FRONTEND = "lazyrt.torch.compile (torch Linear and AdamW)"
LAZYRT_DEVICE = "lazyrt device: step traced every call, lazyrt.torch.sync()"
LAZYRT_DEVICE_COMPILE = "lazyrt device: lazyrt.torch.compile (torch Linear and AdamW on the device)"
LAZYRT_DEVICE_REPLAY = "lazyrt device: _run_cached_graph (torch_xla's calls on device tensors, capturable AdamW)"
EAGER = "PyTorch eager"


def xla_env(threads):
    """The environment of a torch_xla or JAX child: XLA on the CPU, one Eigen thread at 1 thread."""
    env = {"PJRT_DEVICE": "CPU", "TF_CPP_MIN_LOG_LEVEL": "1"}
    if threads == 1:
        env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    return env


def jax_python():
    """The interpreter of JAX's environment: $LAZYRT_BENCH_JAX_VENV (the Makefile's JAX_VENV), else
    the project's environment's folder + '-jax' (.venv-jax)."""
    venv = os.environ.get("LAZYRT_BENCH_JAX_VENV") or (sys.prefix.rstrip("/") + "-jax")
    return venv, os.path.join(venv, "bin", "python")


def install_failure(venv):
    """What bench/install_peers.sh wrote when it could not install a peer into venv, or None."""
    try:
        with open(os.path.join(venv, ".bench-peers-failed")) as f:
            return " ".join(f.read().split())
    except OSError:
        return None


# ---- child processes -------------------------------------------------------------------------

def child_loop(peer, n, reps):
    """In a child process (bench/suite.py --child peers-loop PEER N REPS): the forms of one peer at
    N = n; prints {"forms": {name: measure_loop's dict}, "max_rss": bytes, "seed": ..., ...}."""
    import json
    out = {"forms": {}}
    if peer == "lazyrt":
        import lazyrt.torch

        def lazyrt_while():
            c, x = lr.while_loop(lambda c, x: c < limit, lambda c, x: (c + 1, x + 1),
                                 (lr.tensor(0, dtype=lr.int64), lr.tensor(0.0)))
            lr.sync([c, x])
            return int(c.item()), float(x.item())
        limit = lr.tensor(n, dtype=lr.int64)
        # lazyrt compiles a hot loop's generated code on a background thread: waited for after
        # the warm-up, so that the warm calls time what a long-running program runs.
        out["forms"][LAZYRT_WHILE] = measure_loop(lazyrt_while, n, reps, settle=lr._C._jit.wait_idle)

        def torch_while():
            c, x, _ = lazyrt.torch.while_loop(lambda c, x, m: c < m, lambda c, x, m: (c + 1, x + 1, m),
                                              (torch.tensor(0), torch.tensor(0.0), torch.tensor(n)))
            return int(c.item()), float(x.item())
        out["forms"][LAZYRT_TORCH_WHILE] = measure_loop(torch_while, n, reps, settle=lr._C._jit.wait_idle)
        if n == SIZES[0]:
            out["seed"] = seed_loop(lambda cond, body, init: lr.while_loop(cond, body, init),
                                    lambda: (lr.tensor(10), lr.tensor(3, dtype=lr.int32)), lr.add, lambda t: t.item())
    else:
        import torch_xla
        from torch._higher_order_ops.while_loop import while_loop
        dev = torch_xla.device()
        lowered = peer == "torch_xla"
        if lowered:
            # Registers torch_xla's lowering of while_loop for xla tensors (one XLA While op); without
            # it, while_loop runs PyTorch's generic implementation, a Python loop over xla tensors.
            from torch_xla.experimental.fori_loop import fori_loop

        def on_device(v, dtype=None):
            return torch.tensor(v, dtype=dtype).to(dev)

        def xla_while():
            c, x, _ = while_loop(lambda c, x, m: c < m, lambda c, x, m: (c + 1, x + 1, m.clone()),
                                 (on_device(0), on_device(0.0), on_device(n)))
            torch_xla.sync()
            return int(c.cpu()), float(x.cpu())
        out["forms"][XLA_WHILE if lowered else XLA_WHILE_EAGER] = measure_loop(xla_while, n, reps)
        if lowered:
            def xla_fori():
                # fori_loop counts its own trip count down (upper - lower to 0) and passes the body the
                # other carries only: c is N less the count left.
                left, x = fori_loop(on_device(0), on_device(n), lambda x: x + 1, on_device(0.0))
                torch_xla.sync()
                return n - int(left.cpu()), float(x.cpu())
            out["forms"][XLA_FORI] = measure_loop(xla_fori, n, reps)
        if n == SIZES[0]:
            out["seed"] = seed_loop(while_loop, lambda: (torch.tensor(10, device=dev),
                                                         torch.tensor(3, dtype=torch.int32, device=dev)),
                                    torch.add, lambda t: t.item())
        out["version"] = f"torch_xla {torch_xla.__version__}"
    out["max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out))


def seed_loop(while_loop, make_init, add, item):
    """The seed program (count down from 10, add 1 to 3 each time): {"result", "first", "warm"}:
    the result and the seconds of the first and of a second call (one each, from a fresh start)."""
    def cond_fn(iteri, x):
        return iteri > 0

    def body_fn(iteri, x):
        return iteri - 1, add(x, 1)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        _, res = while_loop(cond_fn, body_fn, make_init())
        result = item(res)
        times.append(time.perf_counter() - t0)
    return {"result": result, "first": times[0], "warm": times[1]}


def child_xla_step(reps):
    """In a child process (bench/suite.py --child peers-xla-step REPS): the seed step on torch_xla,
    replayed with its low-level cached-graph calls and as plain traced steps. Prints the values
    the parent checks (against PyTorch eager) and the seconds per step."""
    import json

    import torch_xla
    import torch_xla.core.xla_model as xm
    from torch_xla._dynamo.dynamo_bridge import GraphInputMatcher
    from seed_step import TorchSeed, seed_values

    C = torch_xla._XLAC
    w, b, x_np = seed_values()
    dev = torch_xla.device()
    out = {}

    def arr(t):
        return t.detach().cpu().numpy().tolist()

    # As examples/seed/cached_graph_step.py on lazyrt, and torch_xla's dynamo bridge: trace one step,
    # hash the graph of the loss and the parameters, compile it without running, find its inputs.
    seed = TorchSeed(w, b, dev)
    x = torch.from_numpy(x_np.copy()).to(dev)
    torch_xla.sync()
    t0 = time.perf_counter()
    loss = seed.step(x)
    params = list(seed.model.parameters())
    outputs = [loss] + params
    graph_hash = C._get_graph_hash(outputs)
    C._xla_warm_up_cache(outputs, [])
    ids, values = C._get_tensors_xla_device_data_node(outputs)
    x_id = C._xla_get_tensor_id(x)
    matcher = GraphInputMatcher({x_id: 0}, ids, values, {x_id})
    out["prepare_s"] = time.perf_counter() - t0

    def replay():
        res = C._run_cached_graph(graph_hash, matcher([x]))
        xm.wait_device_ops()
        return res
    replays = []
    for _ in range(STEP_REPLAYS):
        res = replay()
        replays.append({"loss": float(res[0].cpu()), "weight": arr(res[1]), "bias": arr(res[2])})
    out["replays"] = replays
    state = seed.opt.state[seed.model.weight]
    # What the model and the optimizer hold after the replays (their pending trace of one step).
    out["model_after"] = {"weight": arr(seed.model.weight), "bias": arr(seed.model.bias),
                          "adamw_step": float(state["step"].cpu()), "exp_avg": arr(state["exp_avg"])}

    plain = TorchSeed(w, b, dev)

    def plain_step():
        loss = plain.step(x)
        torch_xla.sync()
        xm.wait_device_ops()
        return loss
    out["plain_losses"] = [float(plain_step().cpu()) for _ in range(STEP_REPLAYS)]
    out["plain_after"] = {"weight": arr(plain.model.weight), "bias": arr(plain.model.bias)}
    fns = {"replay": replay, "plain": plain_step}
    calls = {name: calls_for(fn, 0.02) for name, fn in fns.items()}
    samples = time_side_by_side(fns, calls, reps, warmup=1)
    out["seconds"] = {name: s.in_order for name, s in samples.items()}
    out["calls"] = calls
    print(json.dumps(out))


# ---- the parent -------------------------------------------------------------------------------

def run_peer_loop(opts, peer, n, reps):
    """(child_loop's or peers_jax.py's JSON for one peer at N = n, None) or (None, why not)."""
    if peer == "JAX":
        venv, python = jax_python()
        if not os.access(python, os.X_OK):
            why = install_failure(venv) or (f"no JAX environment at {venv} (`make bench` makes it with "
                                            "bench/install_peers.sh)")
            return None, why
        return run_command_or_why([python, os.path.join(HERE, "peers_jax.py"), str(n), str(reps)],
                                  env=dict(xla_env(opts.threads), **thread_env(opts.threads)),
                                  timeout=CHILD_TIMEOUT_S)
    is_xla = peer.startswith("torch_xla")
    if is_xla and not xla_installed():
        return None, install_failure(sys.prefix) or "torch_xla is not installed (`make bench` installs it)"
    return run_child_or_why(opts, "peers-loop", peer, n, reps, env=xla_env(opts.threads) if is_xla else None,
                            timeout=CHILD_TIMEOUT_S)


def thread_env(threads):
    return {name: str(threads) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}


def xla_installed():
    import importlib.util
    return importlib.util.find_spec("torch_xla") is not None


def loops(opts):
    """(markdown, summary rows) of the loop part."""
    sizes = QUICK_SIZES if opts.quick else SIZES
    reps = 3 if opts.quick else 5
    results = {}          # (form, n) -> measure_loop's dict, max_rss
    failed = {}           # peer -> why
    skipped = {}          # peer -> (n, projected seconds)
    seeds, wrong, versions = {}, {}, {}
    for peer in PEERS:
        slowest = None
        # PyTorch's generic loop takes ~30 s at N = 1,000 (one XLA execution per iteration): --quick runs N = 10.
        for n in sizes[:1] if opts.quick and peer == "torch_xla-generic" else sizes:
            if slowest is not None and slowest * n / prev_n > BIG_N_BUDGET_S:
                skipped[peer] = (n, slowest * n / prev_n)
                break
            print(f"peers: {peer} loop, N = {n:,}", file=sys.stderr, flush=True)
            out, why = run_peer_loop(opts, peer, n, reps)
            if why is not None:
                failed[peer] = f"N = {n:,}: {why}" if n != sizes[0] else why
                print(f"peers: {peer}: failed, no figures: {why}", file=sys.stderr, flush=True)
                break
            for form, r in out["forms"].items():
                if "warm" in r:
                    results[(form, n)] = (r, out["max_rss"])
                elif form.startswith("torch_xla"):
                    # torch_xla's lowering computes wrong values: its row says so, nothing of it is timed.
                    wrong[(form, n)] = r
                else:
                    raise BenchmarkError(f"peers, {form} at N = {n:,}: got c = {r['c']}, x = {r['x']}, "
                                         f"expected both {n}")
            if "seed" in out:
                seeds[peer] = out["seed"]
                if out["seed"]["result"] != 13:
                    raise BenchmarkError(f"peers, the seed while_loop on {peer}: got {out['seed']['result']}, "
                                         "expected 13")
            versions[peer.split("-")[0]] = out.get("version")
            timed = [max(r["warm"]) for r in out["forms"].values() if "warm" in r]
            slowest, prev_n = (max(timed) if timed else None), n
    lib = limits.library(opts.build)
    for n in sizes:
        results[(LIMIT_LOOP, n)] = (measure_loop(limits.counter_loop(lib, n), n, reps), None)
    forms = [LAZYRT_WHILE, LAZYRT_TORCH_WHILE, XLA_WHILE, XLA_FORI, XLA_WHILE_EAGER, "JAX lax.while_loop (jit)",
             "JAX lax.fori_loop (jit)", LIMIT_LOOP]
    rows = []
    for n in sizes:
        for form in forms:
            if (form, n) in wrong:
                r = wrong[(form, n)]
                rows.append([f"{n:,}", form, num(r["first"] * 1e3), f"wrong: c = {r['c']:g}, x = {r['x']:g}, not timed",
                             "-", "-"])
            if (form, n) not in results:
                continue
            r, rss = results[(form, n)]
            warm = Samples(r["warm"])
            rows.append([f"{n:,}", form, num(r["first"] * 1e3), warm.cell(1e3), num(warm.median / n * 1e9),
                         "-" if rss is None else f"{rss / 2**20:.0f}"])
    for peer, why in failed.items():
        rows.append(["-", f"{peer}: failed", "-", "-", "-", why])
    seed_rows = [(peer, str(s["result"]), num(s["first"] * 1e3), num(s["warm"] * 1e3)) for peer, s in seeds.items()]
    md = [
        "## The seed programs beside PyTorch/XLA and JAX on the CPU\n",
        "### Counter loop: while_loop and fori_loop, N = 10 .. 1,000,000\n",
        "The seed program (`examples/seed/while_loop_counter.py`: `while_loop(cond_fn, body_fn, (iteri, init_val))`,"
        " count down from 10 while adding 1 to 3), one fresh process per peer, first call (trace and compile "
        "included) and a second call:\n",
        table(["peer", "result", "first call ms", "second call ms"], seed_rows) + "\n",
        "The counter loop: c = 0 (i64), x = 0 (f32); while c < N: c + 1, x + 1; N a tensor input (one program for "
        "every N). lazyrt.while_loop (lazyrt tensors) and lazyrt.torch.while_loop (torch tensors, the PyTorch "
        "face); torch_xla (PJRT_DEVICE=CPU) `torch._higher_order_ops.while_loop` on xla tensors, carrying N, and "
        "`torch_xla.experimental.fori_loop(0, N, body, x)` (it counts its trip count down itself and gives the "
        "body x only: c = N less the count left); JAX `lax.while_loop` and `lax.fori_loop(0, N, ...)` inside "
        "`jax.jit`, N an argument (x64 on, for an i64 counter), in JAX's own environment. A call makes the "
        "starting values, runs the loop and reads c and x back to Python. Every (peer, N) runs in a fresh child "
        f"process, so the first call traces and compiles at every N; then warm-up calls for {WARMUP_S} s (at "
        "least one), not kept (lazyrt then waits for its background compiler, which the warm-up may have "
        "handed the loop's generated code: the warm calls time what a long-running program runs), then "
        f"{reps} batches of about 20 ms of warm calls (2 single calls where one takes over 1 s); c and x are "
        "checked equal to N on the first call, before anything is timed, and on every timed call. ns / "
        "iteration: the warm median over N (at small N, the call's fixed cost). The machine's limit: the same "
        "loop in C (-O3 -march=native), whose x is a chain of N dependent f32 adds, called in this process "
        "through ctypes. peak RSS: the child process's "
        "maximum resident size at its end, the whole process (interpreter, torch or JAX, lazyrt) included. XLA's "
        f"Eigen thread pool is off at 1 thread (`--xla_cpu_multi_thread_eigen=false`). Versions: "
        f"{', '.join(v for v in versions.values() if v) or '-'}.\n",
        table(["N", "form", "first call ms", "warm call ms", "ns / iteration", "peak RSS MiB"], rows, "llrrrr"),
        "",
    ]
    for peer, (n, projected) in skipped.items():
        md.append(f"- {peer}: N = {n:,} not run, its slowest form was projected at {projected:.0f} s a call "
                  f"(budget {BIG_N_BUDGET_S:.0f} s).")
    if wrong:
        md.append(f"- {XLA_WHILE} and {XLA_FORI}: wrong c and x on this counter (carried N or not, whatever "
                  "the starting values are made of), so their rows are not timed; the seed's count down, started "
                  "from an i32 3, comes out right (13). Without that import, while_loop on xla tensors runs "
                  "PyTorch's generic implementation: a Python loop, each `c < N` read back to the host, one XLA "
                  "execution per iteration.")
    summary = []
    for n in reversed(sizes):
        if (LAZYRT_WHILE, n) in results:
            base = Samples(results[(LAZYRT_WHILE, n)][0]["warm"])
            for form in (XLA_WHILE, XLA_FORI, XLA_WHILE_EAGER, "JAX lax.while_loop (jit)", LIMIT_LOOP):
                if (form, n) in results:
                    peer = Samples(results[(form, n)][0]["warm"])
                    summary.append((f"counter loop, N = {n:,}: warm call", LAZYRT_WHILE, base.cell(1e3), "ms",
                                    form, peer.cell(1e3), ratio(peer.median / base.median)))
            break
    return "\n".join(md), summary, failed


def device_replayed(w, b, dx):
    """The seed step on the lazyrt device (AdamW capturable, as replay on the device needs),
    traced once and replayed by torch_xla's low-level calls, as lazyrt.torch's
    (examples/seed/device_cached_step.py). Returns (a function running one replay and
    returning the loss, the model)."""
    import lazyrt.torch as L
    from harness import device_replay
    from seed_step import TorchSeed
    seed = TorchSeed(w, b, L.device(), capturable=True)
    return device_replay(plain_step(seed), (dx,), seed.model.parameters()), seed.model


def plain_step(seed):
    """A TorchSeed's step without the sync() its step makes on the lazyrt device."""
    def step(x):
        loss = seed.model(x).sum()
        loss.backward()
        seed.opt.step()
        seed.opt.zero_grad()
        return loss
    return step


def cached_step(opts):
    """(markdown, summary rows) of the cached-step part."""
    from seed_step import LazyrtSeed, TorchSeed, params_of, seed_values, torch_compiled
    reps = 5 if opts.quick else 15
    w, b, x_np = seed_values()
    tx = torch.from_numpy(x_np.copy())
    eager = TorchSeed(w, b)
    eager_losses, eager_params = [], []
    for _ in range(STEP_REPLAYS):
        eager_losses.append(float(eager.step(tx).item()))
        eager_params.append(tuple(a.copy() for a in params_of(eager.model)))  # numpy() views the parameters

    def check_steps(what, losses, params_after):
        """Steps 1.. of a peer against eager's; params_after: {step: (weight, bias)}."""
        check_close(f"peers, cached step, {what}: losses", losses, eager_losses[:len(losses)], rtol=1e-5, atol=1e-6)
        for k, (wk, bk) in params_after.items():
            check_close(f"peers, cached step, {what}: weight after step {k}", wk, eager_params[k - 1][0],
                        rtol=1e-5, atol=1e-6)
            check_close(f"peers, cached step, {what}: bias after step {k}", bk, eager_params[k - 1][1],
                        rtol=1e-5, atol=1e-6)

    def steps_match(k, loss, weight, bias):
        try:
            check_steps("", eager_losses[:k - 1] + [loss], {k: (weight, bias)})
            return True
        except BenchmarkError:
            return False

    # lazyrt: the seed's low-level calls (examples/seed/cached_graph_step.py) on seed_step's values.
    lx = lr.tensor(x_np)
    # Every lazyrt model and optimizer exists before a step is warmed up or compiled: a new optimizer
    # makes lazyrt refuse (run_cached_graph) or retrace (compile_step) the older steps.
    compiled_model = LazyrtSeed(w, b)
    low = LazyrtSeed(w, b)
    loss = low.step(lx)
    outputs = [loss] + list(low.model.parameters())
    graph_hash = lr.graph_hash(outputs)
    lr.warm_up_cache(outputs)
    ids, values = lr.graph_inputs(outputs)
    matcher = lr.GraphInputMatcher({lr.tensor_id(lx): 0}, ids, values)

    def lazyrt_replay():
        return lr.run_cached_graph(graph_hash, matcher([lx]))
    losses, after = [], {}
    for k in range(1, STEP_REPLAYS + 1):
        losses.append(float(lazyrt_replay()[0].item()))
        if k in (1, STEP_REPLAYS):
            after[k] = tuple(a.copy() for a in params_of(low.model))  # numpy() views the live buffers
    check_steps(LAZYRT_REPLAY, losses, after)
    lazyrt_evidence = (losses, after)

    compiled = lr.compile_step(compiled_model.step, (lx,))
    frontend, frontend_model = torch_compiled(w, b)
    timed_eager = TorchSeed(w, b)
    import lazyrt.torch
    on_device = TorchSeed(w, b, lazyrt.torch.device())  # the program as on torch_xla, device changed
    dx = tx.to(lazyrt.torch.device())
    device_replay, replayed_model = device_replayed(w, b, dx)
    device_compiled = TorchSeed(w, b, lazyrt.torch.device())
    device_step = lazyrt.torch.compile(plain_step(device_compiled))
    fns = {LAZYRT_REPLAY: lazyrt_replay, LAZYRT_COMPILE_STEP: lambda: compiled(lx),
           LAZYRT_FRONTEND: lambda: frontend(tx), LAZYRT_DEVICE: lambda: on_device.step(dx),
           LAZYRT_DEVICE_REPLAY: device_replay, LAZYRT_DEVICE_COMPILE: lambda: device_step(dx),
           EAGER: lambda: timed_eager.step(tx)}
    for name, model in ((LAZYRT_COMPILE_STEP, compiled_model.model), (LAZYRT_FRONTEND, frontend_model),
                        (LAZYRT_DEVICE, on_device.model), (LAZYRT_DEVICE_REPLAY, replayed_model),
                        (LAZYRT_DEVICE_COMPILE, device_compiled.model), (EAGER, timed_eager.model)):
        fn = fns[name]
        check_steps(name, [float(fn().item()) for _ in range(STEP_REPLAYS)], {STEP_REPLAYS: params_of(model)})
    calls = {name: calls_for(fn, 0.005 if opts.quick else 0.02) for name, fn in fns.items()}
    us = {name: s.scaled(1e6) for name, s in time_side_by_side(fns, calls, reps, warmup=2).items()}

    xla, why = (None, install_failure(sys.prefix) or "torch_xla is not installed (`make bench` installs it)")
    if xla_installed():
        print("peers: torch_xla cached step", file=sys.stderr, flush=True)
        xla, why = run_child_or_why(opts, "peers-xla-step", reps, env=xla_env(opts.threads), timeout=CHILD_TIMEOUT_S)
    evidence_rows, stale_note = [], ""
    if xla is not None:
        replays = xla["replays"]
        # Its graph computes the seed step right: the first replay is eager's first step.
        check_steps(f"{XLA_REPLAY}, first replay", [replays[0]["loss"]], {1: (replays[0]["weight"], replays[0]["bias"])})
        check_steps(XLA_PLAIN, xla["plain_losses"], {STEP_REPLAYS: (xla["plain_after"]["weight"],
                                                                    xla["plain_after"]["bias"])})
        stale = []
        for k, r in enumerate(replays[1:], start=2):
            if steps_match(k, r["loss"], r["weight"], r["bias"]):
                continue
            # Not eager's step k: it must then be the first replay again (the traced values replayed).
            for what in ("weight", "bias"):
                check_close(f"peers, cached step, {XLA_REPLAY}: replay {k}'s {what}, neither eager's step {k} nor "
                            "replay 1's", r[what], replays[0][what], rtol=0, atol=0)
            if r["loss"] != replays[0]["loss"]:
                raise BenchmarkError(f"peers, cached step, {XLA_REPLAY}: replay {k}'s loss {r['loss']} is neither "
                                     f"eager's step {k} nor replay 1's")
            stale.append(k)
        m = xla["model_after"]
        for k in (1, STEP_REPLAYS):
            r = replays[k - 1]
            evidence_rows.append((XLA_REPLAY, str(k), num(r["loss"]), num(r["weight"][0][0]), num(r["bias"][0]),
                                  num(eager_losses[k - 1]), num(float(eager_params[k - 1][0][0][0]))))
        losses_l, after_l = lazyrt_evidence
        for k in (1, STEP_REPLAYS):
            evidence_rows.append((LAZYRT_REPLAY, str(k), num(losses_l[k - 1]), num(float(after_l[k][0][0][0])),
                                  num(float(after_l[k][1][0])), num(eager_losses[k - 1]),
                                  num(float(eager_params[k - 1][0][0][0]))))
        if stale:
            stale_note = (
                f"torch_xla's replays {', '.join(map(str, stale))} of {STEP_REPLAYS} return the first step's loss and "
                "parameters again, bit for bit: the GraphInputMatcher feeds every replay the parameters and AdamW "
                "state captured when the step was traced, and nothing writes a replay's results back. ")
        else:
            stale_note = f"torch_xla's {STEP_REPLAYS} replays equal eager's steps 1 to {STEP_REPLAYS}. "
        stale_note += (
            f"After the {STEP_REPLAYS} replays the torch_xla model holds weight[0, 0] = {num(m['weight'][0][0])} "
            f"and AdamW step = {m['adamw_step']:g} (what the traced step left pending: one step; eager after "
            f"{STEP_REPLAYS} steps: {num(float(eager_params[-1][0][0][0]))}, step {STEP_REPLAYS}). lazyrt's replays "
            f"by the same calls write the weights and AdamW state back and equal eager's steps 1 to {STEP_REPLAYS}. "
            "Reported, not failed: this is what torch_xla's low-level calls do.\n")
        for name in ("replay", "plain"):
            us[XLA_REPLAY if name == "replay" else XLA_PLAIN] = Samples(xla["seconds"][name]).scaled(1e6)
    base = us[LAZYRT_REPLAY]
    rows = [(name, s.cell(), ratio(s.median / base.median)) for name, s in us.items()]
    if xla is None:
        rows.append(("torch_xla", f"failed: {why}", "-"))
    md = [
        "### Cached step: Linear(5, 3), AdamW, replayed\n",
        "seed_step's step (its initial weight and bias, x, AdamW lr 1e-3), checked step by step against PyTorch "
        "eager's from the same start (rtol 1e-5) before timing. torch_xla (PJRT_DEVICE=CPU, a child process): "
        "the step traced once on xla tensors, `_get_graph_hash` and `_xla_warm_up_cache` of [loss, weight, bias], "
        "`_get_tensors_xla_device_data_node` and a `GraphInputMatcher` ({x's id: argument 0}), then each call "
        "`_run_cached_graph(hash, matcher([x]))` and `xm.wait_device_ops()`, as its dynamo bridge does; beside it "
        "torch_xla's ordinary training: the step traced every call, `torch_xla.sync()`, `wait_device_ops()`. "
        "lazyrt: the same low-level calls (`lr.graph_hash`, `lr.warm_up_cache`, `lr.graph_inputs`, "
        "`lr.GraphInputMatcher`, `lr.run_cached_graph`), `lr.compile_step`, `lazyrt.torch.compile` of the "
        "unmodified torch step, and the torch step on the lazyrt device (torch_xla's ordinary training with the "
        "device changed: traced every call, `lazyrt.torch.sync()`; and torch_xla's low-level calls of the "
        "dynamo bridge on device tensors, lazyrt.torch's of the same names, with AdamW(capturable=True)), "
        f"with PyTorch eager, alternating in this "
        f"process; torch_xla's two alternate in "
        f"its child. {reps} batches of about {'5' if opts.quick else '20'} ms after warm-up.\n",
        table(["path", "us per step, median [min, max]", "vs lazyrt run_cached_graph"], rows),
        "",
    ]
    if evidence_rows:
        md += [f"Do the parameters change across replays? The values each replay returns (lazyrt: its model's "
               "after the replay), beside eager's after the same number of steps:\n",
               table(["path", "replay", "loss", "weight[0, 0]", "bias[0]", "eager loss at that step",
                      "eager weight[0, 0] after it"], evidence_rows),
               "", stale_note]
    summary = []
    for peer in (XLA_REPLAY, XLA_PLAIN, EAGER):
        if peer in us:
            summary.append(("seed step, replayed", "lazyrt run_cached_graph", base.cell(), "us", peer, us[peer].cell(),
                            ratio(us[peer].median / base.median)))
    replayed = us[LAZYRT_DEVICE_REPLAY]
    for peer in (XLA_REPLAY, EAGER):  # torch_xla's cached-graph calls on each device
        if peer in us:
            summary.append(("seed step, replayed on the device", LAZYRT_DEVICE_REPLAY, replayed.cell(), "us", peer,
                            us[peer].cell(), ratio(us[peer].median / replayed.median)))
    device = us[LAZYRT_DEVICE]
    for peer in (XLA_PLAIN, EAGER):  # PyTorch/XLA-style training on each device
        if peer in us:
            summary.append(("seed step, traced every call", LAZYRT_DEVICE, device.cell(), "us", peer, us[peer].cell(),
                            ratio(us[peer].median / device.median)))
    return "\n".join(md), summary


def in_short(summary, xla_loop_wrong):
    """The section's one-paragraph reading, from its summary rows."""
    said = []
    for row in summary:
        if row[0].startswith("counter loop") and "JAX" in row[4]:
            said.append(f"On the counter loop ({row[0].split(':')[0].replace('counter loop, ', '')}), a warm call of "
                        f"lazyrt.while_loop takes {row[2]} ms, JAX's jit-compiled lax.while_loop {row[5]} ms ({row[6]}).")
        if row[4] == XLA_REPLAY and row[0] == "seed step, replayed":
            said.append(f"On the cached step, torch_xla's `_run_cached_graph` replay takes {row[5]} us against lazyrt's "
                        f"{row[2]} us by the same calls ({row[6]}), but recomputes the first step every time (below).")
        if row[4] == XLA_PLAIN and row[1] == LAZYRT_DEVICE:
            said.append(f"Traced every call on a device, as PyTorch/XLA programs train, the step takes {row[2]} us on "
                        f"lazyrt's device and {row[5]} us on torch_xla's ({row[6]}).")
    if xla_loop_wrong:
        said.append("torch_xla's own lowering of while_loop computes this counter wrongly; the loop it gets right, "
                    "PyTorch's generic one, runs one XLA execution per iteration.")
    return "In short: " + " ".join(said) + "\n"


def run(opts):
    loop_md, loop_summary, _ = loops(opts)
    step_md, step_summary = cached_step(opts)
    head, _, rest = loop_md.partition("\n")
    return {"markdown": head + "\n\n" + in_short(loop_summary + step_summary, "| wrong: c =" in loop_md) + rest + "\n\n" + step_md,
            "summary": loop_summary + step_summary}
