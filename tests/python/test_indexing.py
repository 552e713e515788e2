"""Python's indexing (t[key], t[key] = value) and the indexing ops (index_put, index_copy,
index_fill and the in-place forms) against PyTorch: one table of keys, each checked for values
(several dtypes), float64 gradients through torch.autograd, and errors where torch raises.

A key is written once for both sides: ints, slices, None, Ellipsis, lists and NumPy arrays
are shared; T(...) is an i64 index tensor and M(...) a bool mask tensor on each side."""

import numpy as np
import pytest
import torch

import lazyrt as lr
from conftest import TORCH_DTYPE, assert_same, random_array

E = Ellipsis
S = slice


class T:
    """An index tensor (int64 unless dtype is given) of these values, on each side."""

    def __init__(self, values, dtype=np.int64):
        self.a = np.array(values, dtype=dtype)

    def lr(self):
        return lr.tensor(self.a)

    def torch(self):
        return torch.from_numpy(self.a.copy())

    def __repr__(self):
        return f"T({self.a.tolist()})"


class M(T):
    """A bool mask tensor."""

    def __init__(self, values):
        super().__init__(values, dtype=np.bool_)

    def __repr__(self):
        return f"M({self.a.tolist()})"


def side(key, which):
    if isinstance(key, tuple):
        return tuple(side(k, which) for k in key)
    if isinstance(key, T):
        return key.lr() if which == "lr" else key.torch()
    return key


# ---- getitem: (shape, key) ----------------------------------------------------------------------
GET = [
    # ints, negative ints
    ((5,), 0), ((5,), -1), ((4, 3), 2), ((4, 3), -4), ((2, 3, 4), (1, -2)), ((2, 3, 4), (0, 1, 2)),
    ((2, 3, 4), (-1, -1, -1)),
    # slices: steps, negative bounds, clamped bounds, empty slices
    ((6,), S(1, 5)), ((6,), S(None, None, 2)), ((7,), S(1, None, 3)), ((6,), S(-4, -1)), ((6,), S(-100, 100)),
    ((6,), S(4, 2)), ((6,), S(6, None)), ((4, 5), (S(None), S(1, 3))), ((4, 5), (S(1, None, 2), S(None, None, 3))),
    ((4, 5), (S(2, 2), 1)), ((0, 3), S(None)), ((3, 4, 5), (S(None), 2, S(1, 4, 2))),
    # None and Ellipsis
    ((3, 4), None), ((3, 4), (None, None)), ((3, 4), (S(None), None)), ((3, 4), (E, None)), ((2, 3, 4), (E, 0)),
    ((2, 3, 4), (0, E)), ((2, 3, 4), (E, 1, S(None))), ((2, 3, 4), (None, E, None, 0)), ((2, 3, 4), E),
    ((2, 3, 4), (1, E, 2, 3)),
    # 0-dim tensors
    ((), None), ((), E), ((), (None, E, None)), ((), True), ((), False),
    # bools
    ((3, 4), True), ((3, 4), False), ((3, 4), (S(None), True)), ((2, 3, 4), (True, [0, 1])),
    ((2, 3, 4), (S(None), True, [0, 1])),
    # integer tensors and lists, negative entries, repeats, multi-dim indices
    ((5, 3), [0, 2]), ((5, 3), [4, -1, 0, 0]), ((5, 3), T([3, -5])), ((5, 3), T([[0, 1], [4, 4]])),
    ((5, 3), (S(None), [2, 0, 2])), ((5, 3), (S(None), T([[1], [-1]]))), ((5, 3), []), ((5, 3), T([], )),
    ((4, 3), np.array([1, 3])), ((4, 3), np.array([1, 3], dtype=np.int32)), ((4, 3), np.array([[0, 1], [2, 0]])), ((4, 3), np.array([[0, 1]])),
    ((5, 3), T(2)), ((5, 3), (S(None), T(-1))), ((2, 3, 4), (T(0), S(None), [0, 1])), ((5, 3), np.int64(3)),
    # several advanced indices: broadcast together, adjacent (stay in place) or separated (go first)
    ((3, 4), ([0, 2], [1, 3])), ((3, 4), ([[0], [2]], [1, 3, 0])), ((2, 3, 4), (S(None), [0, 2], [1, 3])),
    ((2, 3, 4), ([0, 1], S(None), [1, 3])), ((2, 3, 4), ([1], S(None), [[0], [3], [2]])),
    ((2, 3, 4, 5), (S(None), [0, 2], S(None), [1, 4])), ((2, 3, 4, 5), (S(None), [0, 2], [1, 3], S(None))),
    ((2, 3, 4), ([0, 1], 0, [1, 2])), ((2, 3, 4), (None, [0, 1], None, [1, 2])), ((2, 3, 4), ([0, 1], None)),
    ((2, 3, 4), (E, [0, 1], None)), ((3, 4, 5), (S(1, None), [0, 3], S(None, None, 2))),
    ((2, 3, 4), (T([[0, 1]]), S(None), M([True, False, True, False]))),
    # lists standing for tuples (PyTorch keeps NumPy's old rule)
    ((2, 3, 4), [0, [0, 1]]), ((2, 3, 4), [[0, 1]]), ((2, 3, 4), [0, None]), ((2, 3, 4), [0, S(None)]),
    # masks: lists, arrays and tensors of bools, 0-dim bools, masks over several dims, with other indices
    ((3, 4), [True, False, True]), ((3, 4), (S(None), [False, True, True, False])),
    ((3, 4), np.array([True, False, True])), ((3, 4), M([True, False, True])),
    ((3, 4), M([[True, False, False, True], [False] * 4, [True] * 4])), ((3, 4), M(True)), ((3, 4), M(False)),
    ((2, 3, 4), (S(None), M([[True, False, True, False]] * 3))), ((2, 3, 4), ([0, 1], M([True, False, True]))),
    ((3, 4), M([False, False, False])), ((2, 3, 4), (M([True, True]), S(None), [0, 3])),
    ((0, 4), M(np.zeros((0,), dtype=bool))),
    # a NumPy array is an index tensor whatever its rank (a 2-d bool array is a 2-d mask), and
    # int32 index tensors index as int64 ones (both torch 2.x; 1.13 refused them)
    ((3, 4), np.array([[True, False, False, True]] * 3)), ((3, 4), np.array(1)), ((3, 4), np.array(True)),
    ((3, 4), np.array([2, 0, 1], dtype=np.uint8)),  # a uint8 tensor: a (deprecated) mask
    ((3, 4), T([0, 2], dtype=np.int32)), ((3, 4), T([[0], [2]], dtype=np.int32)),
    ((3, 4), (T([0, 2], dtype=np.int32), T([1, -1]))), ((2, 3, 4), (S(None), T(1, dtype=np.int32), [0, 3])),
]

# ---- getitem errors: torch raises, lazyrt must raise lazyrt.Error ---------------------------------
GET_ERRORS = [
    ((3,), 3), ((3,), -4), ((2, 3), (0, 5)), ((2, 3), (0, 0, 0)), ((), 0), ((3, 4), S(None, None, -1)),
    ((3, 4), S(None, None, 0)), ((3, 4), T([0.5], dtype=np.float32)), ((3, 4), {0}),
    ((3, 4), ([0, 1], [0, 1, 2])), ((3, 4), M([True, False])), ((3, 4), M([[True] * 3] * 3)),
    ((3, 4), T([0, 1], dtype=np.float64)), ((2, 3, 4), (E, E, 0)), ((), [0]), ((3, 4), 1.0),
    ((3, 4), np.array([[True, False, False]] * 3)),  # a 2-d mask of the wrong shape
]

# What torch accepts and lazyrt refuses, on purpose: a list of floats (torch truncates
# them to ints, a deprecated rule) and several ellipses (torch's result is not NumPy's).
REFUSED = [((3, 4), [0.5]), ((3, 4), [1.0, 2.0]), ((2, 3, 4), (E, 0, E))]

# Index values out of range are known only when the graph runs, as for index_select.
GET_RUNTIME_ERRORS = [((3, 4), T([3])), ((3, 4), T([-4])), ((3, 4), (T([0, 1]), T([0, 4]))), ((3, 4), T(3)),
                      ((3, 4), (S(None), T([[4]])))]


def key_id(v):
    return repr(v).replace(" ", "")


@pytest.mark.parametrize("shape,key", GET, ids=key_id)
def test_getitem_matches_torch(shape, key):
    rng = np.random.default_rng(0)
    for dtype in (lr.float32, lr.int64, lr.bool):
        a = random_array(rng, shape, dtype)
        x, t = lr.tensor(a), torch.from_numpy(np.array(a))
        assert_same(x[side(key, "lr")], t[side(key, "torch")], what=f"{shape}[{key!r}] {dtype}")


@pytest.mark.parametrize("shape,key", GET, ids=key_id)
def test_getitem_gradient_matches_torch_autograd(shape, key):
    rng = np.random.default_rng(1)
    a = random_array(rng, shape, lr.float64)
    x = lr.tensor(a, requires_grad=True)
    t = torch.from_numpy(a.copy()).requires_grad_()
    expect = t[side(key, "torch")]
    got = x[side(key, "lr")]
    w = random_array(rng, tuple(expect.shape), lr.float64)
    (got * lr.tensor(w)).sum().backward()
    (expect * torch.from_numpy(w)).sum().backward()
    assert_same(x.grad, t.grad, what=f"grad of {shape}[{key!r}]")


@pytest.mark.parametrize("shape,key", GET_ERRORS, ids=key_id)
def test_getitem_refuses_what_torch_refuses(shape, key):
    t = torch.zeros(shape)
    with pytest.raises((IndexError, RuntimeError, ValueError, TypeError)):
        t[side(key, "torch")]
    with pytest.raises(lr.Error):
        lr.zeros(*shape)[side(key, "lr")]


@pytest.mark.parametrize("shape,key", REFUSED, ids=key_id)
def test_getitem_refuses_what_lazyrt_does_not_take(shape, key):
    torch.zeros(shape)[side(key, "torch")]
    with pytest.raises(lr.Error):
        lr.zeros(*shape)[side(key, "lr")]


@pytest.mark.parametrize("shape,key", GET_RUNTIME_ERRORS, ids=key_id)
def test_getitem_index_out_of_range_fails_when_the_graph_runs(shape, key):
    with pytest.raises(IndexError):
        torch.zeros(shape)[side(key, "torch")]
    with pytest.raises(lr.Error, match="out of bounds"):
        lr.zeros(*shape)[side(key, "lr")].numpy()


# ---- setitem: (shape, key, value); a value V(shape) is a tensor of the tensor's dtype ------------
class V:
    def __init__(self, shape, dtype=None):
        self.shape, self.dtype = shape, dtype


SET = [
    ((5,), 0, 2.5), ((5,), -1, V(())), ((4, 3), 1, V((3,))), ((4, 3), 1, V((1, 3))), ((4, 3), 1, V((1, 1, 3))),
    ((4, 3), (S(None), 2), V((4,))), ((4, 3), (S(1, None, 2), S(None, None, 2)), V((2, 1))), ((4, 3), S(2, 2), 7),
    ((4, 3), E, V((3,))), ((4, 3), None, V((1, 4, 3))), ((4, 3), (E, None), 1), ((4, 3), True, V((3,))),
    ((4, 3), False, 5), ((2, 3, 4), (0, E, 1), V((3,))), ((2, 3, 4), (None, 1, None, S(1, 3)), V((2, 4))),
    ((), E, 3), ((), None, V((1,))),
    ((5, 3), [0, 2], V((2, 3))), ((5, 3), [4, -1, 1], V((3,))), ((5, 3), T([[0, 1], [3, -2]]), 1.5),
    ((5, 3), (S(None), [2, 0]), V((5, 1))), ((3, 4), ([0, 2], [1, 3]), V((2,))), ((3, 4), ([[0], [2]], [1, 3]), V((2, 2))),
    ((2, 3, 4), ([0, 1], S(None), [1, 3]), V((2, 3))), ((2, 3, 4), (S(None), [0, 2], [1, 3]), V((2,))),
    ((5, 3), [1, 1, 1], V((3, 3))),  # repeated indices: the last write wins
    ((5, 3), T(2), V((3,))), ((2, 3, 4), (T(1), S(None), [0, 3]), V((3, 2))), ((3, 4), (True, [0, 2]), V((2, 4))),
    # masks: the same value wherever true (a where), or one value per true (reads the mask)
    ((3, 4), M([[True, False, False, True]] * 3), 0), ((3, 4), M([True, False, True]), V((4,))),
    ((3, 4), M([True, False, True]), V((2, 1))), ((3, 4), M([True, False, True]), V((2, 4))),
    ((3, 4), (S(None), M([True, False, True, False])), V((3, 1))), ((3, 4), [True, False, True], 1),
    ((3, 4), M([[True, False, False, True], [False] * 4, [True] * 4]), V((6,))), ((3, 4), M(True), V((4,))),
    ((3, 4), (1, M([False, True, True, False])), V(())), ((2, 3, 4), (S(None), 1, M([True, False, True, True])), -1),
    # dtypes: numbers and basic indices cast; a one-element value with a lone mask too
    ((3, 4), 0, V((4,), lr.float64)), ((3, 4), (S(None), 1), V((), lr.int64)), ((3, 4), [1], 2),
    ((3, 4), M([True, False, True]), V((), lr.float64)),
]

SET_ERRORS = [
    ((3, 4), 3, 1.0), ((3, 4), 0, V((3,))), ((3, 4), 0, V((2, 4))), ((3, 4), [0, 1], V((3, 4))),
    ((3, 4), [0], V((4,), lr.float64)), ((3, 4), ([0, 1], [0, 1]), V((2,), lr.int64)),
    ((3, 4), M(True), V((), lr.float64)), ((3, 4), M([True, False, True]), V((3, 4))),
    ((3, 4), (0, 0, 0), 1.0), ((3, 4), S(None, None, -1), 1.0),
]


def value_pair(value, dtype, rng, requires_grad=False):
    if not isinstance(value, V):
        return value, value
    vd = value.dtype or dtype
    a = random_array(rng, value.shape, vd)
    v, t = lr.tensor(a), torch.from_numpy(np.array(a))
    if requires_grad:
        v.requires_grad_()
        t.requires_grad_()
    return v, t


@pytest.mark.parametrize("shape,key,value", SET, ids=key_id)
def test_setitem_matches_torch(shape, key, value):
    rng = np.random.default_rng(2)
    for dtype in (lr.float32, lr.int64):
        a = random_array(rng, shape, dtype)
        x, t = lr.tensor(a), torch.from_numpy(np.array(a))
        v, tv = value_pair(value, dtype, rng)
        t[side(key, "torch")] = tv
        x[side(key, "lr")] = v
        assert_same(x, t, what=f"{shape}[{key!r}] = {value!r} in {dtype}")


@pytest.mark.parametrize("shape,key,value", [c for c in SET if isinstance(c[2], V) and c[2].dtype is None],
                         ids=key_id)
def test_setitem_gradient_matches_torch_autograd(shape, key, value):
    rng = np.random.default_rng(3)
    a = random_array(rng, shape, lr.float64)
    x = lr.tensor(a, requires_grad=True)
    t = torch.from_numpy(a.copy()).requires_grad_()
    v, tv = value_pair(value, lr.float64, rng, requires_grad=True)
    bx, bt = x * 1.0, t * 1.0
    bx[side(key, "lr")] = v
    bt[side(key, "torch")] = tv
    w = random_array(rng, shape, lr.float64)
    (bx * lr.tensor(w)).sum().backward()
    (bt * torch.from_numpy(w)).sum().backward()
    assert_same(bx, bt, what="value")
    assert_same(x.grad, t.grad, what=f"grad of the tensor in {shape}[{key!r}] = {value!r}")
    assert_same(v.grad, tv.grad, what=f"grad of the value in {shape}[{key!r}] = {value!r}")


@pytest.mark.parametrize("shape,key,value", SET_ERRORS, ids=key_id)
def test_setitem_refuses_what_torch_refuses(shape, key, value):
    rng = np.random.default_rng(4)
    v, tv = value_pair(value, lr.float32, rng)
    t = torch.zeros(shape)
    with pytest.raises((IndexError, RuntimeError, ValueError)):
        t[side(key, "torch")] = tv
    x = lr.zeros(*shape)
    before = x
    with pytest.raises(lr.Error):
        x[side(key, "lr")] = v
    np.testing.assert_array_equal(x.numpy(), np.zeros(shape, np.float32))  # left as it was
    assert x is before


def test_setitem_on_a_leaf_that_requires_grad_is_refused_as_in_torch():
    t = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError):
        t[0] = 2.0
    x = lr.ones(3, requires_grad=True)
    with pytest.raises(lr.Error, match="leaf"):
        x[0] = 2.0
    with lr.no_grad():
        x[0] = 2.0
    np.testing.assert_array_equal(x.numpy(), [2.0, 1.0, 1.0])


def test_setitem_keeps_the_identity_and_the_graph_static():
    x = lr.zeros(4, 3)
    y = x
    before = lr.metrics.counter("DynamicShapeSync")
    x[x.sum(1) >= 0] = 1.0        # a lone mask, one value: a where, no read
    x[1:3, ::2] = lr.tensor([[7.0, 8.0]])
    assert y is x and x.is_pending()
    assert lr.metrics.counter("DynamicShapeSync") == before
    np.testing.assert_array_equal(x.numpy(), [[1, 1, 1], [7, 1, 8], [7, 1, 8], [1, 1, 1]])


def test_a_pending_mask_whose_count_sets_a_shape_syncs_once_and_is_counted():
    a = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], dtype=np.float32)
    x = lr.tensor(a) * 1.0  # pending
    before = lr.metrics.counter("DynamicShapeSync")
    got = x[x > 0]
    assert lr.metrics.counter("DynamicShapeSync") == before + 1
    np.testing.assert_array_equal(got.numpy(), a[a > 0])
    # a device-data mask (or a list / NumPy array of bools) is read without a sync: not counted
    m = lr.tensor(a > 0)
    x[m] = lr.tensor([10.0, 20.0, 30.0])
    assert lr.metrics.counter("DynamicShapeSync") == before + 1
    np.testing.assert_array_equal(x.numpy(), [[10, -2, 20], [-4, 30, -6]])


def test_a_data_dependent_mask_inside_a_compiled_step_is_refused():
    x = lr.tensor([1.0, -1.0, 2.0])
    lr.mark_step()

    def step(x):
        return [x[x > 0].sum()]

    with pytest.raises(lr.Error, match="compile_step"):
        lr.compile_step(step, (x,))


def test_iteration_and_index_dunders():
    x = lr.tensor([[1, 2], [3, 4]])
    rows = [r.tolist() for r in x]
    assert rows == [[1, 2], [3, 4]]
    with pytest.raises(TypeError):
        iter(lr.tensor(1.0))
    assert x[1, 0].item() == 3


# ---- the indexing ops: index_put, index_copy, index_fill, and the in-place forms -----------------
OPS = [
    ("index_put", (3, 4), lambda m, x, v, i: m.index_put(x, (i([0, 2]),), v((2, 4)))),
    ("index_put", (3, 4), lambda m, x, v, i: m.index_put(x, (i([0, 2, 0]), i([1, 3, 1])), v((3,)), accumulate=True)),
    ("index_put", (3, 4), lambda m, x, v, i: m.index_put(x, (i([2]), i([-1, 0])), v((2,)))),
    ("index_put", (3, 4), lambda m, x, v, i: m.index_put(x, (i(1), i([0, 1])), v(()))),
    ("index_put", (2, 3, 4), lambda m, x, v, i: m.index_put(x, (i([[1], [0]]), i([0]), i([0, 3, 2])), v((2, 3)),
                                                            accumulate=True)),
    ("index_copy", (4, 3), lambda m, x, v, i: m.index_copy(x, 0, i([3, 0]), v((2, 3)))),
    ("index_copy", (4, 3), lambda m, x, v, i: m.index_copy(x, -1, i([2, 0, 1]), v((4, 3)))),
    ("index_copy", (), lambda m, x, v, i: m.index_copy(x, 0, i([0]), v(()))),
    ("index_fill", (4, 3), lambda m, x, v, i: m.index_fill(x, 1, i([-1, 0]), 2.5)),
    ("index_fill", (4, 3), lambda m, x, v, i: m.index_fill(x, 0, i([1, 1, 3]), v(()))),
    ("index_fill", (2, 3, 4), lambda m, x, v, i: m.index_fill(x, -2, i(2), -1)),
]


@pytest.mark.parametrize("name,shape,fn", OPS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(OPS)])
def test_indexing_ops_match_torch(name, shape, fn):
    for dtype in (lr.float32, lr.float64):
        for grad in (False, True):
            rng = np.random.default_rng(5)
            a = random_array(rng, shape, dtype)
            x, t = lr.tensor(a, requires_grad=grad), torch.from_numpy(a.copy()).requires_grad_(grad)
            values = {}

            def lv(s):
                arr = random_array(rng, s, dtype)
                values[s] = (lr.tensor(arr, requires_grad=grad), torch.from_numpy(arr).requires_grad_(grad))
                return values[s][0]

            def tv(s):
                return values[s][1]

            got = fn(lr, x, lv, lambda v: lr.tensor(np.array(v, dtype=np.int64)))
            expect = fn(torch, t, tv, lambda v: torch.tensor(v, dtype=torch.int64))
            assert_same(got, expect, what=f"{name} {dtype}")
            if grad:
                w = random_array(rng, tuple(expect.shape), dtype)
                (got * lr.tensor(w)).sum().backward()
                (expect * torch.from_numpy(w)).sum().backward()
                assert_same(x.grad, t.grad, what=f"{name} grad of input")
                for s, (vl, vt) in values.items():
                    assert_same(vl.grad, vt.grad, what=f"{name} grad of value {s}")


def test_index_put_takes_none_for_a_whole_dim():
    # torch.index_put takes no None in 1.13; its setitem form is the reference
    rng = np.random.default_rng(7)
    a, v = random_array(rng, (3, 4, 2), lr.float32), random_array(rng, (3, 2, 2), lr.float32)
    t = torch.from_numpy(a.copy())
    t[:, [-1, 0]] = torch.from_numpy(v)
    got = lr.index_put(lr.tensor(a), (None, lr.tensor([-1, 0])), lr.tensor(v))
    assert_same(got, t)
    w = random_array(rng, (3, 2), lr.float32)
    got = got.index_put((None, lr.tensor([1, 1]), lr.tensor(0)), lr.tensor(w), accumulate=True)
    t.index_put_((torch.arange(3)[:, None], torch.tensor([1, 1]), torch.tensor(0)), torch.from_numpy(w),
                 accumulate=True)  # repeated indices add up
    assert_same(got, t)


def test_in_place_forms_match_torch():
    rng = np.random.default_rng(6)
    a = random_array(rng, (4, 3), lr.float32)
    src = random_array(rng, (2, 3), lr.float32)
    idx = np.array([3, 1])
    mask = a > 0
    cases = [
        ("index_put_", lambda t, m: t.index_put_((m.tensor(idx),), m.tensor(src), accumulate=True)),
        ("index_copy_", lambda t, m: t.index_copy_(0, m.tensor(idx), m.tensor(src))),
        ("index_fill_", lambda t, m: t.index_fill_(1, m.tensor([0, 2]), -3.0)),
        ("masked_fill_", lambda t, m: t.masked_fill_(m.tensor(mask), 0.5)),
        ("scatter_", lambda t, m: t.scatter_(0, m.tensor([[1, 0, 3]]), m.tensor(src))),
        ("scatter_", lambda t, m: t.scatter_(1, m.tensor([[2], [0]]), 9.0)),
        ("scatter_add_", lambda t, m: t.scatter_add_(0, m.tensor([[1, 1, 3], [1, 0, 0]]), m.tensor(src))),
    ]
    for name, f in cases:
        x, t = lr.tensor(a), torch.from_numpy(a.copy())
        r = f(x, lr)
        f(t, torch)
        assert r is x, f"{name} returns the tensor itself"
        assert_same(x, t, what=name)


def test_index_ops_refuse_what_torch_refuses():
    x, t = lr.zeros(3, 4), torch.zeros(3, 4)
    cases = [
        lambda m, z: m.index_copy(z, 1, m.tensor([0, 1]), m.ones(3, 2, dtype=m.float64)),
        lambda m, z: m.index_fill(z, 1, m.tensor([0], dtype=m.int32), 1.0),
        lambda m, z: m.index_fill(z, 1, m.tensor([0]), m.ones(1)),
        lambda m, z: m.index_put(z, (m.tensor([0]),), m.ones(4, dtype=m.float64)),
        lambda m, z: m.index_copy(z, 1, m.tensor([[0]]), m.ones(3, 1)),
    ]
    for i, f in enumerate(cases):
        with pytest.raises((RuntimeError, IndexError)):
            f(torch, t)
        with pytest.raises(lr.Error):
            f(lr, x).numpy()


def test_int32_indices_put_gather_and_scatter_as_in_torch():
    # torch 2.x takes int32 indices in index_put, t[i] = v, gather and scatter (1.13 wanted int64).
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    i32 = np.array([2, 0], dtype=np.int32)
    pos = np.array([[1, 0, 2, 2]], dtype=np.int32)
    cases = [
        lambda m, z: m.index_put(z, (m.tensor(i32),), m.ones(4)),
        lambda m, z: m.index_put(z, (m.tensor(i32), m.tensor(i32)), m.tensor([5.0, 6.0]), accumulate=True),
        lambda m, z: m.gather(z, 0, m.tensor(pos)),
        lambda m, z: m.scatter(z, 0, m.tensor(pos), -1.0),
        lambda m, z: m.scatter_add(z, 0, m.tensor(pos), m.ones(1, 4)),
    ]
    for i, f in enumerate(cases):
        x, t = lr.tensor(a), torch.from_numpy(a.copy())
        assert_same(f(lr, x), f(torch, t), what=f"case {i}")
    x, t = lr.tensor(a), torch.from_numpy(a.copy())
    x[lr.tensor(i32)] = 9.0
    t[torch.from_numpy(i32)] = 9.0
    assert_same(x, t)


def test_uint8_arrays_are_masks_with_torchs_warning():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    key = np.array([1, 0, 3], dtype=np.uint8)
    with pytest.warns(UserWarning, match="uint8"):
        expect = torch.from_numpy(a)[key]
    with pytest.warns(UserWarning, match="uint8"):
        got = lr.tensor(a)[key]
    assert_same(got, expect)

