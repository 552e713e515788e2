"""while_loop and fori_loop with Python callables: the seed scenario, graphs that stay flat,
one compile for any trip count, errors, and the GIL released while loops run."""

import threading
import time

import numpy as np
import pytest

import lazyrt as lr


def test_countdown_scenario():
    def cond_fn(iteri, x):
        return iteri > 0

    def body_fn(iteri, x):
        return iteri - 1, lr.add(x, 1)

    init_val = lr.tensor(3, dtype=lr.int32)
    iteri = lr.tensor(10)
    out = lr.while_loop(cond_fn, body_fn, (iteri, init_val))
    assert isinstance(out, tuple) and len(out) == 2
    assert out[0].item() == 0 and out[1].item() == 13
    assert out[1].dtype is lr.int32


def test_init_as_list_or_single_tensor_and_single_results():
    out = lr.while_loop(lambda x: x < 5, lambda x: x + 2, [lr.tensor(0)])
    assert isinstance(out, tuple) and out[0].item() == 6
    out = lr.while_loop(lambda x: x < 5, lambda x: (x + 2,), lr.tensor(1))
    assert out[0].item() == 5


def test_fori_loop_passes_the_carry_in_inits_structure():
    total = lr.fori_loop(0, 10, lambda i, c: c + i.to(lr.float64), lr.zeros((), dtype=lr.float64))
    assert isinstance(total, lr.Tensor) and total.item() == 45
    a, b = lr.fori_loop(2, 5, lambda i, c: (c[0] + i, c[1] * 2), (lr.tensor(0), lr.tensor([1.0, 2.0])))
    assert a.item() == 2 + 3 + 4 and b.tolist() == [8.0, 16.0]
    (same,) = lr.fori_loop(5, 5, lambda i, c: (c[0] + 1,), [lr.tensor(7.0)])
    assert same.item() == 7.0


def test_host_loop_grows_the_graph_while_the_loop_stays_flat():
    x = lr.tensor(1.0)
    for _ in range(50):
        x = x + 1
    assert lr.debug.graph_node_count([x]) >= 50
    assert x.item() == 51

    def size(n):
        out = lr.fori_loop(0, n, lambda i, c: c + 1, lr.tensor(1.0))
        nodes = lr.debug.graph_node_count([out])
        assert out.item() == 1 + n
        return nodes

    assert size(50) == size(5000) < 20


def test_body_compiled_once_for_any_trip_count():
    lr.cache.clear_memory()
    lr.metrics.reset()

    def run(n):
        return lr.fori_loop(0, n, lambda i, c: c + i.to(lr.float64), lr.zeros((), dtype=lr.float64)).item()

    assert run(10) == 45
    assert lr.metrics.counter("UncachedCompile") == 1
    assert run(100000) == 100000 * 99999 / 2
    assert lr.metrics.counter("UncachedCompile") == 1
    assert lr.metrics.counter("CachedCompile") == 1


def test_loop_body_captures_outer_tensors_and_matches_the_host_loop(rng):
    w = lr.tensor(rng.uniform(-0.5, 0.5, (3, 3)), dtype=lr.float32)
    b = lr.tensor(rng.uniform(-0.1, 0.1, 3), dtype=lr.float32)
    x0 = lr.tensor(rng.uniform(-1, 1, (2, 3)), dtype=lr.float32)
    host = x0
    for _ in range(7):
        host = lr.tanh(host @ w + b)
    (looped,) = lr.fori_loop(0, 7, lambda i, c: (lr.tanh(c[0] @ w + b),), (x0,))
    np.testing.assert_allclose(looped.numpy(), host.numpy(), rtol=1e-6)


def test_nested_loops():
    def outer(i, c):
        upper = i + 1
        inner = lr.while_loop(lambda j, acc: j < upper, lambda j, acc: (j + 1, acc + i * 10 + j),
                              (lr.zeros((), dtype=lr.int64), c))
        return inner[1]

    out = lr.fori_loop(0, 4, outer, lr.zeros((), dtype=lr.int64))
    assert out.item() == sum(i * 10 + j for i in range(4) for j in range(i + 1))


def test_errors_surface_as_lazyrt_errors():
    with pytest.raises(lr.Error, match="returned 1 values, but init has 2"):
        lr.while_loop(lambda a, b: a < 3, lambda a, b: (a + 1,), (lr.tensor(0), lr.tensor(1)))
    with pytest.raises(lr.Error, match="body result 1 is f32\\[2, 1\\], expected f32\\[2\\]"):
        lr.while_loop(lambda a, b: a < 3, lambda a, b: (a + 1, b.reshape(2, 1)), (lr.tensor(0), lr.zeros(2)))
    with pytest.raises(lr.Error, match="cond must return a one-element tensor"):
        lr.while_loop(lambda a: a > 0, lambda a: a - 1, (lr.tensor([1, 2]),))
    with pytest.raises(lr.Error, match="cond_fn must return a one-element lazyrt tensor, got bool"):
        lr.while_loop(lambda a: True, lambda a: a, (lr.tensor(1),))
    with pytest.raises(lr.Error, match="body_fn must return a tuple of lazyrt tensors, got int"):
        lr.fori_loop(0, 3, lambda i, c: 3, lr.tensor(1))
    outer = lr.tensor([1.0])
    with pytest.raises(lr.Error, match="modifies a tensor from outside the loop"):
        lr.fori_loop(0, 3, lambda i, c: outer.add_(c), lr.tensor([1.0]))
    with pytest.raises(lr.Error, match="symbolic"):
        lr.fori_loop(0, 3, lambda i, c: c + c.item(), lr.tensor(1.0))
    with pytest.raises(TypeError):
        lr.while_loop(lambda a: a > 0, lambda a: a, (1, 2))
    assert outer.tolist() == [1.0], "a loop that failed changed nothing"


def test_python_exceptions_in_bodies_pass_through():
    class Boom(Exception):
        pass

    def body(i, c):
        raise Boom("from the body")

    with pytest.raises(Boom, match="from the body"):
        lr.fori_loop(0, 3, body, lr.tensor(1.0))
    with pytest.raises(ZeroDivisionError):
        lr.while_loop(lambda a: 1 / 0, lambda a: a, (lr.tensor(1),))
    assert lr.fori_loop(0, 3, lambda i, c: c + 1, lr.tensor(1.0)).item() == 4.0, "still usable"


def test_values_inside_a_body_print_without_failing():
    seen = []
    lr.fori_loop(0, 2, lambda i, c: seen.append(repr(c)) or c + 1, lr.zeros(2, 3))
    assert seen == ["tensor(<not readable here>, shape=(2, 3), dtype=lazyrt.float32)"]


def test_the_gil_is_released_while_a_loop_runs():
    n = 4_000_000
    out = lr.fori_loop(0, n, lambda i, c: c + 1.0, lr.zeros(8))  # traced, not run yet
    seen = {"measuring": False, "ticks": 0, "max_gap": 0.0}
    stop = threading.Event()

    def spin():
        # Another Python thread: it can only tick while it holds the GIL.
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            if seen["measuring"]:
                seen["ticks"] += 1
                seen["max_gap"] = max(seen["max_gap"], now - last)
            last = now

    worker = threading.Thread(target=spin, daemon=True)
    worker.start()
    try:
        time.sleep(0.05)
        seen["measuring"] = True
        start = time.perf_counter()
        value = out.sum().item()  # compiles and runs the loop
        elapsed = time.perf_counter() - start
        seen["measuring"] = False
    finally:
        stop.set()
        worker.join()
    assert value == 8 * n
    # Holding the GIL for the whole run would stop the other thread for all of it.
    assert elapsed > 0.1 and seen["ticks"] > 1000, (elapsed, seen)
    assert seen["max_gap"] < elapsed / 2, (elapsed, seen)
