"""Gradients through a long loop: an explicit Euler integrator of a small MLP vector field, N
steps, differentiated with respect to its weights, N = 100 .. 100,000.

Workload: state h f32[64, 256]; h <- h + 0.1 * (tanh(h @ W1) @ W2 - h + u) (W1, W2 f32[256, 256],
u a fixed f32[64, 256] drive: the state settles near a fixed point, so the gradients of a long
run neither vanish nor explode, and float32 agrees with float64 to ~2e-6), N times from a fixed
h0; loss = mean(h_N ** 2); the gradients of W1 and W2. Forms:
- lazyrt fori_loop, checkpointed: `lr.fori_loop(0, N, step, h0, snapshots=S)`: the backward
  rebuilds the states it needs from at most S stored ones (binomial checkpointing);
- lazyrt fori_loop, every carry kept: `snapshots=0`, one state per step stored for the backward;
- lazyrt host loop (unrolled): a Python `for`; the graph grows with N;
- PyTorch eager: the same Python `for` over torch tensors, `loss.backward()` (autograd keeps what
  every step's backward needs);
- JAX (its own environment, `make bench` makes it): `jax.jit(jax.grad(loss))` through
  `lax.scan` of the step (its backward keeps what every step needs), and through `lax.scan` of
  `jax.checkpoint(step)` (each step's carry kept, its insides recomputed): bench/peers_jax.py.
Each (form, N) runs in a child process of its own: a first run (lazyrt: trace, compile, run;
PyTorch: the same work once), then a timed second run; peak memory is the child's peak resident
size above its start, through both runs (lazyrt's arenas and caches included), and lazyrt's own
device-buffer peak. Every form's gradients are checked against PyTorch's where both ran.
"""

import json
import os

import numpy as np
import torch

import lazyrt as lr
from harness import (check_close, first_and_warm, num, peak_rss, ratio, reset_peak_rss, run_child, run_command_or_why,
                     table)

BATCH, WIDTH, DT = 64, 256, 0.1
SNAPSHOTS = 100
SIZES = (100, 1000, 10_000, 100_000)
QUICK_SIZES = (10, 30)
JAX_SCAN = "JAX jax.grad through lax.scan (jit)"  # peers_jax.GRAD_SCAN
JAX_CHECKPOINT = "JAX jax.grad through lax.scan of jax.checkpoint(step) (jit)"  # peers_jax.GRAD_CHECKPOINT
FORMS = ("lazyrt fori_loop, checkpointed", "lazyrt fori_loop, every carry kept", "lazyrt host loop (unrolled)",
         "PyTorch eager", JAX_CHECKPOINT, JAX_SCAN)
CHECKED = FORMS[:3] + (JAX_CHECKPOINT, JAX_SCAN)  # against PyTorch eager's gradients
# A (form, N) is not run when its time or its memory, projected from the smaller N, would pass these.
RUN_BUDGET_S = 150.0
QUICK_RUN_BUDGET_S = 5.0
MEMORY_BUDGET = 6 * 2 ** 30


def data():
    g = np.random.default_rng(7)
    h0 = g.standard_normal((BATCH, WIDTH)).astype(np.float32)
    w1 = (g.standard_normal((WIDTH, WIDTH)) * 0.05).astype(np.float32)
    w2 = (g.standard_normal((WIDTH, WIDTH)) * 0.05).astype(np.float32)
    u = g.standard_normal((BATCH, WIDTH)).astype(np.float32)
    return h0, w1, w2, u


def lazyrt_run(form, n, h0, w1, w2, u):
    W1, W2 = lr.tensor(w1, requires_grad=True), lr.tensor(w2, requires_grad=True)
    h, U = lr.tensor(h0), lr.tensor(u)

    def step(i, h):
        return h + DT * (lr.tanh(h @ W1) @ W2 - h + U)
    if form == "lazyrt host loop (unrolled)":
        for i in range(n):
            h = step(i, h)
    else:
        h = lr.fori_loop(0, n, step, h, snapshots=SNAPSHOTS if form == "lazyrt fori_loop, checkpointed" else 0)
    (h * h).mean().backward()
    lr.sync([W1.grad, W2.grad])
    return W1.grad.numpy(), W2.grad.numpy()


def torch_run(n, h0, w1, w2, u):
    W1, W2 = torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)
    h, U = torch.tensor(h0), torch.tensor(u)
    for _ in range(n):
        h = h + DT * (torch.tanh(h @ W1) @ W2 - h + U)
    (h * h).mean().backward()
    return W1.grad.numpy(), W2.grad.numpy()


def child(form, n):
    """Runs in a child process: prints JSON with the timings, the peaks and a digest of the
    gradients."""
    arrays = data()
    run = (lambda: torch_run(n, *arrays)) if form == "PyTorch eager" else (lambda: lazyrt_run(form, n, *arrays))
    lr.mark_step()
    before = reset_peak_rss()
    lr.debug.reset_peak_memory()
    device_before = lr.debug.live_memory_bytes()
    lr.metrics.reset()
    first, warm, (g1, g2) = first_and_warm(run)
    print(json.dumps({"first": first, "run": warm, "peak_rss": peak_rss() - before,
                      "device_peak": lr.debug.peak_memory_bytes() - device_before,
                      "recomputed": lr.metrics.counter("CheckpointForwardSteps") // 2,
                      "g1": g1[:4, :4].tolist(), "g2": g2[:4, :4].tolist(),
                      "g_norm": [float(np.linalg.norm(g1)), float(np.linalg.norm(g2))]}))


def measure(opts, form, n, why_not):
    """The child's JSON for (form, n), or None where a JAX form cannot run (why_not[form] says why)."""
    if form not in (JAX_SCAN, JAX_CHECKPOINT):
        return run_child(opts, "loop-grad", form, n)
    import tempfile
    from peers import CHILD_TIMEOUT_S, install_failure, jax_python, thread_env, xla_env
    venv, python = jax_python()
    if not os.access(python, os.X_OK):
        why_not[form] = install_failure(venv) or f"no JAX environment at {venv} (`make bench` makes it)"
        return None
    with tempfile.TemporaryDirectory(prefix="lazyrt-loop-grad-") as folder:
        path = os.path.join(folder, "data.npz")
        h0, w1, w2, u = data()
        np.savez(path, h0=h0, w1=w1, w2=w2, u=u)
        here = os.path.dirname(os.path.abspath(__file__))
        out, why = run_command_or_why([python, os.path.join(here, "peers_jax.py"), "grad", form, str(n), path],
                                      env=dict(xla_env(opts.threads), **thread_env(opts.threads)),
                                      timeout=max(CHILD_TIMEOUT_S, 2 * RUN_BUDGET_S))
    if out is None:
        why_not[form] = f"at N = {n:,}: {why}"
    return out


def project(history, n, key):
    """Linear projection from the largest N measured (time and memory grow at most linearly in
    N for every form here, except the unrolled host loop, whose compile is projected the same)."""
    if not history:
        return 0.0
    last_n, last = history[-1]
    return last[key] * n / last_n


def run(opts):
    budget = QUICK_RUN_BUDGET_S if opts.quick else RUN_BUDGET_S
    sizes = QUICK_SIZES if opts.quick else SIZES
    results = {f: {} for f in FORMS}
    skipped, why_not = {}, {}
    for form in FORMS:
        history = []
        for n in sizes:
            t_proj = project(history, n, "first") + project(history, n, "run")
            m_proj = project(history, n, "peak_rss")
            if t_proj > budget or m_proj > MEMORY_BUDGET:
                skipped[form] = (n, t_proj, m_proj)
                break
            r = measure(opts, form, n, why_not)
            if r is None:
                break
            results[form][n] = r
            history.append((n, r))
    for n in sizes:
        want = results["PyTorch eager"].get(n)
        for form in CHECKED:
            got = results[form].get(n)
            if want and got:
                check_close(f"loop gradients, {form}, N = {n}: dW1, dW2",
                            np.array(got["g1"] + got["g2"]), np.array(want["g1"] + want["g2"]), rtol=2e-3, atol=1e-6)

    rows = []
    for n in sizes:
        for form in FORMS:
            r = results[form].get(n)
            if r is None:
                continue
            lazy = form.startswith("lazyrt")
            rows.append([f"{n:,}", form, num(r["first"]), num(r["run"]), f"{r['run'] / n * 1e6:.0f}",
                         num(r["peak_rss"] / 2 ** 20), num(r["device_peak"] / 2 ** 20) if lazy else "-",
                         f"{r['recomputed']:,}" if form == FORMS[0] else "-"])
    notes = [f"- {form}: not run from N = {n:,} on: projected {t:.0f} s for its two runs (budget {budget:.0f} s) "
             f"and {m / 2 ** 30:.1f} GiB (budget {MEMORY_BUDGET / 2 ** 30:.0f} GiB)."
             for form, (n, t, m) in skipped.items()]
    notes += [f"- {form}: not measured: {why}" for form, why in why_not.items()]
    versions = {r.get("version") for form in (JAX_SCAN, JAX_CHECKPOINT) for r in results[form].values()} - {None}
    plot = plot_scaling(results, sizes, opts.plots) if opts.plots else None
    md = ["## Gradients through a loop: Euler steps of an MLP vector field, N = 100 .. 100,000\n",
          f"Workload: h f32[{BATCH}, {WIDTH}], `h = h + {DT} * (tanh(h @ W1) @ W2 - h + u)` N times (u a fixed "
          "drive), loss = mean(h ** 2), "
          f"gradients of W1 and W2 (f32[{WIDTH}, {WIDTH}]). Checkpointed: `fori_loop(..., snapshots={SNAPSHOTS})`. "
          "Each cell runs in a child process: a first run (lazyrt: trace, compile and run; PyTorch: the same "
          "work), then the timed run. peak RSS: the child's peak resident size above its start, through both "
          "runs; lazyrt device peak: the buffers lazyrt accounts (tensor data, arenas, constants). recomputed "
          "steps: forward steps the checkpointed backward ran again (its count is Griewank's r*N - C(s+r, s+1)). "
          "Gradients are checked against PyTorch's wherever both ran. JAX runs in its own environment, "
          f"XLA:CPU at the suite's thread count{' (' + ', '.join(sorted(versions)) + ')' if versions else ''}; its "
          "first run includes tracing and XLA's compile.\n",
          table(["N", "form", "first run s", "run s", "run us / step", "peak RSS MiB", "lazyrt device peak MiB",
                 "recomputed steps"], rows, "llrrrrrr"), ""]
    md += notes
    if plot:
        md.append(f"\n![loop gradients]({plot})\n")
    summary = []
    common = [n for n in sizes if n in results[FORMS[0]] and n in results["PyTorch eager"]]
    if common:
        n = common[-1]
        c, t = results[FORMS[0]][n], results["PyTorch eager"][n]
        summary.append((f"loop gradient, N = {n:,}: peak memory", FORMS[0], num(c["peak_rss"] / 2 ** 20), "MiB",
                        "PyTorch eager", num(t["peak_rss"] / 2 ** 20), ratio(t["peak_rss"] / c["peak_rss"])))
        summary.append((f"loop gradient, N = {n:,}: run", FORMS[0], num(c["run"]), "s",
                        "PyTorch eager", num(t["run"]), ratio(t["run"] / c["run"])))
    for peer in (JAX_CHECKPOINT, JAX_SCAN):  # at N = 10,000, as the goal is set (or the largest both ran)
        common = [n for n in sizes if n in results[FORMS[0]] and n in results[peer]]
        if not common:
            continue
        n = 10_000 if 10_000 in common else common[-1]
        c, j = results[FORMS[0]][n], results[peer][n]
        summary.append((f"loop gradient, N = {n:,}: peak memory", FORMS[0], num(c["peak_rss"] / 2 ** 20), "MiB",
                        peer, num(j["peak_rss"] / 2 ** 20), ratio(j["peak_rss"] / c["peak_rss"])))
        summary.append((f"loop gradient, N = {n:,}: run", FORMS[0], num(c["run"]), "s", peer, num(j["run"]),
                        ratio(j["run"] / c["run"])))
    return {"markdown": "\n".join(md), "summary": summary}


def plot_scaling(results, sizes, plots_dir):
    """Peak memory and time per step against N; returns the PNG's path relative to bench/."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(plots_dir, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for form in FORMS:
        ns = [n for n in sizes if n in results[form]]
        if not ns:
            continue
        axes[0].plot(ns, [results[form][n]["peak_rss"] / 2 ** 20 for n in ns], marker="o", label=form)
        axes[1].plot(ns, [results[form][n]["run"] / n * 1e6 for n in ns], marker="o", label=form)
    for ax, title in ((axes[0], "peak RSS (MiB)"), (axes[1], "run time per step (us)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N (steps)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(plots_dir, "loop_gradients.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return os.path.relpath(path, os.path.dirname(os.path.abspath(__file__)))
