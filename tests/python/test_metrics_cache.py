"""lazyrt.metrics, lazyrt.cache and lazyrt.debug from Python, and the package itself."""

import os
import subprocess
import sys

import pytest

import lazyrt as lr


def test_counters_and_report():
    lr.cache.clear_memory()
    lr.metrics.reset()
    assert lr.metrics.counter("ExecuteGraph") == 0 and lr.metrics.counter("NeverTouched") == 0
    for _ in range(3):
        (lr.tensor([1.0, 2.0]) * 2 + 1).tolist()
    assert lr.metrics.counter("UncachedCompile") == 1
    assert lr.metrics.counter("CachedCompile") == 2
    assert lr.metrics.counter("ExecuteGraph") == 3
    assert lr.metrics.timing_count("ExecuteTime") == 3 and lr.metrics.timing_total_ns("ExecuteTime") > 0
    report = lr.metrics.report()
    for name in ["UncachedCompile", "CachedCompile", "ExecuteGraph", "CompileTime", "ExecuteTime", "TraceTime"]:
        assert name in report
    assert not hasattr(lr.metrics, "increment") and not hasattr(lr.metrics, "record_timing"), "recording is internal"
    lr.metrics.reset()
    assert lr.metrics.counter("ExecuteGraph") == 0


def test_memory_cache_capacity():
    old = lr.cache.memory_capacity()
    try:
        lr.cache.set_memory_capacity(0)
        lr.metrics.reset()
        for _ in range(2):
            (lr.tensor([1.0]) + 1).tolist()
        assert lr.metrics.counter("UncachedCompile") == 2, "capacity 0 disables the cache"
        lr.cache.set_memory_capacity(4)
        lr.cache.clear_memory()
        (lr.tensor([1.0]) + 1).tolist()
        assert lr.cache.memory_size() == 1 and lr.cache.memory_capacity() == 4
    finally:
        lr.cache.set_memory_capacity(old)


def test_memory_cache_byte_cap():
    old = lr.cache.memory_capacity(), lr.cache.memory_max_bytes()
    try:
        assert old[1] == 8 << 30, "the default byte cap"
        lr.cache.set_memory_capacity(1024)
        lr.cache.clear_memory()
        assert lr.cache.memory_bytes() == 0

        def run(n):  # graphs of distinct sizes whose executables hold memory (an arena)
            a = lr.arange(n * n, dtype=lr.float32).reshape(n, n) * 0.001
            a.matmul(a).matmul(a).tolist()

        for n in range(30, 34):
            run(n)
        four = lr.cache.memory_bytes()
        assert lr.cache.memory_size() == 4 and four > 0
        lr.metrics.reset()
        cap = four // 2
        lr.cache.set_memory_max_bytes(cap)
        assert lr.cache.memory_max_bytes() == cap
        assert lr.cache.memory_size() < 4 and lr.metrics.counter("MemoryCacheEvictions") >= 1
        for n in range(40, 50):
            run(n)
            assert lr.cache.memory_bytes() <= cap or lr.cache.memory_size() == 1
        assert lr.metrics.counter("MemoryCacheEvictions") >= 10
        lr.cache.set_memory_max_bytes(0)
        assert lr.cache.memory_max_bytes() == 0, "0: no byte cap"
    finally:
        lr.cache.set_memory_capacity(old[0])
        lr.cache.set_memory_max_bytes(old[1])


def test_memory_cache_settings_refuse_negative_values():
    before = lr.cache.memory_capacity(), lr.cache.memory_max_bytes()
    with pytest.raises(lr.Error, match="set_memory_capacity"):
        lr.cache.set_memory_capacity(-1)
    with pytest.raises(lr.Error, match="set_memory_max_bytes"):
        lr.cache.set_memory_max_bytes(-4096)
    assert (lr.cache.memory_capacity(), lr.cache.memory_max_bytes()) == before


def test_debug_graph_text_and_memory():
    x = lr.tensor([1.0, 2.0])
    y = lr.exp(x) + 1
    text = lr.debug.graph_text([y])
    assert "exp" in text and "add" in text
    assert lr.debug.graph_node_count([y]) >= 3
    assert y.is_pending(), "looking runs nothing"
    lr.debug.reset_peak_memory()
    assert lr.debug.peak_memory_bytes() >= lr.debug.live_memory_bytes() > 0


def test_the_package_imports_cleanly_in_a_fresh_interpreter():
    code = ("import lazyrt as lr; import lazyrt.nn, lazyrt.optim, lazyrt.metrics, lazyrt.cache, lazyrt.debug; "
            "import lazyrt.nn.functional as F; print(lr.__version__, (lr.ones(2) + 1).tolist())")
    # A minimal environment, but a sanitizer run's settings carry over (the runtime is preloaded).
    env = {"PYTHONPATH": os.pathsep.join(sys.path)}
    env.update({k: os.environ[k] for k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONMALLOC")
                if k in os.environ})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.1.0", "[2.0,", "2.0]"]


def test_public_names():
    for name in ["tensor", "from_numpy", "from_torch", "to_torch", "mark_step", "sync", "while_loop", "fori_loop",
                 "graph_hash", "warm_up_cache", "graph_inputs", "run_cached_graph", "GraphInputMatcher",
                 "compile_step", "tensor_id", "Error", "no_grad", "Tensor", "float32", "bfloat16"]:
        assert hasattr(lr, name), name
    for name in ["Module", "Parameter", "Linear", "Sequential", "ReLU", "Tanh", "Sigmoid", "Dropout", "MSELoss",
                 "CrossEntropyLoss", "BCEWithLogitsLoss"]:
        assert hasattr(lr.nn, name), name
    for name in ["SGD", "Adam", "AdamW"]:
        assert hasattr(lr.optim, name), name
    assert not hasattr(lr.cache, "set_persistent_dir") or callable(lr.cache.set_persistent_dir)


def test_sync_and_mark_step():
    a = lr.tensor([1.0]) + 1
    b = lr.tensor([2.0]) + 1
    lr.sync([a])
    assert not a.is_pending() and b.is_pending()
    lr.sync(b)
    assert not b.is_pending()
    c = a * 3
    lr.mark_step()
    assert not c.is_pending() and c.tolist() == [6.0]


def test_dump_graph_writes_each_compiled_graph_as_text_and_dot(tmp_path):
    lr.debug.set_dump_graph_dir(str(tmp_path))
    try:
        assert lr.debug.dump_graph_dir() == str(tmp_path)
        x = lr.tensor([1.0, 2.0, 3.0])
        ((x * 3.5).exp() - 17.25).sum().item()
    finally:
        lr.debug.set_dump_graph_dir("")
    txt = list(tmp_path.glob("*.txt"))
    dot = list(tmp_path.glob("*.dot"))
    assert len(txt) == 1 and len(dot) == 1 and txt[0].stem == dot[0].stem and len(txt[0].stem) == 32
    text = txt[0].read_text()
    assert "exp" in text and "17.25" in text, text
    assert dot[0].read_text().lstrip().startswith("digraph")
    # Off again: nothing more is written.
    ((x * 4.5).exp()).sum().item()
    assert len(list(tmp_path.glob("*.txt"))) == 1


def test_steps_timed_alone_run_again_on_their_own_operands_and_change_nothing():
    # A replayed AdamW step updates parameters and moments in place (results written over their
    # operands). Timed alone, each step runs three more times after its timed run; those runs
    # must read what the first read, so the parameters match, bit for bit, a run without them.
    import numpy as np

    def train(alone):
        lr.manual_seed(0)
        model = lr.nn.Sequential(lr.nn.Linear(8, 16), lr.nn.ReLU(), lr.nn.Linear(16, 4))
        opt = lr.optim.AdamW(model.parameters(), lr=1e-2)
        x = lr.tensor(np.linspace(-1, 1, 5 * 8, dtype=np.float32).reshape(5, 8))

        def step(x):
            opt.zero_grad()
            loss = (model(x) ** 2).mean()
            loss.backward()
            opt.step()
            return loss
        compiled = lr.compile_step(step, (x,))
        compiled(x)
        lr.metrics.reset()
        lr.metrics.set_kernel_timings(True, alone=alone)
        try:
            losses = [compiled(x).item() for _ in range(3)]
        finally:
            lr.metrics.set_kernel_timings(False)
        return losses, [p.numpy().copy() for p in model.parameters()], lr.metrics.step_timings()

    losses, params, plain = train(False)
    losses_alone, params_alone, timed = train(True)
    assert losses_alone == losses
    for p, q in zip(params, params_alone):
        assert np.array_equal(p, q)
    assert all(t["alone_runs"] == 0 for t in plain), "alone runs only when asked"
    runs = {t["op"]: t for t in timed if t["runs"] == 3}
    assert runs["fusion"]["alone_runs"] == 9 and runs["fusion"]["alone_ns"] > 0, runs["fusion"]
    assert sum(t["alone_runs"] for t in timed) >= 9 * 3, timed
