"""Generated kernels from Python: values equal to PyTorch's whichever tier runs a graph; a
process that exits while its compiler thread is compiling exits cleanly, and so does a child
forked after its parent compiled (it has no compiler thread)."""

import os
import subprocess
import sys

import numpy as np
import torch

import lazyrt as lr

HERE = os.path.dirname(os.path.abspath(__file__))


def adamw_like(p, g, m, v, lr_):
    m = m * 0.9 + g * 0.1
    v = v * 0.999 + g * g * 0.001
    p = p * (1 - lr_ * 0.01) - lr_ * (m / 0.1) / ((v / 0.001).sqrt() + 1e-8)
    return p, m, v


def test_a_hot_graph_gives_torchs_values_before_and_after_it_is_compiled():
    # Generation on, on the cpu backend (whose code it is), whatever LAZYRT_JIT and LAZYRT_BACKEND
    # the suite runs with: the test runs in a child.
    if os.environ.get("LAZYRT_JIT") != "1" or os.environ.get("LAZYRT_BACKEND", "cpu") != "cpu":
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__ + "::" +
                            "test_a_hot_graph_gives_torchs_values_before_and_after_it_is_compiled"],
                           env=dict(os.environ, LAZYRT_JIT="1", LAZYRT_BACKEND="cpu"), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        return
    rng = np.random.default_rng(0)
    n = 1 << 20  # 2^20 elements x ~20 ops: hot after its second run
    arrays = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]
    arrays[3] = np.abs(arrays[3])
    before = lr.metrics.counter("JitModules")
    tp, tg, tm, tv = (torch.from_numpy(a.copy()) for a in arrays)
    lp, lg, lm, lv = (lr.tensor(a.copy()) for a in arrays)
    for step in range(1, 7):
        tp, tm, tv = adamw_like(tp, tg, tm, tv, 1e-3)
        lp, lm, lv = adamw_like(lp, lg, lm, lv, 1e-3)
        lr.mark_step()
        for lt, tt in ((lp, tp), (lm, tm), (lv, tv)):
            np.testing.assert_allclose(lt.numpy(), tt.numpy(), rtol=2e-6, atol=1e-7)
        if step == 3:
            lr._C._jit.wait_idle()
    # One graph, hot at its second run, compiled by the wait after the third: steps 4 to 6 ran
    # generated code.
    assert lr.metrics.counter("JitModules") == before + 1


CHILD = r"""
import numpy as np, lazyrt as lr
x = lr.tensor(np.ones(1 << 21, dtype=np.float32))
for _ in range(3):
    ((x * 0.5 + 1.0) * x - 2.0).exp().numpy()
# The graph became hot at its second run: the compiler thread is compiling as the process ends.
"""


def test_a_process_that_exits_while_compiling_exits_cleanly():
    env = dict(os.environ, LAZYRT_JIT="1", LAZYRT_BACKEND="cpu")
    for _ in range(4):
        r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])


FORK_CHILD = r"""
import os, sys, numpy as np, lazyrt as lr
x = lr.tensor(np.ones(1 << 21, dtype=np.float32))
def hot():
    return ((x * 0.5 + 1.0) * x - 2.0).exp().numpy()
for _ in range(3):
    hot()
lr._C._jit.wait_idle()
assert lr.metrics.counter("JitModules") == 1
pid = os.fork()
if pid == 0:
    # The child has no compiler thread: it exits through the normal exit path (atexit hooks,
    # static destructors) without waiting for one.
    sys.exit(0 if lr.metrics.counter("JitModules") == 1 else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_exits_after_its_parent_compiled():
    r = subprocess.run([sys.executable, "-c", FORK_CHILD], env=dict(os.environ, LAZYRT_JIT="1", LAZYRT_BACKEND="cpu"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
