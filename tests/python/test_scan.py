"""lazyrt.scan, scan_layers, fori_loop and while_loop against PyTorch eager (a plain Python loop over the
same numbers, differentiated by torch's autograd): values and gradients, pytrees, reverse,
outputs the body does not compute, nesting, training steps replayed by compile_step, one
compile, errors, and a randomized comparison over many small scan bodies."""

import os

import numpy as np
import pytest
import torch

import lazyrt as lr

RTOL, ATOL = 1e-5, 1e-6


def close(a, b):
    np.testing.assert_allclose(a.numpy() if isinstance(a, lr.Tensor) else a,
                               b.detach().numpy() if isinstance(b, torch.Tensor) else b, rtol=RTOL, atol=ATOL)


def torch_scan(fn, init, xs, reverse=False):
    """The oracle: fn over the rows of xs in a Python loop, ys stacked on dim 0."""
    n = next(iter(xs.values() if isinstance(xs, dict) else xs)).shape[0] if isinstance(xs, (dict, tuple, list)) \
        else xs.shape[0]
    rows = range(n - 1, -1, -1) if reverse else range(n)
    carry, ys = init, [None] * n
    for r in rows:
        x = {k: v[r] for k, v in xs.items()} if isinstance(xs, dict) else \
            type(xs)(v[r] for v in xs) if isinstance(xs, (tuple, list)) else xs[r]
        carry, ys[r] = fn(carry, x)
    return carry, ys


def rng(seed):
    return np.random.default_rng(seed)


def test_rnn_cell_matches_torch_forward_and_reverse():
    g = rng(0)
    w, u, b = (g.standard_normal(s).astype(np.float32) * 0.3 for s in [(8, 8), (5, 8), (8,)])
    xs = g.standard_normal((12, 3, 5)).astype(np.float32)
    h0 = g.standard_normal((3, 8)).astype(np.float32)

    def cell(ops, W, U, B):
        def fn(h, x):
            h = ops.tanh(h @ W + x @ U + B)
            return h, h.sum(-1)
        return fn

    for reverse in (False, True):
        lw, lu, lb = lr.tensor(w), lr.tensor(u), lr.tensor(b)
        h, ys = lr.scan(cell(lr, lw, lu, lb), lr.tensor(h0), lr.tensor(xs), reverse=reverse)
        th, tys = torch_scan(cell(torch, torch.tensor(w), torch.tensor(u), torch.tensor(b)),
                             torch.tensor(h0), torch.tensor(xs), reverse=reverse)
        close(h, th)
        assert tuple(ys.shape) == (12, 3)
        close(ys, torch.stack(tys))


def test_pytree_carries_inputs_and_outputs():
    g = rng(1)
    a = g.standard_normal((6, 4)).astype(np.float32)
    b = g.integers(-5, 5, size=(6,))

    def fn(ops):
        def f(carry, x):
            s, (n, m) = carry["sum"], carry["stats"]
            s = s + x["a"] * 2
            n = n + x["b"]
            m = ops.maximum(m, x["a"])
            return {"sum": s, "stats": (n, m)}, [s.sum(), {"n": n}]
        return f

    init = {"sum": np.zeros(4, np.float32), "stats": (np.array(0), np.full(4, -10, np.float32))}
    carry, ys = lr.scan(fn(lr), {"sum": lr.tensor(init["sum"]), "stats": (lr.tensor(0), lr.tensor(init["stats"][1]))},
                        {"a": lr.tensor(a), "b": lr.tensor(b)})
    tc, tys = torch_scan(fn(torch), {"sum": torch.tensor(init["sum"]),
                                     "stats": (torch.tensor(0), torch.tensor(init["stats"][1]))},
                         {"a": torch.tensor(a), "b": torch.tensor(b)})
    assert set(carry) == {"sum", "stats"} and isinstance(carry["stats"], tuple)
    close(carry["sum"], tc["sum"])
    assert carry["stats"][0].item() == tc["stats"][0].item()
    close(carry["stats"][1], tc["stats"][1])
    assert isinstance(ys, list) and isinstance(ys[1], dict)
    close(ys[0], torch.stack([y[0] for y in tys]))
    assert ys[1]["n"].tolist() == torch.stack([y[1]["n"] for y in tys]).tolist()


def test_numbers_as_carries_none_as_y_and_length_without_xs():
    carry, ys = lr.scan(lambda c, x: ((c[0] + 1, c[1] * 2.0), None), (0, 1.5), lr.zeros((5, 2)))
    assert ys is None
    assert carry[0].item() == 5 and carry[0].dtype is lr.int64
    assert carry[1].item() == 1.5 * 32 and carry[1].dtype is lr.float32
    carry, ys = lr.scan(lambda c, x: (c * 3, c), lr.tensor(1), None, length=4)
    assert carry.item() == 81 and ys.tolist() == [1, 3, 9, 27]


def test_outputs_that_are_inputs_carries_constants_or_captures():
    g = rng(2)
    xs = g.standard_normal((5, 3)).astype(np.float32)
    cap = lr.tensor([1.0, 2.0, 3.0])

    def f(c, x):
        return (c[0] + x, c[1], cap), (x, c[0], lr.full((3,), 2.5), cap)

    (s, same, captured), (y_x, y_c, y_const, y_cap) = lr.scan(
        f, (lr.zeros(3), lr.tensor([4.0]), lr.zeros(3)), lr.tensor(xs))
    close(y_x, xs)
    close(y_c, np.concatenate([np.zeros((1, 3), np.float32), np.cumsum(xs, 0)[:-1]]))
    close(s, xs.sum(0))
    assert same.tolist() == [4.0] and captured.tolist() == [1.0, 2.0, 3.0]
    assert y_const.tolist() == [[2.5] * 3] * 5 and y_cap.tolist() == [[1.0, 2.0, 3.0]] * 5


def test_compiled_once_and_one_node_whatever_the_length():
    lr.cache.clear_memory()
    lr.metrics.reset()

    def run(xs):  # xs is data (an input of the graph), not a constant
        c, ys = lr.scan(lambda c, x: (c + x, c * x), lr.tensor(np.zeros(4, np.float32)), lr.tensor(xs))
        return c, ys

    c, ys = run(np.ones((10, 4), np.float32))
    ys.numpy()
    c, ys = run(np.full((10, 4), 3.0, np.float32))
    y = ys.numpy()
    assert lr.metrics.counter("UncachedCompile") == 1
    assert c.tolist() == [30.0] * 4 and y[9].tolist() == [81.0] * 4
    small = lr.debug.graph_node_count(list(run(np.ones((10, 4), np.float32))))
    assert lr.debug.graph_node_count(list(run(np.ones((3000, 4), np.float32)))) == small


def test_scan_inside_compiled_step_replays_with_new_inputs():
    w = lr.tensor(np.eye(3, dtype=np.float32) * 0.5)

    def step(xs):
        with lr.no_grad():
            h, ys = lr.scan(lambda h, x: (lr.tanh(h @ w + x), h.sum()), lr.zeros(3), xs)
        return [h, ys]

    g = rng(3)
    a = lr.tensor(g.standard_normal((7, 3)).astype(np.float32))
    s = lr.compile_step(step, (a,))
    tw = torch.tensor(w.numpy())
    for seed in range(3):
        xs = g.standard_normal((7, 3)).astype(np.float32)
        h, ys = s(lr.tensor(xs))
        th, tys = torch_scan(lambda h, x: (torch.tanh(h @ tw + x), h.sum()), torch.zeros(3), torch.tensor(xs))
        close(h, th)
        close(ys, torch.stack(tys))


def test_errors_name_the_leaf_and_change_nothing():
    xs = lr.zeros((4, 2))
    with pytest.raises(lr.Error, match=r"scan: fn result: carry\['h'\]: f32\[2\] vs f32\[3\]"):
        lr.scan(lambda c, x: ({"h": c["h"][:2] * 0 + x}, None), {"h": lr.zeros(3)}, xs)
    with pytest.raises(lr.Error, match="fn must return a pair"):
        lr.scan(lambda c, x: c, lr.zeros(2), xs)
    with pytest.raises(lr.Error, match="xs value 1 has 5 rows, expected 4"):
        lr.scan(lambda c, x: (c, None), lr.zeros(2), (xs, lr.zeros((5, 2))))
    with pytest.raises(lr.Error, match="length must be given"):
        lr.scan(lambda c, x: (c, None), lr.zeros(2), None)
    w = lr.ones(2, requires_grad=True)
    with pytest.raises(lr.Error, match="snapshots must be 0"):
        lr.while_loop(lambda c: c.sum() < 4, lambda c: c * w + 1, (lr.zeros(2),), snapshots=-2)
    with lr.no_grad():
        c, _ = lr.scan(lambda c, x: (c * w + x + 1, None), lr.zeros(2), xs)
    assert c.tolist() == [4.0, 4.0] and not c.requires_grad


# ---- gradients ----------------------------------------------------------------------------


def leaves(lib, *arrays):
    return [lib.tensor(a, requires_grad=True) for a in arrays]


def close_grads(lazy, eager):
    for k, (a, b) in enumerate(zip(lazy, eager)):
        assert (a.grad is None) == (b.grad is None), f"input {k}: gradient presence differs"
        if b.grad is not None:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"input {k}")


def test_gradients_through_pytrees_integer_carries_and_unused_outputs():
    g = rng(11)
    a, w = g.standard_normal((5, 3)).astype(np.float32), g.standard_normal(3).astype(np.float32)

    def run(lib):
        A, W = vals = leaves(lib, a, w)

        def fn(c, x):
            n, s = c["n"], c["s"]
            s = s * W + x["a"] * n.to(s.dtype)
            return {"n": n + 1, "s": s}, (s.sum(), n)
        init = {"n": lib.tensor(1), "s": lib.tensor(np.ones(3, np.float32))}
        if lib is lr:
            c, (y, counts) = lr.scan(fn, init, {"a": A})
            assert not counts.requires_grad and counts.tolist() == [1, 2, 3, 4, 5]
        else:
            c, ys = torch_scan(fn, init, {"a": A})
        c["s"].sum().backward()  # the ys are not part of the loss: no gradient through them
        return vals

    close_grads(run(lr), run(torch))


def test_nested_scans_and_fori_loop_gradients():
    g = rng(12)
    w, xs = g.standard_normal((3, 3)).astype(np.float32) * 0.5, g.standard_normal((4, 5, 3)).astype(np.float32)

    def run(lib):
        W, X = vals = leaves(lib, w, xs)

        def inner(c, x):
            return lib.tanh(c @ W + x), c.sum()

        def outer(h, x):
            if lib is lr:
                c, ys = lr.scan(inner, h, x)
            else:
                c, ys = torch_scan(inner, h, x)
                ys = torch.stack(ys)
            return c * 0.9, ys.sum()
        if lib is lr:
            h, ys = lr.scan(outer, lr.zeros(3), X)
            h2 = lr.fori_loop(0, 3, lambda i, c: lr.sigmoid(c @ W) * i.to(lr.float32), h)
        else:
            h, ys = torch_scan(outer, torch.zeros(3), X)
            ys, h2 = torch.stack(ys), h
            for i in range(3):
                h2 = torch.sigmoid(h2 @ W) * i
        ((h * h).sum() + ys.sum() + h2.sum()).backward()
        return vals

    close_grads(run(lr), run(torch))


def test_rnn_training_step_replayed_by_compile_step_matches_torch():
    g = rng(13)
    w0, u0 = g.standard_normal((5, 5)).astype(np.float32) * 0.4, g.standard_normal((2, 5)).astype(np.float32)
    W, U = lr.nn.Parameter(lr.tensor(w0)), lr.nn.Parameter(lr.tensor(u0))
    opt = lr.optim.Adam([W, U], lr=0.05)
    tW, tU = torch.tensor(w0, requires_grad=True), torch.tensor(u0, requires_grad=True)
    topt = torch.optim.Adam([tW, tU], lr=0.05)

    def step(xs, target):
        h, ys = lr.scan(lambda h, x: ((t := lr.tanh(h @ W + x @ U)), t.sum()), lr.zeros(5), xs)
        loss = ((ys - target) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return [loss]

    data = [(g.standard_normal((8, 2)).astype(np.float32), g.standard_normal(8).astype(np.float32)) for _ in range(6)]
    s = lr.compile_step(step, (lr.tensor(data[0][0]), lr.tensor(data[0][1])))
    for xs, target in data:
        loss = s(lr.tensor(xs), lr.tensor(target))[0].item()
        h, ys = torch.zeros(5), []
        for r in range(8):
            h = torch.tanh(h @ tW + torch.tensor(xs[r]) @ tU)
            ys.append(h.sum())
        tl = ((torch.stack(ys) - torch.tensor(target)) ** 2).mean()
        tl.backward()
        topt.step()
        topt.zero_grad()
        assert loss == pytest.approx(tl.item(), rel=1e-5, abs=1e-6)
    close(W, tW)
    close(U, tU)


def revolve_steps(n, s):
    """Griewank's count of forward steps to reverse n steps with s stored states."""
    from math import comb
    r = 0
    while comb(s + r, s) < n:
        r += 1
    return r * n - comb(s + r, s + 1)


@pytest.mark.parametrize("snapshots", [0, 1, 2, 5, 100])
@pytest.mark.parametrize("reverse", [False, True])
def test_rnn_gradients_match_torch_and_checkpointing_recomputes_the_revolve_count(reverse, snapshots):
    """Gradients of the weights, the bias, init and the rows; snapshots=0 keeps every carry,
    s >= 1 recomputes exactly Griewank's number of forward steps."""
    g = rng(10)
    n = 23
    arrays = [g.standard_normal(s).astype(np.float32) * 0.4 for s in [(6, 6), (4, 6), (6,), (3, 6), (n, 3, 4)]]

    def run(lib):
        W, U, B, h0, xs = vals = leaves(lib, *arrays)

        def fn(h, x):
            h = lib.tanh(h @ W + x @ U + B)
            return h, (h * h).sum(-1)
        if lib is lr:
            lr.metrics.reset()
            h, ys = lr.scan(fn, h0, xs, reverse=reverse, snapshots=snapshots)
        else:
            h, ys = torch_scan(fn, h0, xs, reverse)
            ys = torch.stack(ys)
        ((h * h).sum() + ys.sum() * 0.25).backward()
        return vals

    close_grads(run(lr), run(torch))
    want = revolve_steps(n, min(snapshots, n)) if snapshots else 0
    assert lr.metrics.counter("CheckpointForwardSteps") == want


def test_checkpointed_fori_loop_memory_does_not_grow_with_the_trip_count():
    w = lr.tensor(np.full((32, 32), 0.02, np.float32), requires_grad=True)
    x0 = lr.tensor(np.ones((8, 32), np.float32))

    def peak(n, snapshots):
        lr.cache.clear_memory()
        lr.debug.reset_peak_memory()
        before = lr.debug.live_memory_bytes()
        out = lr.fori_loop(0, n, lambda i, c: c + lr.tanh(c @ w), x0, snapshots=snapshots)
        out.sum().backward()
        w.grad.numpy()
        w.grad = None
        return lr.debug.peak_memory_bytes() - before

    assert peak(50, 3) == peak(3000, 3)
    assert peak(3000, 0) > peak(50, 0) + 2900 * 8 * 32 * 4  # keeping every carry: one a row
    with pytest.raises(lr.Error, match="snapshots must be 0"):
        lr.fori_loop(0, 3, lambda i, c: c, x0, snapshots=-1)


# ---- gradients through while_loop, and one executable for every trip count ----------------


def _flow(lib, W, U, B):
    """An Euler step of a driven vector field; the loop runs while the state's energy stays
    under a bound, at most `cap` trips: a trip count that is data."""
    return lambda h: h + 0.3 * lib.tanh(h @ W + B) @ U


@pytest.mark.parametrize("snapshots", [0, 1, 2, 3, 50])
def test_while_loop_gradients_match_torch_with_a_data_dependent_trip_count(snapshots):
    g = rng(21)
    arrays = [g.standard_normal(s) * 0.5 for s in [(5, 7), (7, 5), (7,), (3, 5)]]
    bound, cap = 60.0, 40

    def run(lib):
        W, U, B, h0 = vals = leaves(lib, *arrays)
        step = _flow(lib, W, U, B)
        if lib is lr:
            lr.metrics.reset()
            i, h = lr.while_loop(lambda i, h: lr.logical_and(i < cap, (h * h).sum() < bound),
                                 lambda i, h: (i + 1, step(h)), (0, h0), snapshots=snapshots)
            trips = int(i.item())
        else:
            trips, h = 0, h0
            while trips < cap and float((h * h).sum()) < bound:
                trips, h = trips + 1, step(h)
        loss = (h * h).sum() + h.sum()
        loss.backward()
        return trips, float(loss), vals

    trips, loss, got = run(lr)
    want_trips, want_loss, want = run(torch)
    assert trips == want_trips and 3 < trips < cap  # the bound, not the cap, ended the loop
    assert loss == pytest.approx(want_loss, rel=1e-12)
    for k, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"input {k}")
    # Keeping every carry rebuilds each once (n - 1 steps); s snapshots, Griewank's count.
    expect = revolve_steps(trips, min(snapshots, trips)) if snapshots else trips - 1
    assert lr.metrics.counter("CheckpointForwardSteps") == expect


def test_while_loop_gradients_through_captures_integer_carries_and_pytrees():
    w = lr.tensor(np.array([0.5, -1.5, 2.0]), requires_grad=True)
    tw = torch.tensor([0.5, -1.5, 2.0], dtype=torch.float64, requires_grad=True)
    out = lr.while_loop(lambda c: c["n"] < 4, lambda c: {"n": c["n"] + 1, "x": (c["x"][0] * w, c["x"][0] + 1.0)},
                        ({"n": 0, "x": (lr.tensor(np.ones(3)), lr.tensor(np.zeros(3)))},), snapshots=2)[0]
    x, y = torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    for _ in range(4):
        x, y = x * tw, x + 1.0
    ((out["x"][0] ** 2).sum() + out["x"][1].sum()).backward()
    ((x ** 2).sum() + y.sum()).backward()
    assert int(out["n"].item()) == 4
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("n, snapshots", [(23, 0), (23, 1), (23, 2), (23, 5), (100, 3), (7, 7), (7, 50)])
def test_checkpointed_fori_loop_rebuilds_griewanks_number_of_carries(n, snapshots):
    """A checkpointed fori_loop's backward evaluates the body r*N - C(s+r, s+1) times to
    rebuild the carries it did not keep (r the least with C(s+r, s) >= N; N - 1 when s >= N);
    snapshots=0 keeps every carry, rebuilt in one pass (N - 1), so that the trip count is
    counted when the graph runs. Gradients as torch's."""
    g = rng(31)
    arrays = [g.standard_normal((4, 4)) * 0.4, g.standard_normal((2, 4))]

    def run(lib):
        W, h = vals = leaves(lib, *arrays)
        step = lambda c: lib.tanh(c @ W) + c * 0.5  # noqa: E731
        if lib is lr:
            lr.metrics.reset()
            out = lr.fori_loop(0, n, lambda i, c: step(c), h, snapshots=snapshots)
        else:
            out = h
            for _ in range(n):
                out = step(out)
        (out * out).sum().backward()
        return vals

    got = run(lr)
    for a, b in zip(got, run(torch)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert lr.metrics.counter("CheckpointForwardSteps") == revolve_steps(n, min(snapshots or n, n))


def _grads_after(n, snapshots, form):
    w = lr.tensor(np.full((16, 16), 0.01, np.float32), requires_grad=True)
    x0 = lr.tensor(np.ones((4, 16), np.float32))
    body = lambda c: c + lr.tanh(c @ w)
    if form == "fori":
        out = lr.fori_loop(0, n, lambda i, c: body(c), x0, snapshots=snapshots)
    else:  # the bound is data: a tensor input, not a constant of the graph
        limit = lr.tensor(np.array(n))
        out = lr.while_loop(lambda i, c: i < limit, lambda i, c: (i + 1, body(c)), (0, x0), snapshots=snapshots)[1]
    out.sum().backward()
    return w.grad.numpy()


def _torch_grads_after(n):
    w = torch.full((16, 16), 0.01, dtype=torch.float32, requires_grad=True)
    c = torch.ones((4, 16), dtype=torch.float32)
    for _ in range(n):
        c = c + torch.tanh(c @ w)
    c.sum().backward()
    return w.grad.numpy()


@pytest.mark.parametrize("snapshots", [0, 50])
@pytest.mark.parametrize("form", ["fori", "while"])
def test_one_executable_serves_every_trip_count_when_differentiated(form, snapshots):
    """N = 10 compiles; N = 1,000 and 100,000 then run the same executable, whose backward
    runs over the count it finds when it runs (every carry kept with snapshots 0, rebuilt from
    50 stored ones otherwise). The gradients are torch's unrolled loop's."""
    lr.cache.clear_memory()
    lr.metrics.reset()
    small = _grads_after(10, snapshots, form)
    compiled = lr.metrics.counter("UncachedCompile")
    assert compiled >= 1
    middle = _grads_after(1000, snapshots, form)
    big = _grads_after(100_000, snapshots, form)
    assert lr.metrics.counter("UncachedCompile") == compiled
    assert np.isfinite(big).all() and not np.allclose(big, small)
    np.testing.assert_allclose(small, _torch_grads_after(10), rtol=1e-5)
    np.testing.assert_allclose(middle, _torch_grads_after(1000), rtol=1e-4)


def test_checkpointed_while_loop_memory_does_not_grow_with_the_trip_count():
    def peak(n, snapshots):
        lr.cache.clear_memory()
        lr.debug.reset_peak_memory()
        before = lr.debug.live_memory_bytes()
        _grads_after(n, snapshots, "while")
        return lr.debug.peak_memory_bytes() - before

    assert peak(50, 3) == peak(3000, 3)


def test_scan_layers_gradients_match_torch():
    lr.manual_seed(14)
    layers = [lr.nn.Linear(4, 4) for _ in range(3)]
    tlayers = [torch.nn.Linear(4, 4) for _ in range(3)]
    for a, b in zip(layers, tlayers):
        with torch.no_grad():
            b.weight.copy_(torch.tensor(a.weight.numpy()))
            b.bias.copy_(torch.tensor(a.bias.numpy()))
    x0 = rng(14).standard_normal((2, 4)).astype(np.float32)
    x, tx = lr.tensor(x0, requires_grad=True), torch.tensor(x0, requires_grad=True)
    lr.tanh(lr.scan_layers(layers, x)).sum().backward()
    th = tx
    for t in tlayers:
        th = t(th)
    torch.tanh(th).sum().backward()
    close_grads([x] + [p for m in layers for p in (m.weight, m.bias)],
                [tx] + [p for m in tlayers for p in (m.weight, m.bias)])


class Block(lr.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = lr.nn.Linear(d, d)
        self.norm = lr.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(lr.tanh(self.lin(x)) + x)


def test_scan_layers_matches_the_layers_applied_in_order():
    lr.manual_seed(4)
    layers = [Block(6) for _ in range(5)]
    x = lr.tensor(rng(4).standard_normal((3, 6)).astype(np.float32))
    tlayers = []
    for layer in layers:
        t = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.LayerNorm(6))
        with torch.no_grad():
            t[0].weight.copy_(torch.tensor(layer.lin.weight.numpy()))
            t[0].bias.copy_(torch.tensor(layer.lin.bias.numpy()))
            t[1].weight.copy_(torch.tensor(layer.norm.weight.numpy()))
            t[1].bias.copy_(torch.tensor(layer.norm.bias.numpy()))
        tlayers.append(t)
    th = torch.tensor(x.numpy())
    for t in tlayers:
        th = t[1](torch.tanh(t[0](th)) + th)
    with lr.no_grad():
        out = lr.scan_layers(layers, x)
    close(out, th)
    # The layers are as they were: their own parameters, unchanged.
    weights = [layer.lin.weight for layer in layers]
    with lr.no_grad():
        lr.scan_layers(layers, x)
    assert all(layer.lin.weight is w for layer, w in zip(layers, weights))
    close(layers[2].lin(x).detach(), tlayers[2][0](torch.tensor(x.numpy())))
    assert lr.scan_layers([], x) is x
    with pytest.raises(lr.Error, match="layer 1 is a Linear"):
        lr.scan_layers([Block(6), lr.nn.Linear(6, 6)], x)
    with pytest.raises(lr.Error, match="layer 1's lin.weight is f32\\[6, 7\\]"):
        b = Block(6)
        b.lin = lr.nn.Linear(7, 6)
        lr.scan_layers([Block(6), b], x)


def test_functional_call_swaps_and_restores_tied_weights():
    lin = lr.nn.Linear(3, 3, bias=False)
    seq = lr.nn.Sequential(lin, lr.nn.Tanh(), lin)  # the same weight twice
    x = lr.tensor(rng(5).standard_normal((2, 3)).astype(np.float32))
    w = lr.tensor(rng(6).standard_normal((3, 3)).astype(np.float32))
    before = lin.weight
    with lr.no_grad():
        y = lr.nn.utils.functional_call(seq, {"0.weight": w}, (x,))
    tw = torch.tensor(w.numpy())
    close(y, torch.tanh(torch.tensor(x.numpy()) @ tw.T) @ tw.T)
    assert lin.weight is before
    with pytest.raises(lr.Error, match="no parameter or buffer named nope"):
        lr.nn.utils.functional_call(seq, {"nope": w}, (x,))


# ---- randomized: many small scan bodies against torch ------------------------------------

UNARY = [("tanh", torch.tanh), ("sigmoid", torch.sigmoid), ("neg", torch.neg), ("abs", torch.abs)]


def random_body(g):
    """A random body over carries (a, b) f32[w] and a row x f32[w]: a few ops each."""
    steps = []
    for _ in range(int(g.integers(1, 5))):
        kind = int(g.integers(0, 4))
        if kind == 0:
            steps.append(("unary", UNARY[int(g.integers(len(UNARY)))][0], int(g.integers(3))))
        elif kind == 1:
            steps.append(("mix", float(g.uniform(-1, 1)), int(g.integers(3)), int(g.integers(3))))
        elif kind == 2:
            steps.append(("mul", int(g.integers(3)), int(g.integers(3))))
        else:
            steps.append(("max", int(g.integers(3)), int(g.integers(3))))
    outs = [int(g.integers(0, 3 + len(steps))) for _ in range(2)]
    ys = [int(g.integers(0, 3 + len(steps))) for _ in range(int(g.integers(0, 3)))]
    return steps, outs, ys


def run_body(ops, steps, outs, ys, a, b, x):
    vals = [a, b, x]
    for s in steps:
        if s[0] == "unary":
            fn = getattr(ops, s[1])
            vals.append(fn(vals[s[2]]))
        elif s[0] == "mix":
            vals.append(vals[s[2]] * s[1] + vals[s[3]])
        elif s[0] == "mul":
            vals.append(vals[s[1]] * vals[s[2]] * 0.5)
        else:
            vals.append(ops.maximum(vals[s[1]], vals[s[2]]))
    return (vals[outs[0]], vals[outs[1]]), tuple(vals[k] for k in ys)


def same_random_grads(lazy, eager):
    for k, (lg, tg) in enumerate(zip(lazy, eager)):
        if tg.grad is None:  # torch saw no path: lazyrt gives none, or zeros
            assert lg.grad is None or not lg.grad.numpy().any(), f"input {k}"
        else:
            assert lg.grad is not None, f"input {k}: no gradient"
            np.testing.assert_allclose(lg.grad.numpy(), tg.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"input {k}")


# LAZYRT_SCAN_FUZZ=N runs N random bodies instead of 40 (2,000 pass, values and gradients).
@pytest.mark.parametrize("seed", range(int(os.environ.get("LAZYRT_SCAN_FUZZ", 40))))
def test_random_scan_bodies_match_torch(seed):
    g = rng(1000 + seed)
    steps, outs, ys = random_body(g)
    w, n = int(g.integers(1, 6)), int(g.integers(0, 9))
    reverse = bool(g.integers(2))
    a0, b0 = (g.uniform(-1, 1, w).astype(np.float32) for _ in range(2))
    xs = g.uniform(-1, 1, (n, w)).astype(np.float32)

    def fn(ops):
        return lambda c, x: run_body(ops, steps, outs, ys, c[0], c[1], x)

    la0, lb0, lxs = leaves(lr, a0, b0, xs)
    ta0, tb0, txs = leaves(torch, a0, b0, xs)
    snapshots = int(g.choice([0, 0, 1, 2, 3]))  # the gradient's memory policy
    (a, b), lys = lr.scan(fn(lr), (la0, lb0), lxs, reverse=reverse, snapshots=snapshots)
    (ta, tb), tys = torch_scan(fn(torch), (ta0, tb0), txs, reverse)
    close(a, ta)
    close(b, tb)
    assert len(lys) == len(ys)
    tstacked = [torch.stack([t[k] for t in tys]) if n else None for k in range(len(ys))]
    for k in range(len(ys)):
        assert tuple(lys[k].shape) == (n, w)
        if n:
            close(lys[k], tstacked[k])
    # Gradients: a weighted sum of everything, backward through both.
    weights = g.uniform(-1, 1, 2 + len(ys))
    loss = a.sum() * weights[0] + b.sum() * weights[1] + sum(y.sum() * wk for y, wk in zip(lys, weights[2:]))
    tloss = ta.sum() * weights[0] + tb.sum() * weights[1] + sum(
        y.sum() * wk for y, wk in zip(tstacked, weights[2:]) if y is not None)
    if isinstance(loss, lr.Tensor) and loss.requires_grad:
        loss.backward()
    if isinstance(tloss, torch.Tensor) and tloss.requires_grad:
        tloss.backward()
    same_random_grads((la0, lb0, lxs), (ta0, tb0, txs))


# ---- random numbers in bodies ------------------------------------------------------------
# The unrolled loop under the same seed is the reference (torch's generator is another one):
# every form must draw the same numbers, leave the generator in the same state, and give the
# same gradients through a dropout.


def unrolled_or_looped(form, body, n, init):
    if form == "unrolled":
        c = init
        for i in range(n):
            c = body(lr.tensor(i), c)
        return c
    if form == "fori":
        return lr.fori_loop(0, n, body, init)
    if form == "while":
        _, c = lr.while_loop(lambda i, c: i < n, lambda i, c: (i + 1, body(i, c)), (lr.tensor(0), init))
        return c
    return lr.scan(lambda c, x: (body(x, c), None), init, lr.arange(n), snapshots=2 if form == "scan_ck" else 0)[0]


@pytest.mark.parametrize("form", ["fori", "while", "scan", "scan_ck"])
def test_random_numbers_in_bodies_are_the_unrolled_loops(form):
    def run(form):
        lr.manual_seed(21)
        w = lr.tensor([0.9, -0.4, 1.3], requires_grad=form != "while")

        def body(i, c):
            return lr.tanh(lr.dropout(c * w, 0.3, True) + lr.randn(3) * 0.1 + lr.rand(3))
        c = unrolled_or_looped(form, body, 7, lr.tensor([0.2, -0.1, 0.4]))
        out = [c.numpy()]
        if form != "while":
            c.sum().backward()
            out.append(w.grad.numpy())
        out.append(lr.rand(4).numpy())  # the generator continues where the loop ended
        return out

    got, want = run(form), run("unrolled")
    if form == "while":
        want = [want[0], want[2]]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("form", ["fori", "while", "scan", "scan_ck"])
def test_bernoulli_in_bodies_draws_as_the_unrolled_loop(form):
    """bernoulli of per-element probabilities (read from the carry) and of one p, in the body
    of each loop form: the same draws, the same final generator state and the same gradients
    (through the masked product) as the unrolled loop under the same seed."""
    def run(form):
        lr.manual_seed(31)
        w = lr.tensor([0.9, -0.4, 1.3, 0.2, -1.1, 0.6], requires_grad=True)
        masks = []

        def body(i, c):
            keep = lr.bernoulli(lr.sigmoid(c * 2.0))  # no gradient flows through a draw
            coin = lr.bernoulli([6], 0.3)
            masks.append(keep)
            return lr.tanh(c * w * keep + coin * 0.5 + 0.1)
        c = unrolled_or_looped(form, body, 9, lr.tensor([0.2, -0.1, 0.4, 1.0, -0.7, 0.05]))
        c.sum().backward()
        return c.numpy(), w.grad.numpy(), lr.rand(4).numpy(), len(masks)

    got, want = run(form), run("unrolled")
    assert got[3] == 1 and want[3] == 9  # the loop traced its body once, the host loop ran it 9 times
    for g, w in zip(got[:3], want[:3]):
        np.testing.assert_array_equal(g, w)
    assert got[1].any(), "some draws kept a path to w"

    if form == "scan":  # nine rows draw nine different masks (a loop replaying one draw would not)
        lr.manual_seed(31)
        _, ys = lr.scan(lambda c, x: (c, lr.bernoulli([16], 0.5)), lr.zeros(1), None, length=9)
        assert len({tuple(r) for r in ys.numpy()}) == 9


def test_each_iteration_draws_new_numbers_and_modules_can_be_built_in_a_body():
    lr.manual_seed(22)
    _, ys = lr.scan(lambda c, x: (c, lr.rand(2)), lr.zeros(1), None, length=5)
    rows = ys.numpy()
    assert len({tuple(r) for r in rows}) == 5  # five different draws

    def run(unrolled):
        lr.manual_seed(23)
        with lr.no_grad():
            def body(i, c):
                return lr.nn.Linear(3, 3)(c)  # its initialisation draws
            return unrolled_or_looped("unrolled" if unrolled else "fori", body, 3, lr.ones(2, 3)).numpy()
    np.testing.assert_array_equal(run(False), run(True))
    with pytest.raises(lr.Error, match="cond draws random numbers"):
        lr.while_loop(lambda c: (c + lr.rand(1)).sum() < 3, lambda c: c + 1, (lr.zeros(1),))


# LAZYRT_WHILE_FUZZ=N runs N random while bodies instead of 30.
@pytest.mark.parametrize("seed", range(int(os.environ.get("LAZYRT_WHILE_FUZZ", 30))))
def test_random_while_bodies_match_torch(seed):
    """The random bodies as while loops: carries (i, a, b), the row x a captured tensor; the
    trip count a carried limit (data, not a constant of the graph). Values and gradients of
    init and the capture against torch autograd through a Python while loop, under a random
    memory policy."""
    g = rng(5000 + seed)
    steps, outs, _ = random_body(g)
    w, n = int(g.integers(1, 6)), int(g.integers(0, 9))
    a0, b0, x0 = (g.uniform(-1, 1, w).astype(np.float32) for _ in range(3))
    la0, lb0, lx = leaves(lr, a0, b0, x0)
    ta0, tb0, tx = leaves(torch, a0, b0, x0)

    def body(ops, x):
        return lambda i, lim, a, b: (i + 1, lim, *run_body(ops, steps, outs, [], a, b, x)[0])

    snapshots = int(g.choice([0, 0, 1, 2, 3]))
    _, _, a, b = lr.while_loop(lambda i, lim, a, b: i < lim, body(lr, lx),
                               (lr.tensor(0), lr.tensor(n), la0, lb0), snapshots=snapshots)
    i, ta, tb = 0, ta0, tb0
    while i < n:
        i, _, ta, tb = body(torch, tx)(i, n, ta, tb)
    close(a, ta)
    close(b, tb)
    weights = g.uniform(-1, 1, 2)
    loss = a.sum() * weights[0] + b.sum() * weights[1]
    tloss = ta.sum() * weights[0] + tb.sum() * weights[1]
    loss.backward()
    tloss.backward()
    same_random_grads((la0, lb0, lx), (ta0, tb0, tx))
