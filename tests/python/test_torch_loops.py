"""lazyrt.torch's loops: bodies written with torch ops and torch.nn modules, run as lazyrt loops
(compiled once whatever the trip count), against the same loops run eagerly in PyTorch."""
import pytest
import torch

import lazyrt as lr
import lazyrt.torch as lt


def test_the_seed_counter_gives_13_with_torch_dtypes():
    def cond_fn(iteri, x):
        return iteri > 0

    def body_fn(iteri, x):
        return iteri - 1, torch.add(x, 1)

    i, x = lt.while_loop(cond_fn, body_fn, (torch.tensor(10), torch.tensor(3, dtype=torch.int32)))
    assert isinstance(x, torch.Tensor) and x.dtype == torch.int32 and i.dtype == torch.int64
    assert (int(i), int(x)) == (0, 13)


def test_a_linear_layer_in_the_body_matches_the_eager_loop_and_compiles_once():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)

    def cond_fn(i, limit, x):
        return i < limit

    def body_fn(i, limit, x):
        return i + 1, limit, torch.tanh(lin(x))

    x0 = torch.randn(3, 4)
    lr.metrics.reset()
    for limit in (1, 4, 9):
        i, _, x = lt.while_loop(cond_fn, body_fn, (torch.tensor(0), torch.tensor(limit), x0))
        ref = x0
        with torch.no_grad():
            for _ in range(limit):
                ref = torch.tanh(lin(ref))
        assert int(i) == limit
        torch.testing.assert_close(x, ref, rtol=1e-5, atol=1e-6)
    assert lr.metrics.counter("UncachedCompile") == 1, "one executable for every trip count"


def test_weights_are_read_anew_on_every_call():
    lin = torch.nn.Linear(2, 2, bias=False)

    def body(i, x):
        return lin(x)

    x0 = torch.ones(1, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2) * 2)
    assert lt.fori_loop(0, 3, body, x0).tolist() == [[8.0, 8.0]]
    with torch.no_grad():
        lin.weight.mul_(0.5)  # in place: the same tensor, a new value
    assert lt.fori_loop(0, 3, body, x0).tolist() == [[1.0, 1.0]]


def test_fori_loop_passes_the_index_and_keeps_pytree_carries():
    def body(i, carry):
        return {"acc": carry["acc"] + i.to(torch.float32), "hist": [carry["hist"][0] * 2, carry["hist"][1] - i]}

    init = {"acc": torch.zeros(2), "hist": [torch.ones(3), torch.tensor(0)]}
    out = lt.fori_loop(2, 7, body, init)
    ref = {"acc": torch.zeros(2), "hist": [torch.ones(3), torch.tensor(0)]}
    for i in range(2, 7):
        ref = body(torch.tensor(i), ref)
    assert set(out) == {"acc", "hist"} and isinstance(out["hist"], list)
    torch.testing.assert_close(out["acc"], ref["acc"])
    torch.testing.assert_close(out["hist"][0], ref["hist"][0])
    assert out["hist"][1].item() == ref["hist"][1].item() == -20


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_of_a_recurrent_cell_matches_the_eager_loop(reverse):
    torch.manual_seed(1)
    cell = torch.nn.GRUCell(3, 5)
    xs = torch.randn(6, 2, 3)

    def step(h, x):
        h = cell(x, h)
        return h, {"h": h, "norm": h.norm(dim=1)}

    h, ys = lt.scan(step, torch.zeros(2, 5), xs, reverse=reverse)
    ref_h, ref_ys = torch.zeros(2, 5), [None] * 6
    with torch.no_grad():
        for r in (reversed(range(6)) if reverse else range(6)):
            ref_h, ref_ys[r] = step(ref_h, xs[r])
    torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ys["h"], torch.stack([y["h"] for y in ref_ys]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ys["norm"], torch.stack([y["norm"] for y in ref_ys]), rtol=1e-5, atol=1e-6)


def test_results_are_the_callers_to_change():
    x = lt.fori_loop(0, 2, lambda i, c: c + 1, torch.zeros(2))
    x.add_(10)
    assert lt.fori_loop(0, 2, lambda i, c: c + 1, torch.zeros(2)).tolist() == [2.0, 2.0]


def test_bodies_that_cannot_run_as_loops_are_refused_clearly():
    def mutates(i, c):
        c.add_(1)
        return c

    with pytest.raises(lt.CaptureError, match="changes a carried tensor in place"):
        lt.fori_loop(0, 2, mutates, torch.zeros(2))
    with pytest.raises(lr.Error, match="carry"):
        lt.fori_loop(0, 2, lambda i, c: c.sum(), torch.zeros(2))
    with pytest.raises(lt.UnsupportedOperatorError, match="no lowering"):
        lt.fori_loop(0, 2, lambda i, c: torch.special.bessel_j0(c), torch.zeros(2))
    with pytest.raises(lt.CaptureError, match="must return tensors"):
        lt.fori_loop(0, 2, lambda i, c: 1.0, torch.zeros(2))
