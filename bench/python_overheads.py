"""Overheads of lazyrt from Python, against PyTorch eager in the same process.

1. Tracing one op: `a + b` on small lazyrt tensors (recorded, not run) against PyTorch eager
   computing `a + b` on small tensors. Requirement: tracing costs less.
2. The seed training step (Linear(5, 3) on a 10x5 batch, sum, backward, AdamW, zero_grad)
   replayed through compile_step against PyTorch eager's full step. Requirement: the replay is
   at least 20x faster.

Both sides start from the same values and their results are checked equal before anything is
timed. Each figure is the median over many repetitions of a batch of calls, after a warm-up
that is not timed; lazyrt and PyTorch batches alternate, so both see the same machine load
(harness.time_side_by_side). Prints a markdown report. bench/suite.py (make bench) runs the
full comparison; this script is the quick check of the two requirements.

    PYTHONPATH=build/python .venv/bin/python bench/python_overheads.py [--quick]
"""

import argparse
import os
import platform
import sys

try:
    import lazyrt as lr
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
    import lazyrt as lr

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import time_side_by_side  # noqa: E402


def compare(lazy_fn, torch_fn, calls, reps, warmup):
    """Median microseconds per call of each, batches alternating."""
    t = time_side_by_side({"lazyrt": lazy_fn, "torch": torch_fn}, calls, reps, warmup)
    return t["lazyrt"].median * 1e6, t["torch"].median * 1e6


# ---- 1. tracing one op -------------------------------------------------------------------------

def trace_one_op(calls, reps, warmup):
    values = [1.0, 2.0, 3.0, 4.0]
    a, b = lr.tensor(values), lr.tensor(values[::-1])
    ta, tb = torch.tensor(values), torch.tensor(values[::-1])
    assert (a + b).tolist() == (ta + tb).tolist(), "results differ"
    torch.set_grad_enabled(False)  # plain eager compute; lazyrt records no gradient either
    try:
        return compare(lambda: a + b, lambda: ta + tb, calls, reps, warmup)
    finally:
        torch.set_grad_enabled(True)


def trace_one_op_with_number(calls, reps, warmup):
    a, ta = lr.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert (a + 1.5).tolist() == (ta + 1.5).tolist(), "results differ"
    torch.set_grad_enabled(False)
    try:
        return compare(lambda: a + 1.5, lambda: ta + 1.5, calls, reps, warmup)
    finally:
        torch.set_grad_enabled(True)


# ---- 2. the seed step ----------------------------------------------------------------------------

def seed_models():
    lr.manual_seed(0)
    model = lr.nn.Linear(5, 3)
    tmodel = torch.nn.Linear(5, 3)
    tmodel.load_state_dict({k: lr.to_torch(v).clone() for k, v in model.state_dict().items()})
    opt = lr.optim.AdamW(model.parameters(), lr=1e-3)
    topt = torch.optim.AdamW(tmodel.parameters(), lr=1e-3)
    lr.mark_step()
    return model, opt, tmodel, topt


def seed_step(calls, reps, warmup):
    model, opt, tmodel, topt = seed_models()
    x_np = np.random.default_rng(0).uniform(-1, 1, (10, 5)).astype(np.float32)
    x, tx = lr.tensor(x_np), torch.from_numpy(x_np)
    found_inf = lr.zeros(1)

    def lazy_step(x):
        loss = model(x).sum()
        loss.backward()
        opt.step(found_inf=found_inf)
        opt.zero_grad()
        return loss

    def torch_step():
        loss = tmodel(tx).sum()
        loss.backward()
        topt.step()
        topt.zero_grad()
        return loss

    step = lr.compile_step(lazy_step, (x,))
    losses = [step(x).item() for _ in range(5)]
    tlosses = [torch_step().item() for _ in range(5)]
    np.testing.assert_allclose(losses, tlosses, rtol=1e-5, err_msg="losses differ")
    np.testing.assert_allclose(model.weight.numpy(), tmodel.weight.detach().numpy(), rtol=1e-5, atol=1e-6,
                               err_msg="weights differ")
    result = compare(lambda: step(x), torch_step, calls, reps, warmup)
    assert step.traces == 1, "the timed calls replayed the one trace"
    return result


def plain_lazy_step(calls, reps, warmup):
    """For context: the same step traced and run every time (mark_step), from Python."""
    model, opt, tmodel, topt = seed_models()
    x = lr.tensor(np.random.default_rng(0).uniform(-1, 1, (10, 5)).astype(np.float32))
    tx = lr.to_torch(x)

    def lazy():
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        lr.mark_step()

    def eager():
        loss = tmodel(tx).sum()
        loss.backward()
        topt.step()
        topt.zero_grad()

    return compare(lazy, eager, calls, reps, warmup)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    torch.set_num_threads(1)  # small tensors; lazyrt runs its CPU kernels on one thread too

    rows = []
    op_lr, op_torch = trace_one_op(2000, 301 // scale, 20)
    rows.append(("trace one op: `a + b`, 4 floats", op_lr, op_torch, op_lr / op_torch,
                 "lazyrt / eager < 1", op_lr < op_torch))
    num_lr, num_torch = trace_one_op_with_number(2000, 301 // scale, 20)
    rows.append(("trace one op: `a + 1.5`, 4 floats", num_lr, num_torch, num_lr / num_torch, "(context)", None))
    step_lr, step_torch = seed_step(200, 301 // scale, 10)
    rows.append(("seed step: compile_step replay vs eager step", step_lr, step_torch, step_torch / step_lr,
                 "eager / lazyrt >= 20", step_torch / step_lr >= 20))
    plain_lr, plain_torch = plain_lazy_step(50, 101 // scale, 5)
    rows.append(("seed step: traced and synced every time vs eager", plain_lr, plain_torch, plain_lr / plain_torch,
                 "(context)", None))

    print("## lazyrt from Python: overheads against PyTorch eager\n")
    print(f"Python {platform.python_version()}, PyTorch {torch.__version__} (1 thread), "
          f"{platform.machine()}, {os.cpu_count()} CPUs; medians of "
          f"{301 // scale} batches after a warm-up.\n")
    print("| measurement | lazyrt (us) | PyTorch eager (us) | ratio | requirement | met |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for name, a, b, ratio, req, ok in rows:
        met = "" if ok is None else ("yes" if ok else "NO")
        print(f"| {name} | {a:.2f} | {b:.2f} | {ratio:.2f} | {req} | {met} |")
    failed = [r[0] for r in rows if r[5] is False]
    if failed:
        print(f"\nNot met: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
