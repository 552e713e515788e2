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


# ---- positions from the loop counter --------------------------------------------------------
# PyTorch's own int_carry while_loop program (test/functorch/test_control_flow.py,
# `_while_loop_tests()["int_carry"]`): the body writes row `it` of a copy of its carry, with
# `it` an integer carry, x.clone().select(0, it).copy_(...). Upstream gives it a Python int (a
# SymInt when traced); lazyrt.torch's carry is a 0-d int64 tensor, and select reads it when the
# graph runs. The expected values are PyTorch eager's loop.


def _int_carry_cond(it, x):
    return it < x.shape[0]


def _int_carry_body(it, x):
    x_clone = x.clone()
    x_clone.select(0, it).copy_(x_clone.select(0, it) + it)
    return it + 1, x_clone


def _eager_while(cond_fn, body_fn, carry):
    while cond_fn(*carry):
        carry = body_fn(*carry)
    return carry


def test_pytorchs_int_carry_program_indexes_rows_by_its_counter():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    it, got = lt.while_loop(_int_carry_cond, _int_carry_body, (0, x))
    want_it, want = _eager_while(_int_carry_cond, _int_carry_body, (0, x))
    assert int(it) == want_it == 3
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    lr.metrics.reset()
    for rows in (2, 5):  # the same body, other shapes: other captures, each right
        x = torch.randn(rows, 4)
        torch.testing.assert_close(lt.while_loop(_int_carry_cond, _int_carry_body, (0, x))[1],
                                   _eager_while(_int_carry_cond, _int_carry_body, (0, x))[1], rtol=0, atol=0)


def test_a_fori_loop_writes_row_i_of_a_buffer_and_reads_column_i():
    torch.manual_seed(1)
    w = torch.randn(4, 4)

    def body(i, carry):
        h, rows = carry
        h = torch.tanh(h @ w + w.select(1, i))  # column i of a captured tensor
        rows = rows.clone()
        rows.select(0, i).copy_(h.sum(0))
        return h, rows

    h0 = torch.randn(2, 4)
    h, rows = lt.fori_loop(0, 4, body, (h0, torch.zeros(4, 4)))
    want = (h0, torch.zeros(4, 4))
    for i in range(4):
        want = body(i, want)
    torch.testing.assert_close(h, want[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rows, want[1], rtol=1e-6, atol=1e-6)


def test_gradients_flow_through_rows_written_at_the_counter():
    torch.manual_seed(2)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(4, dtype=torch.float64, requires_grad=True)

    def body(it, y):
        row = torch.sin(y.select(0, it)) * scale
        y = y.clone()
        y.select(0, it).copy_(row)
        return it + 1, y

    weights = torch.randn(3, 4, dtype=torch.float64)
    (lt.while_loop(_int_carry_cond, body, (0, x))[1] * weights).sum().backward()
    got = (x.grad.clone(), scale.grad.clone())
    x.grad = scale.grad = None
    (_eager_while(_int_carry_cond, body, (0, x))[1] * weights).sum().backward()
    torch.testing.assert_close(got[0], x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], scale.grad, rtol=1e-12, atol=1e-12)


def test_a_counter_position_out_of_range_or_used_as_a_number_is_an_error():
    def past_the_end(it, x):  # runs with it == 3 on 3 rows
        return it + 1, x + x.select(0, it)

    with pytest.raises(lr.Error, match="select"):
        lt.while_loop(lambda it, x: it < 4, past_the_end, (0, torch.zeros(3, 3)))[1].sum().item()
    with pytest.raises(lt.UnsupportedOperatorError, match="position of select"):
        lt.while_loop(lambda it, x: it < 2, lambda it, x: (it + 1, x * it.item()), (0, torch.ones(2)))
    with pytest.raises(lt.CaptureError, match="reads the value of a tensor .* a Python int"):
        lt.while_loop(lambda it, x: it < 2, lambda it, x: (it + 1, x * int(it)), (0, torch.ones(2)))


# ---- gradients: torch autograd through lazyrt's loops ---------------------------------------


def _same_grads(got, want):
    for k, (a, b) in enumerate(zip(got, want)):
        assert (a.grad is None) == (b.grad is None), f"tensor {k}: gradient presence differs"
        if b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12, msg=f"tensor {k}")


@pytest.mark.parametrize("snapshots", [0, 2])
def test_gradients_through_a_while_loop_with_a_data_dependent_trip_count(snapshots):
    def run(loop):
        torch.manual_seed(3)
        lin = torch.nn.Linear(4, 4).double()
        x0 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        body = lambda i, x: (i + 1, torch.tanh(lin(x)) * 1.5 + x)  # noqa: E731
        if loop:
            i, x = lt.while_loop(lambda i, x: (x * x).sum() < 200.0, body, (torch.tensor(0), x0), snapshots=snapshots)
        else:
            i, x = torch.tensor(0), x0
            while float((x * x).sum()) < 200.0:
                i, x = body(i, x)
        assert x.requires_grad and not i.requires_grad
        (x.sin().sum() + x.sum()).backward()
        return int(i), [lin.weight, lin.bias, x0]

    trips, got = run(True)
    want_trips, want = run(False)
    assert trips == want_trips and trips > 2
    _same_grads(got, want)


@pytest.mark.parametrize("reverse", [False, True])
def test_gradients_through_a_scan_of_a_gru_cell(reverse):
    def run(loop):
        torch.manual_seed(1)
        cell = torch.nn.GRUCell(3, 5).double()
        xs = torch.randn(6, 2, 3, dtype=torch.float64, requires_grad=True)
        h0 = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)

        def step(h, x):
            h = cell(x, h)
            return h, h.norm(dim=1)

        if loop:
            h, ys = lt.scan(step, h0, xs, reverse=reverse, snapshots=2 if reverse else 0)
        else:
            h, rows = h0, [None] * 6
            for r in (reversed(range(6)) if reverse else range(6)):
                h, rows[r] = step(h, xs[r])
            ys = torch.stack(rows)
        ((h * h).sum() + (ys * torch.arange(1.0, 7.0, dtype=torch.float64)[:, None]).sum()).backward()
        return [*cell.parameters(), xs, h0]

    _same_grads(run(True), run(False))


def test_gradients_reach_captured_tensors_and_pytree_carries_of_a_fori_loop():
    def run(loop):
        w = torch.tensor([0.5, -1.5, 2.0], dtype=torch.float64, requires_grad=True)
        a = torch.ones(3, dtype=torch.float64, requires_grad=True)
        frozen = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)  # no gradient wanted
        body = lambda i, c: {"a": c["a"] * w + frozen, "n": c["n"] + i}  # noqa: E731
        if loop:
            c = lt.fori_loop(0, 4, body, {"a": a, "n": torch.tensor(0)}, snapshots=3)
        else:
            c = {"a": a, "n": torch.tensor(0)}
            for i in range(4):
                c = body(torch.tensor(i), c)
        assert int(c["n"]) == 6 and not c["n"].requires_grad
        (c["a"] ** 2).sum().backward()
        return [w, a, frozen]

    _same_grads(run(True), run(False))


def test_no_gradient_is_recorded_under_no_grad_or_for_tensors_that_need_none():
    w = torch.ones(2, requires_grad=True)
    with torch.no_grad():
        (x,) = lt.while_loop(lambda x: x.sum() < 10, lambda x: (x * w + 1,), (torch.ones(2),))
    assert not x.requires_grad and x.tolist() == [5.0, 5.0]
    (y,) = lt.while_loop(lambda x: x.sum() < 10, lambda x: (x * 2 + 1,), (torch.ones(2),))
    assert not y.requires_grad and y.tolist() == [7.0, 7.0]


# ---- PyTorch's own loop ops (torch._higher_order_ops) inside lazyrt.torch.compile ---------------
# A step that calls torch's while_loop or scan is captured with the loop as one higher-order
# node, lowered to one lazyrt loop node: compiled once whatever the trip count. The oracle is
# the same function run eagerly by PyTorch.

def _seed_count(iteri, x):
    """The first seed's counter through torch's own while_loop: (0, x + iteri)."""
    from torch._higher_order_ops.while_loop import while_loop
    return while_loop(lambda i, v: i > 0, lambda i, v: (i - 1, torch.add(v, 1)), (iteri, x))


def test_torch_while_loop_in_a_compiled_function_gives_13_and_compiles_once_for_every_count():
    compiled = lt.compile(_seed_count)
    lr.metrics.reset()
    for n in (10, 1000, 3):
        args = (torch.tensor(n), torch.tensor(3, dtype=torch.int32))
        got, want = compiled(*args), _seed_count(*args)
        assert [t.dtype for t in got] == [torch.int64, torch.int32]
        assert [int(t) for t in got] == [int(t) for t in want] == [0, 3 + n]
    # one capture, traced by lazyrt once: one graph, one executable for every trip count
    assert compiled.captures == 1 and compiled.traces == 1
    assert lr.metrics.counter("UncachedCompile") <= 1


def test_torch_while_loop_reads_a_module_and_a_closure_tensor_anew_each_call():
    from torch._higher_order_ops.while_loop import while_loop
    torch.manual_seed(1)
    lin = torch.nn.Linear(4, 4)
    shift = torch.randn(4)

    def cond_fn(i, x):
        return i < 5

    def body_fn(i, x):
        return i + 1, torch.tanh(lin(x)) + shift

    def run(x):
        return while_loop(cond_fn, body_fn, (torch.tensor(0), x))[1]

    compiled = lt.compile(run, model=lin)  # lin is reached through the body, not the step's closure
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), run(x), rtol=1e-5, atol=1e-6)
        shift.mul_(-2.0)          # changed in place: the next call must read the new values
        lin.weight.add_(0.25)
        torch.testing.assert_close(compiled(x), run(x), rtol=1e-5, atol=1e-6)


def test_torch_scan_in_a_compiled_function_matches_eager():
    from torch._higher_order_ops.scan import scan
    torch.manual_seed(2)
    w = torch.randn(3)

    def combine(carry, x):
        h = torch.tanh(carry * w + x)
        return h, (h * 2).clone()

    def run(init, xs):
        return scan(combine, init, xs)

    compiled = lt.compile(run)
    lr.metrics.reset()
    for steps in (4, 9):
        init, xs = torch.randn(3), torch.randn(steps, 3)
        got, want = compiled(init, xs), run(init, xs)
        for g, v in zip(got, want):
            assert g.shape == v.shape
            torch.testing.assert_close(g, v, rtol=1e-5, atol=1e-6)


def test_torch_while_loop_through_the_torch_compile_backend_compiles_once():
    torch._dynamo.reset()
    compiled = torch.compile(_seed_count, backend="lazyrt")
    lr.metrics.reset()
    for n in (10, 1000):
        args = (torch.tensor(n), torch.tensor(3, dtype=torch.int32))
        assert [int(t) for t in compiled(*args)] == [int(t) for t in _seed_count(*args)] == [0, 3 + n]
    # one Dynamo graph, lowered to one lazyrt loop, compiled once, nothing run in eager
    assert lr.metrics.counter("DynamoGraph") == 1 and lr.metrics.counter("GraphBreak") == 0
    assert lr.metrics.counter("UncachedCompile") <= 1


# ---- captured bodies kept from call to call ------------------------------------------------------
# A body is captured (make_fx) once and its capture kept for later calls that would capture the
# same graph; a change of anything the body reads captures again; tensors it reads from places
# are read there on every call. Each call is compared with the loop run eagerly in PyTorch.

def _eager_scan(fn, init, xs):
    carry, ys = init, []
    for x in xs:
        carry, y = fn(carry, x)
        ys.append(y)
    return carry, torch.stack(ys)


def _captures():
    return lr.metrics.counter("LoopBodyCapture")


scale = 0.5
shift = torch.zeros(4)


def _cell(w):
    def fn(h, x):
        h = torch.tanh(h @ w + x * scale + shift)
        return h, h.sum(1)
    return fn


def test_ten_identical_scans_capture_their_body_once():
    torch.manual_seed(0)
    w, init, xs = torch.randn(4, 4) * 0.5, torch.zeros(2, 4), torch.randn(5, 2, 4)
    fn = _cell(w)
    before = _captures()
    for _ in range(10):
        h, ys = lt.scan(fn, init, xs)
        ref_h, ref_ys = _eager_scan(fn, init, xs)
        torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ys, ref_ys, rtol=1e-5, atol=1e-6)
    assert _captures() - before == 1


def test_a_body_made_anew_for_every_call_is_captured_once_and_reads_its_own_closure():
    # The same code with another closure: the capture is kept with the code, and the tensor the
    # new closure holds (another weight each call) is what the call reads.
    def cell(w):  # (its own code: the captures of _cell's are kept from the tests before)
        def fn(h, x):
            h = torch.tanh(h @ w + x)
            return h, h.sum(1)
        return fn
    torch.manual_seed(1)
    init, xs = torch.zeros(2, 4), torch.randn(3, 2, 4)
    before = _captures()
    for k in range(5):
        w = torch.randn(4, 4) * 0.5  # a new tensor of the same shape for every body
        fn = cell(w)
        h, ys = lt.scan(fn, init, xs)
        torch.testing.assert_close(h, _eager_scan(fn, init, xs)[0], rtol=1e-5, atol=1e-6)
    assert _captures() - before == 1
    fn = cell(torch.randn(4, 4, dtype=torch.float64).float()[:, :4])  # same metadata: no capture
    lt.scan(fn, init, xs)
    assert _captures() - before == 1
    w3 = torch.randn(4, 3) * 0.5  # another shape: captured again
    h, _ = lt.scan(lambda h, x: (torch.tanh(h[:, :4] @ w3).repeat(1, 2)[:, :4] + x, x.sum(1)), init, xs)
    assert _captures() - before == 2


def test_a_python_number_or_a_global_tensor_the_body_reads_changed_between_calls():
    global scale, shift
    torch.manual_seed(2)
    w, init, xs = torch.randn(4, 4) * 0.5, torch.zeros(2, 4), torch.randn(4, 2, 4)

    def fn(h, x):  # (its own code: the captures of _cell's are kept from the tests before)
        h = torch.tanh(h @ w + x * scale + shift)
        return h, h.sum(1)
    before = _captures()
    try:
        for k, (new_scale, new_shift) in enumerate([(0.5, None), (0.5, torch.ones(4)), (2.0, None),
                                                    (0.5, torch.full((4,), -1.0)), (2.0, torch.zeros(4))]):
            scale = new_scale
            if new_shift is not None:
                shift = new_shift  # a new tensor: read anew, no capture
            h, ys = lt.scan(fn, init, xs)
            ref_h, ref_ys = _eager_scan(fn, init, xs)
            torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-6, msg=f"call {k}")
            torch.testing.assert_close(ys, ref_ys, rtol=1e-5, atol=1e-6, msg=f"call {k}")
    finally:
        scale, shift = 0.5, torch.zeros(4)
    assert _captures() - before == 2, "one capture per value of scale"


def test_a_module_whose_weight_is_replaced_or_whose_mode_changes_captures_again():
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))

    def body(i, x):
        return net(x)

    x0 = torch.randn(2, 4)

    def eager(n):
        x = x0
        with torch.no_grad():
            for _ in range(n):
                x = net(x)
        return x
    net.eval()
    before = _captures()
    torch.testing.assert_close(lt.fori_loop(0, 3, body, x0), eager(3))
    torch.testing.assert_close(lt.fori_loop(0, 3, body, x0), eager(3))
    assert _captures() - before == 1
    net[0].weight = torch.nn.Parameter(torch.randn(4, 4))  # another parameter object
    torch.testing.assert_close(lt.fori_loop(0, 3, body, x0), eager(3))
    assert _captures() - before == 2
    net.train()  # dropout on: another graph (values compared in eval mode only)
    lt.fori_loop(0, 3, body, x0)
    assert _captures() - before == 3
    net.eval()
    torch.testing.assert_close(lt.fori_loop(0, 3, body, x0), eager(3))
    assert _captures() - before == 3, "the eval-mode capture again"


def test_a_while_loop_called_again_costs_no_capture():
    def cond_fn(i, x):
        return i < 10

    def body_fn(i, x):
        return i + 1, x * 1.5

    before = _captures()
    for k in range(4):
        i, x = lt.while_loop(cond_fn, body_fn, (torch.tensor(0), torch.full((3,), float(k))))
        torch.testing.assert_close(x, torch.full((3,), float(k)) * 1.5 ** 10)
    assert _captures() - before == 2, "cond and body, once each"
