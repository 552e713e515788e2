"""while_loop and fori_loop with Python callables: the seed scenario, graphs that stay flat,
one compile for any trip count, errors, the GIL released while loops run, and pytree carries
(namedtuples included; scan too): a body result of another structure or kind (a float for an
integer carry, a tuple for a list) is refused, naming the leaf, and changes nothing."""

import re
import threading
import time
from collections import namedtuple

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
    (same,) = lr.fori_loop(5, 5, lambda i, c: [c[0] + 1], [lr.tensor(7.0)])
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
    with pytest.raises(lr.Error, match=r"body_fn result: carry: 1 values vs 2 values"):
        lr.while_loop(lambda a, b: a < 3, lambda a, b: (a + 1,), (lr.tensor(0), lr.tensor(1)))
    with pytest.raises(lr.Error, match=r"carry\[1\]: f32\[2, 1\] vs f32\[2\]"):
        lr.while_loop(lambda a, b: a < 3, lambda a, b: (a + 1, b.reshape(2, 1)), (lr.tensor(0), lr.zeros(2)))
    with pytest.raises(lr.Error, match="cond must return a one-element tensor"):
        lr.while_loop(lambda a: a > 0, lambda a: a - 1, (lr.tensor([1, 2]),))
    with pytest.raises(lr.Error, match="cond_fn must return a one-element lazyrt tensor, got bool"):
        lr.while_loop(lambda a: True, lambda a: a, (lr.tensor(1),))
    with pytest.raises(lr.Error, match=r"body_fn result: carry is a str"):
        lr.fori_loop(0, 3, lambda i, c: "3", lr.tensor(1))
    assert lr.fori_loop(0, 3, lambda i, c: 3, lr.tensor(1)).item() == 3, "a number is a constant carry"
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
    out = lr.fori_loop(0, n, lambda i, c: c + 1.0, lr.zeros(64))  # traced, not run yet
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
    assert value == 64 * n
    # Holding the GIL for the whole run would stop the other thread for all of it.
    assert elapsed > 0.05 and seen["ticks"] > 1000, (elapsed, seen)
    assert seen["max_gap"] < elapsed / 2, (elapsed, seen)


# ---- pytree carries ------------------------------------------------------------------------


def test_while_loop_carries_nested_tuples_lists_and_dicts():
    import torch

    def step(c, s):
        return {"h": c["h"] * 0.5 + s[1][0], "n": c["n"] + 1}, (s[0] * 2, [s[1][0] + 1.0])

    init = ({"h": lr.tensor([1.0, 2.0]), "n": lr.tensor(0)}, (lr.tensor(3), [lr.tensor(0.5)]))
    c, s = lr.while_loop(lambda c, s: c["n"] < 4, step, init)
    assert set(c) == {"h", "n"} and isinstance(s, tuple) and isinstance(s[1], list)
    # The same loop in torch eager.
    tc, ts = {"h": torch.tensor([1.0, 2.0]), "n": torch.tensor(0)}, (torch.tensor(3), [torch.tensor(0.5)])
    while tc["n"] < 4:
        tc, ts = {"h": tc["h"] * 0.5 + ts[1][0], "n": tc["n"] + 1}, (ts[0] * 2, [ts[1][0] + 1.0])
    np.testing.assert_allclose(c["h"].numpy(), tc["h"].numpy(), rtol=1e-6)
    assert c["n"].item() == 4 and s[0].item() == ts[0].item() == 48 and s[1][0].item() == ts[1][0].item()


def test_python_numbers_are_carries_and_come_back_as_tensors():
    i, x = lr.while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x * 1.5), (0, 2.0))
    assert i.dtype is lr.int64 and i.item() == 5
    assert x.dtype is lr.float32 and x.item() == pytest.approx(2.0 * 1.5 ** 5)
    (flag,) = lr.while_loop(lambda b: b, lambda b: False, (True,))
    assert flag.dtype is lr.bool and flag.item() is False


def test_a_body_may_return_constants_and_captured_values_unchanged():
    w = lr.tensor([7.0, 8.0])
    i, a, b = lr.while_loop(lambda i, a, b: i < 3, lambda i, a, b: (i + 1, w, 4), (0, lr.zeros(2), 1))
    assert i.item() == 3 and a.tolist() == [7.0, 8.0] and b.item() == 4 and b.dtype is lr.int64


def test_fori_loop_over_a_dict_carry():
    out = lr.fori_loop(0, 4, lambda i, c: {"s": c["s"] + i, "p": c["p"] * 2}, {"s": 0, "p": lr.tensor(1.0)})
    assert out["s"].item() == 6 and out["p"].item() == 16.0


@pytest.mark.parametrize("body, message", [
    (lambda c: ({"h": c["h"].reshape(4, 1), "n": c["n"]},), r"carry\[0\]\['h'\]: f32\[4, 1\] vs f32\[4\]"),
    (lambda c: ({"h": c["h"]},), r"carry\[0\]: .*keys"),
    (lambda c: ({"h": c["h"].to(lr.float64), "n": c["n"]},), r"carry\[0\]\['h'\]: f64\[4\] vs f32\[4\]"),
    (lambda c: ({"h": "x", "n": c["n"]},), r"carry\[0\]\['h'\] is a str"),
])
def test_a_body_result_of_another_structure_names_the_leaf(body, message):
    init = ({"h": lr.zeros(4), "n": lr.tensor(0)},)
    with pytest.raises(lr.Error, match=message):
        lr.while_loop(lambda c: c["n"] < 2, body, init)


# ---- namedtuples, and results of another kind ----------------------------------------------

State = namedtuple("State", "n h")
Pair = namedtuple("Pair", ["a", "b"])
Solo = namedtuple("Solo", "x")


def test_namedtuple_carries_in_while_fori_and_scan_match_torch():
    import torch

    def step(ops, s, k):
        return State(s.n + 1, Pair(ops.tanh(s.h.a * 0.5 + k), s.h.b * 2.0))

    h0 = ([0.5, -1.0], [1.0, 3.0])
    # The same steps in torch eager, the oracle for all three forms.
    ts = State(torch.tensor(0), Pair(*(torch.tensor(v) for v in h0)))
    for k in range(4):
        ts = step(torch, ts, float(k))

    def check(s):
        assert type(s) is State and type(s.h) is Pair
        assert s.n.item() == 4
        np.testing.assert_allclose(s.h.a.numpy(), ts.h.a.numpy(), rtol=1e-6)
        np.testing.assert_allclose(s.h.b.numpy(), ts.h.b.numpy(), rtol=1e-6)

    def init():
        return State(lr.tensor(0), Pair(*(lr.tensor(v) for v in h0)))

    # while_loop: a namedtuple among the carries, and the body reads it by field.
    seen = []
    (s,) = lr.while_loop(lambda s: seen.append(type(s)) or s.n < 4,
                         lambda s: step(lr, s, s.n.to(lr.float32)), (init(),))
    assert seen == [State]
    check(s)
    # A namedtuple as the whole carried_inputs is the argument list, as for a tuple.
    n, h = lr.while_loop(lambda n, h: n < 4, lambda n, h: tuple(step(lr, State(n, h), n.to(lr.float32))), init())
    check(State(n, h))
    # fori_loop: the carry is a namedtuple, so is the result.
    check(lr.fori_loop(0, 4, lambda i, s: step(lr, s, i.to(lr.float32)), init()))
    # scan: namedtuple carry, rows and ys.
    xs = Solo(lr.arange(4).to(lr.float32))
    s, ys = lr.scan(lambda s, x: (step(lr, s, x.x), Pair(s.n, x.x * 2)), init(), xs)
    check(s)
    assert type(ys) is Pair and ys.a.tolist() == [0, 1, 2, 3] and ys.b.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_a_lone_one_field_namedtuple_or_1_tuple_carry():
    (s,) = lr.while_loop(lambda s: s.x < 3, lambda s: Solo(s.x + 1), (Solo(lr.tensor(0)),))
    assert type(s) is Solo and s.x.item() == 3
    (s,) = lr.while_loop(lambda s: s.x < 3, lambda s: (Solo(s.x + 1),), (Solo(lr.tensor(0)),))
    assert type(s) is Solo and s.x.item() == 3
    # A carry that is itself a 1-tuple: returned bare, or wrapped as the one carry.
    (t,) = lr.while_loop(lambda t: t[0] < 3, lambda t: (t[0] + 1,), ((lr.tensor(0),),))
    assert type(t) is tuple and t[0].item() == 3
    (t,) = lr.while_loop(lambda t: t[0] < 3, lambda t: ((t[0] + 1,),), ((lr.tensor(0),),))
    assert type(t) is tuple and t[0].item() == 3


def test_namedtuple_carry_gradients_match_torch_autograd():
    import torch
    w0, h0 = np.array([0.3, -0.7, 1.1]), np.array([0.5, 0.25, -1.0])

    def run(lib, loop):
        w, h = lib.tensor(w0, requires_grad=True), lib.tensor(h0, requires_grad=True)

        def body(i, s):
            return State(s.n + 1, Pair(lib.sin(s.h.a * w) + s.h.b, s.h.b * 0.5))
        init = State(lib.tensor(0), Pair(h, h * 2.0))
        if loop == "torch":
            s = init
            for i in range(5):
                s = body(i, s)
        elif loop == "fori":
            s = lr.fori_loop(0, 5, body, init, snapshots=2)
        else:
            s, _ = lr.scan(lambda s, x: (body(x, s), None), init, None, length=5)
        ((s.h.a ** 2).sum() + s.h.b.sum()).backward()
        return s.n.item(), w.grad.numpy(), h.grad.numpy()

    want = run(torch, "torch")
    for loop in ("fori", "scan"):
        n, gw, gh = run(lr, loop)
        assert n == want[0] == 5
        np.testing.assert_allclose(gw, want[1], rtol=1e-10, err_msg=loop)
        np.testing.assert_allclose(gh, want[2], rtol=1e-10, err_msg=loop)


def _message_of_refusal(fail):
    """Runs fail() (whose body draws random numbers, then returns a result lazyrt must refuse)
    between a seed and a draw: returns the lazyrt.Error's message, and checks that the draw is
    the one without fail(): the refused loop left the generator as it was."""
    lr.manual_seed(7)
    want = lr.rand(3).numpy()
    lr.manual_seed(7)
    with pytest.raises(lr.Error) as info:
        fail()
    np.testing.assert_array_equal(lr.rand(3).numpy(), want)
    return str(info.value)


@pytest.mark.parametrize("form", ["while", "fori", "scan"])
@pytest.mark.parametrize("value, carry, message", [
    (2.7, 0, r"\['c'\]: a Python float vs i64\[\] \(the carry's\)"),
    (2.0, lr.tensor(1, dtype=lr.int32), r"\['c'\]: a Python float vs i32\[\]"),
    (0.5, True, r"\['c'\]: a Python float vs b8\[\]"),
    (2, False, r"\['c'\]: a Python int vs b8\[\]"),
    (True, 3, r"\['c'\]: a Python bool vs i64\[\]"),
    (1, 1.5, r"\['c'\]: a Python int vs f32\[\]"),
    (2 ** 40, lr.tensor(1, dtype=lr.int32), r"\['c'\]: the Python int 1099511627776 does not fit in i32"),
    (3.0, lr.zeros(2), r"\['c'\]: a number vs f32\[2\]"),
])
def test_a_number_of_another_kind_is_refused_not_truncated(form, value, carry, message):
    def body(c):
        lr.rand(2)  # a draw before the refusal
        return {"c": value, "k": c["k"] + 1}

    def fail():
        init = {"c": carry, "k": lr.tensor(0)}
        if form == "while":
            lr.while_loop(lambda c: c["k"] < 3, body, (init,))
        elif form == "fori":
            lr.fori_loop(0, 3, lambda i, c: body(c), init)
        else:
            lr.scan(lambda c, x: (body(c), None), init, None, length=3)

    got = _message_of_refusal(fail)
    # while_loop's carries are its arguments: the dict is carry[0] there.
    prefix = {"while": r"while_loop: body_fn result: carry\[0\]", "fori": "fori_loop: body_fn result: carry",
              "scan": "scan: fn result: carry"}[form]
    assert re.search(prefix + message, got), got


def test_a_number_of_the_carrys_kind_takes_its_dtype():
    i, f, b, h = lr.while_loop(lambda i, f, b, h: i < 3, lambda i, f, b, h: (i + 1, 2.5, False, 7),
                               (lr.tensor(0, dtype=lr.int32), lr.zeros((), dtype=lr.float64), True,
                                lr.tensor(0, dtype=lr.int32)))
    assert (i.dtype, f.dtype, b.dtype, h.dtype) == (lr.int32, lr.float64, lr.bool, lr.int32)
    assert (i.item(), f.item(), b.item(), h.item()) == (3, 2.5, False, 7)
    assert lr.fori_loop(0, 2, lambda i, c: -2 ** 31, lr.tensor(5, dtype=lr.int32)).item() == -2 ** 31
    with pytest.raises(lr.Error, match=r"carry: the Python int 1180591620717411303424 does not fit in i64"):
        lr.fori_loop(0, 2, lambda i, c: c, 2 ** 70)


@pytest.mark.parametrize("body, init, message", [
    (lambda c: (c[0] + 1, (c[1][0], c[1][1])), (0, [lr.zeros(2), lr.zeros(2)]),
     r"while_loop: body_fn result: carry\[1\]: a tuple vs a list of 2 \(the carry's\)"),
    (lambda c: (c[0] + 1, [c[1][0], c[1][1]]), (0, (lr.zeros(2), lr.zeros(2))),
     r"carry\[1\]: a list vs a tuple of 2"),
    (lambda c: (c[0] + 1, {"p": (c[1]["p"].a, c[1]["p"].b)}), (0, {"p": Pair(lr.zeros(2), lr.zeros(2))}),
     r"carry\[1\]\['p'\]: a tuple vs a Pair of 2"),
    (lambda c: (c[0] + 1, {"p": State(*c[1]["p"])}), (0, {"p": Pair(lr.zeros(2), lr.zeros(2))}),
     r"carry\[1\]\['p'\]: a State vs a Pair of 2"),
    (lambda c: (c[0] + 1, [c[1][0]]), (0, [lr.zeros(2), lr.zeros(2)]),
     r"carry\[1\]: 1 values vs 2 values"),
])
def test_a_sequence_of_another_kind_is_refused(body, init, message):
    def drawing(c):
        lr.rand(1)  # a draw before the refusal
        return body(c)

    got = _message_of_refusal(lambda: lr.while_loop(lambda *c: c[0] < 3, lambda *c: drawing(c), init))
    assert re.search(message, got), got
    # fori_loop and scan refuse the same results at the same paths (their carry is the tuple).
    got = _message_of_refusal(lambda: lr.fori_loop(0, 3, lambda i, c: drawing(c), init))
    assert re.search(message.replace("while_loop: body_fn", "fori_loop: body_fn"), got), got
    got = _message_of_refusal(lambda: lr.scan(lambda c, x: (drawing(c), None), init, None, length=2))
    assert re.search(message.replace("while_loop: body_fn", "scan: fn"), got), got


def test_while_loops_carries_are_its_arguments_returned_as_a_tuple_or_a_list():
    out = lr.while_loop(lambda i, x: i < 3, lambda i, x: [i + 1, x * 2], [0, lr.ones(2)])
    assert isinstance(out, tuple) and out[0].item() == 3 and out[1].tolist() == [8.0, 8.0]
    out = lr.while_loop(lambda i, x: i < 3, lambda i, x: Pair(i + 1, x * 2), Pair(0, lr.ones(2)))
    assert out[0].item() == 3 and out[1].tolist() == [8.0, 8.0]
