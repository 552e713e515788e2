"""Generated kernels from Python: values equal to PyTorch's whichever tier runs a graph; a
process that exits while its compiler thread is compiling exits cleanly and at once, and so
does a child forked after its parent compiled (it has no compiler thread)."""

import os
import subprocess
import sys
import time

import numpy as np
import torch

import lazyrt as lr

HERE = os.path.dirname(os.path.abspath(__file__))


def adamw_like(p, g, m, v, lr_):
    m = m * 0.9 + g * 0.1
    v = v * 0.999 + g * g * 0.001
    p = p * (1 - lr_ * 0.01) - lr_ * (m / 0.1) / ((v / 0.001).sqrt() + 1e-8)
    return p, m, v


def rerun_in_child(test, jit):
    """Whether the test must run in a child with LAZYRT_JIT=jit on the cpu backend (whose code it
    is), whatever LAZYRT_JIT and LAZYRT_BACKEND the suite runs with; if so, runs it there."""
    if os.environ.get("LAZYRT_JIT") == jit and os.environ.get("LAZYRT_BACKEND", "cpu") == "cpu":
        return False
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__ + "::" + test.__name__],
                       env=dict(os.environ, LAZYRT_JIT=jit, LAZYRT_BACKEND="cpu"), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return True


def test_a_hot_graph_gives_torchs_values_before_and_after_it_is_compiled():
    if rerun_in_child(test_a_hot_graph_gives_torchs_values_before_and_after_it_is_compiled, "1"):
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


def test_a_loop_of_scalars_runs_as_one_generated_loop_with_torchs_values():
    # A while loop whose carries and captures have one element each, and whose cond and body are
    # elementwise: one generated function (generated code from the first run in sync mode).
    if rerun_in_child(test_a_loop_of_scalars_runs_as_one_generated_loop_with_torchs_values, "sync"):
        return

    def step(c, x, y, h, scale):
        x = x * 0.999 + (c.to(x.dtype) * scale).sin()
        y = (y + x.to(y.dtype) * 1e-3).to(torch.bfloat16 if isinstance(y, torch.Tensor) else lr.bfloat16).to(y.dtype)
        h = torch.where(x > 0, h + 1, h) if isinstance(h, torch.Tensor) else lr.where(x > 0, h + 1, h)
        return c + 1, x, y, h

    for n in (0, 1, 2000):
        want = (torch.tensor(0), torch.tensor(0.25), torch.tensor(0.0, dtype=torch.float64), torch.tensor(3, dtype=torch.int32))
        scale = torch.tensor(0.01)
        while want[0] < n:
            want = step(*want, scale)
        before = lr.metrics.counter("GeneratedLoopRuns")
        limit, lscale = lr.tensor(n, dtype=lr.int64), lr.tensor(0.01)
        got = lr.while_loop(lambda c, x, y, h: c < limit, lambda c, x, y, h: step(c, x, y, h, lscale),
                            (lr.tensor(0, dtype=lr.int64), lr.tensor(0.25), lr.tensor(0.0, dtype=lr.float64),
                             lr.tensor(3, dtype=lr.int32)))
        lr.sync(list(got))
        assert lr.metrics.counter("GeneratedLoopRuns") == before + 1
        assert got[0].item() == n and got[3].item() == want[3].item()
        np.testing.assert_allclose([got[1].item(), got[2].item()], [want[1].item(), want[2].item()], rtol=1e-5)


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


# A graph of many distinct fusion regions (a matrix product between each two, so no two fuse;
# each region's ops spelled by the digits of its index): its module takes the compiler many
# seconds. The child waits until the compiler process is at work, then exits.
BIG_MODULE_CHILD = r"""
import sys, time, numpy as np, lazyrt as lr
OPS = [lambda v: v.tanh(), lambda v: v.sigmoid(), lambda v: v.abs(), lambda v: -v, lambda v: v * v,
       lambda v: v + 1.0]
rng = np.random.default_rng(0)
x0 = lr.tensor(rng.standard_normal((64, 64)).astype(np.float32))
w = lr.tensor((rng.standard_normal((64, 64)) / 64).astype(np.float32))
def run():
    x = x0
    for i in range(int(sys.argv[1])):
        x = x @ w
        for d in range(4):
            x = OPS[(i // 6 ** d) % 6](x)
    return x.numpy()
for _ in range(3):
    run()
t = time.time()
while lr.metrics.counter("JitCompilerStarts") == 0 and time.time() - t < 60:
    time.sleep(0.01)
time.sleep(0.2)
print("compiling", lr.metrics.counter("JitCompilerStarts"), lr.metrics.counter("JitModules"), flush=True)
if len(sys.argv) > 2:
    lr._C._jit.wait_idle()
    print("compiled", time.time() - t, flush=True)
"""


def test_a_process_that_exits_while_compiling_a_large_module_does_not_wait_for_it():
    env = dict(os.environ, LAZYRT_JIT="1", LAZYRT_BACKEND="cpu", LAZYRT_CACHE_DIR="")
    start = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", BIG_MODULE_CHILD, "300"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    at_work = time.monotonic()
    out, err = child.communicate(timeout=600)
    ended = time.monotonic()
    assert child.returncode == 0, (child.returncode, err[-2000:])
    # The compiler process had started and the module was not done when the child began to exit.
    assert line.split() == ["compiling", "1", "0"], (line, err[-2000:])
    assert "generating kernels failed" not in err, err[-2000:]
    # Compiling the module takes the compiler over five seconds (measured alone:
    # test_a_large_module_takes_the_compiler_long below); exiting takes well under that.
    assert ended - at_work < 3.0, (ended - at_work, at_work - start)


def test_a_large_module_takes_the_compiler_long():
    """What the test above relies on: the same module, waited for, takes many seconds."""
    env = dict(os.environ, LAZYRT_JIT="1", LAZYRT_BACKEND="cpu", LAZYRT_CACHE_DIR="")
    r = subprocess.run([sys.executable, "-c", BIG_MODULE_CHILD, "300", "wait"], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    compiled = [line.split() for line in r.stdout.splitlines() if line.startswith("compiled")]
    assert compiled and float(compiled[0][1]) > 5.0, r.stdout


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
