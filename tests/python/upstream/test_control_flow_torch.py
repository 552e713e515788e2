"""Cases of PyTorch's test/functorch/test_control_flow.py (pytorch/pytorch), written for lazyrt:
the while_loop cases, that is the programs of `_while_loop_tests()` and the tests that run them.

Upstream checks torch.while_loop (eager, traced, compiled, exported) against `_fake_while_loop`,
a plain Python loop. Here each program is written once, over a namespace of ops, and run twice:
through lazyrt.while_loop on lazyrt tensors, and as a plain Python loop in PyTorch eager (upstream's
`_fake_while_loop`) on the same values. PyTorch's results are the expected values.

Ported: every program of `_while_loop_tests()` -- "simple", "simple_with_mutation", "nested",
"nested2", "simple_with_linear", "nested_with_linear", "simple_with_pytree_carry", "int_carry",
"pytree_int_carry", "const_and_symint_output" -- and test_while_loop_op_mismatch_in_meta
(a body result whose metadata differs from the carry's is refused).

Differences from upstream, where lazyrt's model needs them:
- Linear layers are lazyrt.nn.Linear; torch.nn.Linear gets their weights, so both sides compute
  from the same values. The value checks run under lazyrt.no_grad() and torch.no_grad().
- Gradients. Newer upstream revisions make the inputs of "int_carry", "pytree_int_carry" and
  "const_and_symint_output" require grad (torch.randn(2, 3, requires_grad=True)). Here those
  three programs run with inputs that require grad on both sides (test_gradients_match_torch_
  autograd): which outputs require grad must agree (a carry that stays an integer never does),
  and the input's gradient through lazyrt.while_loop must equal torch autograd's through the
  Python loop, for a weighted sum of every output that requires grad (weights drawn at random
  rather than ones: a gradient that lost or swapped rows would still pass with ones in
  int_carry). Not upstream: the two Linear programs are differentiated too (the weights'
  gradients through the while loops, nested included).
- "int_carry": upstream writes `x_clone.select(0, it).copy_(...)` with a Python-int carry that
  becomes a SymInt; lazyrt's carry is a 0-d int64 tensor, and select takes it as the position
  (a view whose position is read when the graph runs), so the body is upstream's. The output
  `torch.ones(out_it * 2)` (a shape from a loop result) reads the count first with `.item()`:
  lazyrt's shapes are static.
- "pytree_int_carry": upstream's input shape (2, 3) stops the loop before its first iteration
  (2*2*3 >= 2*3); the case also runs with shape (4, 5), where the loop iterates once.
- test_while_loop_op_mismatch_in_meta: upstream's body returns `a.nonzero()` (a data-dependent
  shape); lazyrt has no nonzero, so the body returns a reshaped tensor, which changes the
  metadata just as well. The check is for lazyrt.Error naming the carry.

Left out, and why:
- test_while_loop_nested_traced, test_while_loop_nested2_traced,
  test_while_loop_simple_functionalize_check_graph, test_while_loop_functionalize,
  test_while_loop_tracing, test_while_loop_compile, test_while_loop_pytree_carry,
  test_while_loop_simple_with_linear_compile_check_graph, test_while_loop_op_int_carry_export,
  test_while_loop_op_int_carry_compile, test_while_loop_op_constant_and_symint_output_export,
  test_while_loop_op_constant_and_symint_output_compile, test_while_loop_op_pytree_int_carry_export,
  test_while_loop_op_pytree_int_carry_compile, test_while_loop_schema_gen: they run the same
  programs through make_fx, functionalization, torch.compile and torch.export and compare the
  printed FX graphs and schemas. Those are PyTorch's tracing machinery; what they check of the
  values (the traced program equals eager) is what every case here checks of lazyrt.
- test_while_loop_gpu: "simple" on a CUDA device; lazyrt has no device argument ("simple" is
  ported).
- test_two_hops_not_sharing_code_obj: counts torch.compile recompilations (dynamo internals).
- test_associative_scan_loop_in_combine_fn: upstream only instantiates its "for" variant (the
  while_loop variant is an expected failure), inside associative_scan, which lazyrt lacks.
"""

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_map

import lazyrt as lr

TORCH_DTYPE = {lr.float32: torch.float32, lr.float64: torch.float64, lr.int32: torch.int32,
               lr.int64: torch.int64, lr.bool: torch.bool}
RTOL, ATOL = 1e-5, 1e-6


def fake_while_loop(cond_fn, body_fn, operands):
    """The oracle: torch's `_fake_while_loop`, a plain Python loop over torch eager ops."""
    while cond_fn(*operands):
        operands = body_fn(*operands)
    return operands


class Lib:
    """The names a program uses, for one of the two libraries."""

    def __init__(self, lazy):
        self.lazy = lazy
        self.T = lr if lazy else torch
        self.nn = lr.nn if lazy else torch.nn
        self.while_loop = lr.while_loop if lazy else fake_while_loop
        self.tensor = lr.tensor if lazy else torch.tensor


LAZY, EAGER = Lib(True), Lib(False)


def assert_tree_close(got, want, path="result", top=True):
    """A lazyrt result (got) equals PyTorch's (want): structure, shapes, dtypes and values. A
    Python number on PyTorch's side (a carry that stayed a number) is a 0-d tensor on lazyrt's."""
    if isinstance(want, (tuple, list)):
        # At the top, lazyrt returns a tuple whatever sequence the carry came in.
        if top:
            assert isinstance(got, (tuple, list)), f"{path}: {type(got).__name__}"
        else:
            assert type(got) is type(want), f"{path}: {type(got).__name__} vs {type(want).__name__}"
        assert len(got) == len(want), f"{path}: {len(got)} vs {len(want)} items"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_tree_close(g, w, f"{path}[{i}]", top=False)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{path}: keys"
        for k in want:
            assert_tree_close(got[k], want[k], f"{path}[{k!r}]", top=False)
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, lr.Tensor), f"{path}: {type(got).__name__}"
        assert tuple(got.shape) == tuple(want.shape), f"{path}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
        assert TORCH_DTYPE[got.dtype] == want.dtype, f"{path}: dtype {got.dtype} vs {want.dtype}"
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL, err_msg=path)
    else:
        assert isinstance(want, (bool, int, float)), f"{path}: oracle gave {type(want).__name__}"
        assert isinstance(got, lr.Tensor) and got.dim() == 0, f"{path}: {got!r}"
        kind = lr.bool if isinstance(want, bool) else lr.int64 if isinstance(want, int) else lr.float32
        assert got.dtype is kind, f"{path}: dtype {got.dtype} for the Python {type(want).__name__} {want}"
        assert got.item() == pytest.approx(want, rel=RTOL), f"{path}: {got.item()} vs {want}"


def both(program, *arrays):
    """Runs program(lib, *inputs) on lazyrt and on torch, the inputs made from the same arrays
    (or numbers); returns (lazyrt result, torch result)."""
    def inputs(lib):
        return [lib.tensor(a) if isinstance(a, (np.ndarray, np.generic)) else a for a in arrays]

    with lr.no_grad():
        got = program(LAZY, *inputs(LAZY))
    with torch.no_grad():
        want = program(EAGER, *inputs(EAGER))
    return got, want


def randn(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def zeros(*shape):
    return np.zeros(shape, np.float32)


# ---- the programs of _while_loop_tests() ---------------------------------------------------


def simple(lib, x):
    return lib.while_loop(lambda x: x.sum() < 10, lambda x: (x + 1,), (x,))


def simple_with_mutation(lib, x):
    def cond_fn(x):
        y = x.clone().add_(1).add_(-1)
        return y.sum() < 10

    def body_fn(x):
        y = x.clone().add_(1).add_(-1)
        return (y + 1,)

    return lib.while_loop(cond_fn, body_fn, (x,))


def nested(lib, out_iter, it, y):
    def inner_body(out_iter, it, y):
        return out_iter.clone(), it + y, y + 1

    def outer_body(out_iter, it, y):
        out_iter, it, y = lib.while_loop(lambda o, i, y: i.sum() < 10, inner_body, (out_iter, it, y))
        return out_iter + 1, it, y

    return lib.while_loop(lambda o, i, y: o.sum() < 2, outer_body, (out_iter, it, y))


def nested2(lib, ci, cj, a, b):
    def inner_body(i2, j2, x2, y2):
        return i2.clone(), j2 - 1, x2 + 3.14, y2 - 2.71

    def outer_body(i1, j1, x1, y1):
        i1, j1, x1, y1 = lib.while_loop(lambda i, j, x, y: j > 0, inner_body, [i1, j1, x1, y1])
        return i1 - 1, j1.clone(), x1 * 2, y1 / 2

    return lib.while_loop(lambda i, j, x, y: i > 0, outer_body, (ci, cj, a, b))


def simple_with_linear_class(lib):
    class SimpleWithLinear(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = lib.nn.Linear(2, 2)
            self.register_buffer("dec", lib.tensor(1))

        def forward(self, iter, x):
            return lib.while_loop(lambda it, x: it - self.dec > 0,
                                  lambda it, x: (it - 1, self.linear(x)), (iter, x))

    return SimpleWithLinear


def nested_with_linear_class(lib):
    inner = simple_with_linear_class(lib)

    class NestedWithLinear(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.mod = inner()
            self.outer_linear = lib.nn.Linear(2, 2)
            self.register_buffer("dec", lib.tensor(1))

        def forward(self, iter, x):
            return lib.while_loop(lambda it, x: it - self.dec > 0,
                                  lambda it, x: (it - 1, self.outer_linear(self.mod(it, x)[1])), (iter, x))

    return NestedWithLinear


def simple_with_pytree_carry(lib, it, x, y, z):
    def body_fn(it, tree):
        x, y, z = tree[0][0], tree[1]["x"], tree[1]["y"]
        return it - 1, ([y.sin()], {"x": z.cos(), "y": x + 1})

    return lib.while_loop(lambda it, tree: it > 0, body_fn, (it, ([x], {"x": y, "y": z})))


def int_carry(lib, x):
    rows = x.shape[0]

    def body_fn(it, x):
        x_clone = x.clone()
        x_clone.select(0, it).copy_(x_clone.select(0, it) + it)
        return it + 1, x_clone

    out_it, out_x = lib.while_loop(lambda it, x: it < rows, body_fn, (0, x))
    count = out_it.item() if lib.lazy else out_it  # lazyrt's shapes are static: read it first
    return out_it + 1, out_it + out_x, out_it < rows, lib.T.ones(count * 2)


def pytree_int_carry(lib, x):
    a, b = x.shape[0], x.shape[1]

    def cond_fn(shapes, const_int_dict, x):
        a, b = shapes
        c1, c2, c3 = const_int_dict["int_carry"]
        return c1 * c2 * c3 < a * b

    def body_fn(shapes, const_int_dict, x):
        a, b = shapes
        c1, c2, c3 = const_int_dict["int_carry"]
        return [a + 1, b + 1], {"int_carry": (c1 + 1, c2 + 1, c3 + 1)}, x + 1

    out_shapes, out_it, out_x = lib.while_loop(cond_fn, body_fn, ([a, b], {"int_carry": (2, 2, 3)}, x.sin()))
    out_inc = tree_map(lambda v: v + 1, out_it)
    out_add = tree_map(lambda v: v + out_x, out_it)
    return out_shapes, out_inc, out_add, out_x


def const_and_symint_output(lib, t):
    a, b = t.shape[0], t.shape[1]

    def cond_fn(a, b, c1, c2, c3, c0, u0, x):
        return c1 * c2 * c3 < a * b

    def body_fn(a, b, c1, c2, c3, c0, u0, x):
        return b, c1, c2, c3, a, 0, u0 + 1, x + 1

    total = t.sum().to(lib.T.int64).item()
    out = lib.while_loop(cond_fn, body_fn, (a, b, 1, 1, 1, a + 1, total, t.sin()))
    out_inc = tree_map(lambda v: v + 1, out)
    out_add = tree_map(lambda v: v + t, out)
    return out_inc, out_add


# ---- the tests -----------------------------------------------------------------------------


def test_simple():
    got, want = both(simple, zeros(1))
    assert_tree_close(got, want)
    assert got[0].item() == 10.0


def test_simple_with_mutation():
    got, want = both(simple_with_mutation, zeros(1))
    assert_tree_close(got, want)
    assert got[0].item() == 10.0


def test_nested():
    got, want = both(nested, zeros(1), zeros(1), zeros(1))
    assert_tree_close(got, want)
    # The inner loop runs 5 times on the first outer pass (it: 0, 0, 1, 3, 6, 10), not after.
    assert [v.item() for v in got] == [2.0, 10.0, 5.0]


def test_nested2():
    got, want = both(nested2, np.int64(2), np.int64(2), np.ones((2, 2), np.float32),
                     np.ones((2, 2), np.float32))
    assert_tree_close(got, want)
    assert got[0].item() == 0 and got[1].item() == 0


def copy_module(lazy_module, torch_module):
    """torch_module takes lazy_module's parameters and buffers."""
    state = {k: torch.tensor(np.array(v.numpy())) for k, v in lazy_module.state_dict().items()}
    torch_module.load_state_dict(state)
    return torch_module


LINEAR_CLASSES = pytest.mark.parametrize("make_class", [simple_with_linear_class, nested_with_linear_class],
                                         ids=["simple_with_linear", "nested_with_linear"])


def linear_modules(make_class):
    """A lazyrt module and the torch module with its weights."""
    lr.manual_seed(0)
    lazy_module = make_class(LAZY)()
    return lazy_module, copy_module(lazy_module, make_class(EAGER)()), randn(1, 2, 2)


@LINEAR_CLASSES
def test_with_linear(make_class):
    lazy_module, torch_module, x = linear_modules(make_class)
    with lr.no_grad():
        got = lazy_module(lr.tensor(3), lr.tensor(x))
    with torch.no_grad():
        want = torch_module(torch.tensor(3), torch.tensor(x))
    assert_tree_close(got, want)
    assert got[0].item() == 1


@LINEAR_CLASSES
def test_with_linear_gradients(make_class):
    lazy_module, torch_module, x = linear_modules(make_class)
    got = lazy_module(lr.tensor(4), lr.tensor(x, requires_grad=True))
    want = torch_module(torch.tensor(4), torch.tensor(x, requires_grad=True))
    (got[1] * got[1]).sum().backward()
    (want[1] * want[1]).sum().backward()
    assert_tree_close(got, tuple(w.detach() for w in want))
    named = dict(torch_module.named_parameters())
    for name, p in lazy_module.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), named[name].grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_simple_with_pytree_carry():
    got, want = both(simple_with_pytree_carry, np.int64(3), randn(2, 3, 3), randn(3, 3, 3), randn(4, 3, 3))
    assert_tree_close(got, want)
    assert isinstance(got[1], tuple) and isinstance(got[1][0], list) and isinstance(got[1][1], dict)


def test_int_carry():
    got, want = both(int_carry, randn(5, 2, 3))
    assert_tree_close(got, want)
    assert got[0].item() == 3 and got[2].item() is False


@pytest.mark.parametrize("shape", [(2, 3), (4, 5)], ids=["upstream_no_iteration", "one_iteration"])
def test_pytree_int_carry(shape):
    got, want = both(pytree_int_carry, randn(6, *shape))
    assert_tree_close(got, want)


def test_const_and_symint_output():
    t = randn(7, 2, 3) * 4  # its sum, truncated to an integer, is a carry
    got, want = both(const_and_symint_output, t)
    assert_tree_close(got, want)
    # Two iterations: (a, b, c1, c2, c3) = (2, 3, 1, 1, 1) -> (3, 1, 1, 1, 2) -> (1, 1, 1, 2, 3).
    assert [v.item() for v in got[0][:5]] == [2, 2, 2, 3, 4]


def detached(tree):
    return tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, tree)


def flat_leaves(tree):
    if isinstance(tree, (tuple, list)):
        return [leaf for v in tree for leaf in flat_leaves(v)]
    if isinstance(tree, dict):
        return [leaf for k in tree for leaf in flat_leaves(tree[k])]
    return [tree]


@pytest.mark.parametrize("program, shape", [(int_carry, (2, 3)), (int_carry, (5, 2, 3)),
                                            (pytree_int_carry, (2, 3)), (pytree_int_carry, (4, 5)),
                                            (const_and_symint_output, (2, 3))],
                         ids=["int_carry", "int_carry_5_rows", "pytree_int_carry", "pytree_int_carry_one_iteration",
                              "const_and_symint_output"])
def test_gradients_match_torch_autograd(program, shape):
    # Upstream's inputs of shape (2, 3), requiring grad; and the shapes the value tests use too.
    a = randn(11, *shape) * 4
    x, tx = lr.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    got, want = program(LAZY, x), program(EAGER, tx)
    assert_tree_close(got, detached(want))
    rng = np.random.default_rng(12)
    loss, tloss = 0, 0
    for k, (g, w) in enumerate(zip(flat_leaves(got), flat_leaves(want))):
        w_grad = isinstance(w, torch.Tensor) and w.requires_grad
        assert g.requires_grad == w_grad, f"output {k}: requires_grad {g.requires_grad}, torch's {w_grad}"
        if w_grad:
            weights = rng.uniform(-1, 1, tuple(w.shape)).astype(np.float32)
            loss = loss + (g * lr.tensor(weights)).sum()
            tloss = tloss + (w * torch.tensor(weights)).sum()
    assert isinstance(tloss, torch.Tensor), "no output requires grad"
    loss.backward()
    tloss.backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=RTOL, atol=ATOL)


def test_op_mismatch_in_meta():
    def body_fn(c, a, b):
        return c - 1, a.reshape(6), b.reshape(6)

    with pytest.raises(lr.Error, match=r"carry\[1\]"):
        lr.while_loop(lambda c, a, b: c > 0, body_fn, (lr.tensor(0), lr.tensor(randn(8, 2, 3)),
                                                       lr.tensor(randn(9, 2, 3))))
