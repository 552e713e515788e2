"""Cases of PyTorch/XLA's test/scan/test_scan.py and test/scan/test_scan_layers.py (pytorch/xla),
written for lazyrt.

Upstream checks torch_xla's scan against `_loopy_scan`, a Python loop that calls fn on each row
and stacks the ys, and scan_layers against applying the layers one after another; both the
values and the gradients. Here each scan body is written once, over a namespace of ops, and run
twice: through lazyrt.scan (or lazyrt.scan_layers) on lazyrt tensors, and as that Python loop
in PyTorch eager on the same values. PyTorch's results and autograd gradients are
the expected values (except for random numbers drawn in fn, test_scan_rand_in_fn: see below).
Layers are lazyrt.nn modules whose weights are copied into the equivalent torch.nn modules.
lazyrt's lr.tensor(a, requires_grad=True), .requires_grad, .backward(), .grad and lr.no_grad()
follow torch's.

Gradients: as upstream's run_test, run_both sums every output, runs backward, and compares the
gradients of init and xs with torch's; it also checks that each output requires grad as torch's
does. test_linear_layers, test_tuple_layers and test_decoder_model run backward through
scan_layers and compare the gradient of every layer parameter (and of the input, or of the
embedding, norm and output layers for the decoder) with torch's. Where torch gives a leaf no
gradient (it does not reach the loss: the carry fn returns unchanged in
test_scan_activation_aliases_input, each TupleModule's w when only the first output is summed),
lazyrt may give an all-zero one: a scan is one autograd node, so every input that requires grad
gets a gradient. Tolerances are rtol 1e-5, atol 1e-6 for float32 unless a case says why not.

Differences from upstream, where lazyrt's model needs them:
- test_scan_fn_not_callable and test_scan_incompatible_length: upstream wants ValueError.
  lazyrt reports its own errors as lazyrt.Error (a RuntimeError) and lets Python's errors from
  calling fn pass through, so these accept TypeError or ValueError for a fn that is not
  callable and lazyrt.Error or ValueError for xs of different lengths. The same goes for
  test_heterogenous_layers and test_mismatched_shapes, which check that the offending layer is
  named.
- test_scan_create_tensors_no_transfers_from_device and
  test_scan_tracing_does_not_allocate_device_memory check torch_xla's transfer metrics; lazyrt's
  equivalent is that calling scan on inputs that require grad runs nothing (no graph executes,
  the results stay pending) until a value is read, and neither does backward through it.
- test_scan_external_in_place_mutation: upstream wants an AssertionError about FakeTensor; lazyrt
  refuses a loop body that modifies a tensor from outside the loop with lazyrt.Error, and leaves
  that tensor unchanged.
- test_scan_gradness: upstream's three combinations of init / xs requiring grad, and the fourth
  (neither) too.
- test_scan_activation_aliases_input: upstream checks, with saved_tensors_hooks, that the
  autograd context saves the xs tensor itself when fn's activation is its input x. lazyrt has
  no saved-tensor hooks; its counterpart is that the backward scan in the gradient's graph takes
  xs itself (its graph parameter) as rows. The gradients are compared with torch's.
- test_scan_rand_in_fn: as upstream, the rows of ys drawn inside fn (lr.rand) differ. torch's
  generator is not lazyrt's, so here PyTorch is not the oracle: the reference is the same fn
  applied in an unrolled Python loop of lazyrt ops under the same lr.manual_seed, whose carry,
  ys and next draw after the loop lazyrt.scan must match exactly.
- test_scan_with_rematerialization: the gradients are compared (run_both); its partition_fn half
  is left out: lazyrt has no partition_fn, so neither the min-cut run nor the HLO sine counts
  have a counterpart. (lazyrt's backward always recomputes a row's intermediates from the carry
  saved for that row.)
- test_scan_different_dtypes: PyTorch's expected values and gradients for the float16 sines (and,
  alike, the bfloat16 ones) are computed in float32 and rounded to the dtype, at float16 /
  bfloat16 tolerances.
- test_scan_computation_cache: upstream counts fn's traces across 10 scans with is_fn_pure (no
  such flag here). The lazyrt counterpart: fn is traced once per scan call whatever the number
  of rows, and 10 scans of the same fn and shapes compile one graph.
- test_scan_input_in_place_mutation: upstream expects an autograd error ("in-place
  operation") when fn modifies its own carry argument in place, as PyTorch eager raises for the
  Python loop (an in-place op on a leaf that requires grad). In lazyrt an in-place op rebinds
  the tensor handle to a new value (docs/design.md, "Tensors and sync"), so inside fn it is a
  functional update of fn's own carry: init stays as it was, and the carry, ys and gradients
  are those of torch's functional equivalent (carry = carry + x), which is the oracle. Not
  upstream: fn modifying its row x in place leaves xs as it was.
- test_scan_computation_cache_by_fn_and_partition_fn and test_scan_layers_cache: their
  compile-count halves. Upstream counts entries of its trace caches; lazyrt's counterpart is
  the UncachedCompile counter: a scan of another fn (carry * x after carry + x) compiles a
  graph of its own, and scanning either again compiles nothing; scan_layers over 10 identical
  Linear(64, 64) layers, called three times (with the backward through it), compiles once.
  The values and gradients are compared with PyTorch's.
- test_tree_flatten_none tests torch_xla's helper for pytrees with None; lazyrt has no such
  public helper, so its tree ((a, b), (None, c), None) is used as fn's y: the ys keep the
  None positions.
- ValueAndGradPartitionedTest: lazyrt does not split fn into a forward and a backward function
  (value_and_grad_partitioned). Upstream's check of one step (the outputs, and the gradients
  for cotangents of ones, against closed forms for the linear layer and torch.autograd for the
  pytree body) is a scan over a single row with backward from the sum of its outputs; a scan
  over several rows is checked too.
- "while(" in the HLO (assert_while_found_in_hlo): lazyrt's counterpart is that the graph of
  scan_layers' output (lazyrt.debug.graph_text) holds one scan node, of length n, whose body
  is the same for 3 layers and for 10, and that each parameter's gradient is computed by a
  backward scan (reverse=true) of length n, whose body is the same for 3 and 10 layers too.
- test_linear_layers also runs with an input that requires grad (upstream's does not), and
  test_tuple_layers's input is computed from a tensor that requires grad, whose gradient is
  compared too.
- test_decoder_model: the example decoder (RMSNorm, grouped-query attention, SiLU MLP) is
  written with lazyrt.nn modules; einsum is written as matmul.
- Not upstream: test_scan_reverse (lazyrt.scan takes reverse=True, as PyTorch's and JAX's scan
  do), test_scan_gradness_integer_carry (an integer carry next to a float one that requires
  grad does not require grad), test_scan_captured_tensor_gradients (tensors fn reads from
  outside get gradients), test_scan_detach_in_fn and test_scan_no_grad_in_fn (detach() and
  no_grad inside fn keep values out of the gradient).
- Which outputs require grad: lazyrt, as torch_xla's scan (an autograd.Function), marks every
  float output of a scan as requiring grad when any float input does, where the eager loop
  marks only those that depend on one. No upstream case has an output that does not, so
  run_both compares with the eager loop.

Left out, and why:
- The partition_fn half of test_scan_with_rematerialization (min-cut rematerialization and HLO
  sine counts), and the value_and_grad_partitioned split itself: lazyrt has no partition_fn
  or rematerialization control.
- The partition_fn halves of test_scan_computation_cache_by_fn_and_partition_fn and
  test_scan_layers_cache (a new cache entry per partition_fn), and
  test_scan_computation_cache_disabled_when_fn_is_not_pure, test_scan_layers_cache_non_pure
  and the is_fn_pure / is_layer_pure parametrizations: they inspect torch_xla's per-function
  trace cache and its purity flag; lazyrt has neither (it traces fn on every call and caches
  the compiled graph by its structure).
- assert_different_tensor in test_scan_layers.py (the scanned output and gradients are not the
  loop's objects): always true here, where the loop runs in another library.
- The other files of test/scan/ (test_scan_spmd.py, test_scan_pallas.py, test_scan_debug.py) are
  not part of this port: SPMD sharding, Pallas kernels and torch_xla's debug output, none of
  which lazyrt has.
"""

import math

import numpy as np
import pytest
import torch

import lazyrt as lr

TORCH_DTYPE = {lr.float32: torch.float32, lr.float64: torch.float64, lr.float16: torch.float16,
               lr.bfloat16: torch.bfloat16, lr.int32: torch.int32, lr.int64: torch.int64, lr.bool: torch.bool}
RTOL, ATOL = 1e-5, 1e-6


class Lib:
    """The names a scan body uses, for one of the two libraries."""

    def __init__(self, lazy):
        self.lazy = lazy
        self.T = lr if lazy else torch
        self.nn = lr.nn if lazy else torch.nn
        self.tensor = lr.tensor if lazy else torch.tensor
        self.silu = lr.silu if lazy else torch.nn.functional.silu


LAZY, EAGER = Lib(True), Lib(False)


# ---- pytrees (None is an empty tree, as in lazyrt and torch_xla) -----------------------------


def tree_leaves(tree):
    if tree is None:
        return []
    if isinstance(tree, (tuple, list)):
        return [leaf for v in tree for leaf in tree_leaves(v)]
    if isinstance(tree, dict):
        return [leaf for k in tree for leaf in tree_leaves(tree[k])]
    return [tree]


def tree_map(fn, *trees):
    first = trees[0]
    if first is None:
        assert all(t is None for t in trees)
        return None
    if isinstance(first, (tuple, list)):
        return type(first)(tree_map(fn, *kids) for kids in zip(*trees))
    if isinstance(first, dict):
        return {k: tree_map(fn, *(t[k] for t in trees)) for k in first}
    return fn(*trees)


def loopy_scan(fn, init, xs, reverse=False):
    """The oracle: upstream's `_loopy_scan` in PyTorch eager (fn over the rows of xs in a Python
    loop, ys stacked on a new dim 0; with reverse, rows last to first, ys in row order)."""
    n = len(tree_leaves(xs)[0])
    carry, ys = init, [None] * n
    for i in (reversed(range(n)) if reverse else range(n)):
        carry, ys[i] = fn(carry, tree_map(lambda x: x[i], xs))
    return carry, tree_map(lambda *ys: torch.stack(ys), *ys)


def to_lib(lib, tree, grad=False):
    """Arrays as tensors of `lib`; with grad, float arrays become leaves that require grad."""
    def make(a):
        if not isinstance(a, (np.ndarray, np.generic)):
            return a
        floating = np.issubdtype(np.asarray(a).dtype, np.floating)
        return lib.tensor(a, requires_grad=True) if grad and floating else lib.tensor(a)
    return tree_map(make, tree)


def assert_tree_close(got, want, rtol=RTOL, atol=ATOL, path="result"):
    """A lazyrt result (got) equals PyTorch's (want): structure, shapes, dtypes, values."""
    if want is None:
        assert got is None, f"{path}: {got!r} vs None"
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want), f"{path}: {type(got).__name__} vs {type(want).__name__}"
        assert len(got) == len(want), f"{path}: {len(got)} vs {len(want)} items"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_tree_close(g, w, rtol, atol, f"{path}[{i}]")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{path}: keys"
        for k in want:
            assert_tree_close(got[k], want[k], rtol, atol, f"{path}[{k!r}]")
    else:
        assert isinstance(got, lr.Tensor), f"{path}: {type(got).__name__}"
        assert tuple(got.shape) == tuple(want.shape), f"{path}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
        assert TORCH_DTYPE[got.dtype] == want.dtype, f"{path}: dtype {got.dtype} vs {want.dtype}"
        g = got.to(lr.float32).numpy() if got.dtype is lr.bfloat16 else got.numpy()
        w = want.detach().float().numpy() if want.dtype in (torch.bfloat16, torch.float16) else want.detach().numpy()
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=path)


def assert_grad_close(got, want, path, rtol=RTOL, atol=ATOL):
    """The .grad of a lazyrt leaf (got) against torch's (want). Where torch has none (the leaf
    does not reach the loss), lazyrt may have none or an all-zero one: a scan is one autograd
    node, so each input that requires grad gets a gradient, zero where it does not reach."""
    if want is None:
        assert got is None or not got.to(lr.float32).numpy().any(), f"{path}: a nonzero gradient, torch has none"
    else:
        assert got is not None, f"{path}: no gradient, torch has one"
        assert_tree_close(got, want, rtol, atol, path)


def run_both(make_fn, init, xs, reverse=False, grad=True, **tol):
    """Scans make_fn(lib) over the same values with lazyrt.scan and with the PyTorch loop and
    compares the results and which of them require grad; then, as upstream's run_test, runs
    backward from the sum of every float output and compares the gradients of init and xs.
    grad: whether the float leaves of init and xs require grad, or a pair (for init, for xs).
    Returns lazyrt's results."""
    init_grad, xs_grad = grad if isinstance(grad, tuple) else (grad, grad)
    l_init, l_xs = to_lib(LAZY, init, init_grad), to_lib(LAZY, xs, xs_grad)
    t_init, t_xs = to_lib(EAGER, init, init_grad), to_lib(EAGER, xs, xs_grad)
    got = lr.scan(make_fn(LAZY), l_init, l_xs, reverse=reverse)
    want = loopy_scan(make_fn(EAGER), t_init, t_xs, reverse=reverse)
    assert isinstance(got, tuple) and len(got) == 2
    assert_tree_close(got[0], want[0], path="carry", **tol)
    assert_tree_close(got[1], want[1], path="ys", **tol)
    outs = list(zip(tree_leaves(got), tree_leaves(want)))
    for k, (g, w) in enumerate(outs):
        assert g.requires_grad == w.requires_grad, \
            f"output {k}: requires_grad {g.requires_grad}, torch's {w.requires_grad}"
    outs = [(g, w) for g, w in outs if w.requires_grad]
    if outs:
        sum(g.sum() for g, _ in outs).backward()
        sum(w.sum() for _, w in outs).backward()
    for k, (g, w) in enumerate(zip(tree_leaves((l_init, l_xs)), tree_leaves((t_init, t_xs)))):
        assert g.requires_grad == w.requires_grad
        if w.requires_grad:
            assert_grad_close(g.grad, w.grad, f"gradient of input {k}", **tol)
        else:
            assert g.grad is None, f"input {k} does not require grad, but has a gradient"
    return got


def f32(values):
    return np.array(values, np.float32)


def randn(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


XS3 = f32([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])


# ---- test_scan.py: ScanTest --------------------------------------------------------------


def test_scan_simple():
    def make(lib):
        def step_fn(carry, x):
            new_carry = carry + x
            return new_carry, new_carry
        return step_fn

    carry, ys = run_both(make, f32([0.0, 0.0]), XS3)
    # As upstream also checks: scan over `+` is cumsum.
    np.testing.assert_allclose(carry.numpy(), torch.tensor(XS3).sum(0).numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ys.numpy(), torch.cumsum(torch.tensor(XS3), dim=0).numpy(), rtol=RTOL, atol=ATOL)


def test_scan_fn_not_callable():
    with pytest.raises((TypeError, ValueError)):
        lr.scan(1000, lr.tensor(f32([1.0, 1.0])), lr.tensor(XS3))


def test_scan_incompatible_length():
    xs_1 = lr.tensor(XS3)
    xs_2 = lr.tensor(f32([[1.0, 2.0], [3.0, 4.0]]))
    with pytest.raises((lr.Error, ValueError)):
        lr.scan(lambda a, b: (a, b), lr.tensor(f32([1.0, 1.0])), (xs_1, xs_2))


def test_scan_tuples():
    def make(lib):
        def fn(carry, x):
            carry1, carry2 = carry
            x1, x2 = x
            new_carry1 = carry1 + x1.sum()
            new_carry2 = carry2 + x2.sum()
            y1 = x1 * 2 + lib.T.sum(new_carry1)
            y2 = x2 * 2 + lib.T.sum(new_carry2)
            return (new_carry1, new_carry2), (y1, y2)
        return fn

    init = (f32([0.0]), f32([1.0, 2.0]))
    xs = (f32([[1.0, 2.0], [3.0, 4.0]]), f32([[5.0, 6.0, 7.0], [8.0, 9.0, 10.0]]))
    run_both(make, init, xs)


def fn_creating_tensors(lib):
    def fn(carry, x):
        a = lib.tensor([1.0, 2.0])
        b = lib.tensor([3.0, 4.0])
        return carry + a, x + b
    return fn


def test_scan_create_tensors():
    run_both(fn_creating_tensors, f32([0.0, 0.0]), XS3)


def fn_of_sines(lib):
    def fn(carry, x):
        return lib.T.sin(carry), lib.T.sin(x)
    return fn


def fn_returning_its_inputs(lib):
    def fn(carry, x):
        return carry, x
    return fn


@pytest.mark.parametrize("make", [fn_creating_tensors, fn_of_sines, fn_returning_its_inputs],
                         ids=["create_tensors_no_transfers", "tracing_sin", "tracing_aliases"])
def test_scan_runs_nothing_until_read(make):
    # test_scan_create_tensors_no_transfers_from_device and
    # test_scan_tracing_does_not_allocate_device_memory, in lazyrt's terms.
    # As upstream, init and xs require grad; backward (a scan too) runs nothing either.
    init, xs = lr.tensor(f32([0.0, 0.0]), requires_grad=True), lr.tensor(XS3, requires_grad=True)
    lr.sync([init, xs])
    executed = lr.metrics.counter("ExecuteGraph")
    carry, ys = lr.scan(make(LAZY), init, xs)
    assert lr.metrics.counter("ExecuteGraph") == executed, "calling scan ran a graph"
    assert carry.is_pending() and ys.is_pending()
    (carry.sum() + ys.sum()).backward()
    assert lr.metrics.counter("ExecuteGraph") == executed, "backward through scan ran a graph"
    assert init.grad.is_pending() and xs.grad.is_pending()
    t_init, t_xs = torch.tensor([0.0, 0.0], requires_grad=True), torch.tensor(XS3, requires_grad=True)
    want = loopy_scan(make(EAGER), t_init, t_xs)
    (want[0].sum() + want[1].sum()).backward()
    assert_tree_close((carry, ys), want)
    assert_tree_close((init.grad, xs.grad), (t_init.grad, t_xs.grad))


def test_scan_internal_in_place_mutation():
    def make(lib):
        def fn(carry, x):
            carry = carry.clone()
            carry.add_(x)
            y = x.clone()
            y.add_(42)
            return carry, y
        return fn

    run_both(make, f32([0.0, 0.0]), XS3)


def test_scan_input_output_aliases_carry():
    run_both(lambda lib: (lambda carry, x: (carry, x + 1)), f32([0.0, 0.0]), XS3)


def test_scan_input_output_aliases_x():
    run_both(lambda lib: (lambda carry, x: (carry + 1, x)), f32([0.0, 0.0]), XS3)


def test_scan_external_in_place_mutation():
    weird_global = lr.tensor(f32([0.0, 0.0]))

    def step_fn(carry, x):
        new_carry = carry + x
        weird_global.add_(1.0)
        return new_carry, new_carry + weird_global

    with pytest.raises(lr.Error, match="outside"):
        lr.scan(step_fn, lr.tensor(f32([0.0, 0.0])), lr.zeros(3, 2))
    assert weird_global.tolist() == [0.0, 0.0], "a scan that failed changed the outer tensor"


def test_scan_input_in_place_mutation():
    def step(lazy):
        def fn(carry, x):
            if lazy:
                carry.add_(x)  # rebinds fn's carry handle to carry + x
            else:
                carry = carry + x  # torch's functional equivalent
            y = x.clone()
            y.add_(42)
            return carry, y
        return fn

    # As upstream: PyTorch eager refuses the in-place update of a carry that requires grad.
    with pytest.raises(RuntimeError, match="in-place operation"):
        loopy_scan(lambda c, x: (c.add_(x), x), torch.tensor([0.0, 0.0], requires_grad=True), torch.tensor(XS3))

    init, xs = lr.tensor(f32([0.0, 0.0]), requires_grad=True), lr.tensor(XS3, requires_grad=True)
    carry, ys = lr.scan(step(True), init, xs)
    t_init, t_xs = torch.tensor([0.0, 0.0], requires_grad=True), torch.tensor(XS3, requires_grad=True)
    want = loopy_scan(step(False), t_init, t_xs)
    (carry.sum() + ys.sum()).backward()
    (want[0].sum() + want[1].sum()).backward()
    assert init.tolist() == [0.0, 0.0] and xs.tolist() == XS3.tolist(), "fn's in-place update reached its inputs"
    assert_tree_close((carry, ys), want)
    assert_grad_close(init.grad, t_init.grad, "init.grad")
    assert_grad_close(xs.grad, t_xs.grad, "xs.grad")

    # Not upstream: fn modifying its row in place, which is functional too.
    def scale_row(c, x):
        x.mul_(2.0)
        return c + x, x

    xs = lr.tensor(XS3)
    carry, ys = lr.scan(scale_row, lr.zeros(2), xs)
    assert xs.tolist() == XS3.tolist()
    want = loopy_scan(lambda c, x: (c + x * 2.0, x * 2.0), torch.zeros(2), torch.tensor(XS3))
    assert_tree_close((carry, ys), want)


XS_27 = f32([[2.0, 3.0], [4.0, 5.0], [6.0, 7.0]])


@pytest.mark.parametrize("init_grad, xs_grad", [(True, True), (True, False), (False, True), (False, False)])
def test_scan_gradness(init_grad, xs_grad):
    # Upstream's three combinations, and (False, False) too: nothing requires grad then. run_both
    # checks that each output requires grad as torch's does, and the gradients of those inputs
    # that require grad (the others must have none).
    def make(lib):
        def fn(carry, x):
            new_carry = carry * x
            return new_carry, new_carry + x
        return fn

    carry, ys = run_both(make, f32([1.0, 1.0]), XS_27, grad=(init_grad, xs_grad))
    assert carry.requires_grad == ys.requires_grad == (init_grad or xs_grad)


def test_scan_gradness_integer_carry():
    # Not upstream. A step counter carried next to a float carry that requires grad: the float
    # results require grad and get torch's gradients; the integer counter does not require grad
    # (in torch no integer tensor does, nor does an autograd.Function's integer output).
    def make(lib):
        def fn(carry, x):
            step, acc = carry
            return (step + 1, acc * x), step.to(lib.T.float32) * x
        return fn

    (step, acc), ys = run_both(make, (np.int64(0), f32([1.0, 1.0])), XS_27)
    assert step.dtype is lr.int64 and step.tolist() == 3
    assert not step.requires_grad and acc.requires_grad and ys.requires_grad


def test_scan_output_none():
    carry, ys = run_both(lambda lib: (lambda carry, x: (lib.T.cos(carry) + x, None)), f32([1.0, 1.0]), XS_27)
    assert ys is None


def test_scan_output_unit():
    carry, ys = run_both(lambda lib: (lambda carry, x: (lib.T.cos(carry) + x, ())), f32([1.0, 1.0]), XS_27)
    assert ys == ()


def test_scan_rand_in_fn():
    # Upstream: each of fn's iterations draws new numbers, so the rows of ys (zeros plus
    # lr.rand(2)) differ. torch's generator is not lazyrt's, so for random values the reference
    # is the same fn applied in an unrolled Python loop of lazyrt ops under the same
    # lr.manual_seed: lazyrt.scan must give exactly its numbers, and leave the generator where
    # that loop leaves it.
    def step_fn(carry, x):
        new_carry = carry + x
        return new_carry, new_carry + lr.rand(2)

    def run(scan):
        lr.manual_seed(1234)
        init, xs = lr.zeros(2), lr.zeros(3, 2)
        if scan:
            carry, ys = lr.scan(step_fn, init, xs)
        else:
            carry, rows = init, []
            for i in range(3):
                carry, y = step_fn(carry, xs[i])
                rows.append(y)
            ys = lr.stack(rows)
        return carry.numpy(), ys.numpy(), lr.rand(4).numpy()

    carry, ys, after = run(scan=True)
    assert ys.shape == (3, 2) and ys.dtype == np.float32
    # As upstream: values across the first dimension are not the same.
    assert ys[0][0] != ys[1][0] and ys[0][1] != ys[1][1]
    assert len(np.unique(ys)) == ys.size, ys  # no row repeats another's draw, nor any element
    assert ((ys >= 0) & (ys < 1)).all(), ys
    want_carry, want_ys, want_after = run(scan=False)
    np.testing.assert_array_equal(carry, want_carry)
    np.testing.assert_array_equal(ys, want_ys)
    np.testing.assert_array_equal(after, want_after)  # the generator continues as after the loop


def test_scan_activation_aliases_input():
    # Upstream checks, through saved_tensors_hooks, that when fn's activation is its own input
    # (y = sin(x) saves x), the autograd context keeps the xs tensor itself rather than a copy
    # of its rows. lazyrt has no saved-tensor hooks; its counterpart: in the graph of the
    # gradients, the backward scan takes xs itself (the graph parameter that holds it) as its
    # rows, not a forward output. And the gradients match torch's (only ys in the loss, as
    # upstream: the carry passes through fn unchanged, so torch gives init no gradient).
    init, xs = randn(20, 4, 4), randn(21, 20, 4, 4)
    l_init, l_xs = lr.tensor(init, requires_grad=True), lr.tensor(xs, requires_grad=True)
    lr.sync([l_init, l_xs])
    carry, ys = lr.scan(lambda carry, x: (carry, lr.sin(x)), l_init, l_xs)
    ys.sum().backward()

    lines = lr.debug.graph_text([l_xs.grad]).splitlines()
    top = [line for line in lines if line.startswith("%")]
    xs_params = [line.split(" = ")[0] for line in top if " = parameter " in line and line.endswith(": f32[20, 4, 4]")]
    assert len(xs_params) == 1, "\n".join(lines)
    backward = [line for line in top if " = scan(" in line and "reverse=true" in line]
    assert len(backward) == 1, "\n".join(lines)
    operands = backward[0].split(" = scan(")[1].split(")")[0].split(", ")
    assert xs_params[0] in operands, "\n".join(lines)

    t_init, t_xs = torch.tensor(init, requires_grad=True), torch.tensor(xs, requires_grad=True)
    t_carry, t_ys = loopy_scan(lambda carry, x: (carry, torch.sin(x)), t_init, t_xs)
    t_ys.sum().backward()
    assert_tree_close((carry, ys), (t_carry, t_ys))
    assert_grad_close(l_xs.grad, t_xs.grad, "xs.grad")
    assert_grad_close(l_init.grad, t_init.grad, "init.grad")


def test_scan_with_rematerialization():
    def make(lib):
        def fn(carry, x):
            for _ in range(10):
                carry = lib.T.sin(carry)
            for _ in range(10):
                x = lib.T.sin(x)
            return carry, x
        return fn

    # Upstream's gradient check without its partition_fn half (see the module docstring).
    run_both(make, randn(0, 4, 4), randn(1, 20, 4, 4))


def test_scan_different_dtypes():
    def fn(carry, x):
        bf16_value, f32_value = x
        return lr.sin(carry), (lr.sin(bf16_value), lr.sin(f32_value))

    # As upstream, init and both xs require grad.
    init = lr.tensor(np.zeros(2, np.float16), requires_grad=True)
    bf16_xs = lr.tensor(XS3).to(lr.bfloat16).detach().requires_grad_(True)
    f32_xs = lr.tensor(XS3, requires_grad=True)
    carry, (bf16_ys, f32_ys) = lr.scan(fn, init, (bf16_xs, f32_xs))
    assert carry.dtype is lr.float16 and bf16_ys.dtype is lr.bfloat16 and f32_ys.dtype is lr.float32
    (carry.sum() + bf16_ys.sum() + f32_ys.sum()).backward()

    # PyTorch: the loop in float32, rounded to each dtype;
    # autograd goes through those conversions, so its gradients come back in each leaf's dtype.
    def torch_fn(carry, x):
        bf16_value, f32_value = x
        return (torch.sin(carry.float()).half(),
                (torch.sin(bf16_value.float()).bfloat16(), torch.sin(f32_value)))

    t_init = torch.zeros(2, dtype=torch.float16, requires_grad=True)
    t_bf16 = torch.tensor(XS3).bfloat16().requires_grad_(True)
    t_f32 = torch.tensor(XS3, requires_grad=True)
    want = loopy_scan(torch_fn, t_init, (t_bf16, t_f32))
    (want[0].sum() + want[1][0].sum() + want[1][1].sum()).backward()
    assert_tree_close(carry, want[0], rtol=1e-3, atol=1e-3, path="carry")
    assert_tree_close(bf16_ys, want[1][0], rtol=1e-2, atol=1e-2, path="bf16 ys")
    assert_tree_close(f32_ys, want[1][1], path="f32 ys")
    assert_grad_close(init.grad, t_init.grad, "init.grad", rtol=1e-3, atol=1e-3)
    assert_grad_close(bf16_xs.grad, t_bf16.grad, "bf16 xs.grad", rtol=1e-2, atol=1e-2)
    assert_grad_close(f32_xs.grad, t_f32.grad, "f32 xs.grad")


def test_scan_computation_cache():
    calls = []

    def fn1(carry, x):
        calls.append(1)
        return carry + x, x

    xs = lr.tensor(XS3)
    lr.sync([xs])

    def run():
        carry, ys = lr.scan(fn1, lr.zeros(2), xs)
        lr.sync([carry, ys])
        return carry.numpy().copy(), ys.numpy().copy()

    results = [run()]
    assert len(calls) == 1, "fn traced once, not once per row"
    lr.metrics.reset()
    results += [run() for _ in range(10)]
    assert len(calls) == 11, "fn traced once per scan call"
    assert lr.metrics.counter("UncachedCompile") == 0, "the same scan compiled again"
    want = loopy_scan(lambda c, x: (c + x, x), torch.zeros(2), torch.tensor(XS3))
    for carry, ys in results:
        np.testing.assert_allclose(carry, want[0].numpy(), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(ys, want[1].numpy(), rtol=RTOL, atol=ATOL)


def test_scan_computation_cache_by_fn():
    # Upstream's fn half: two fns over the same init and xs (which require grad) each get a
    # cache entry of their own. Here: each compiles a graph of its own, and a scan of either
    # again compiles nothing. Each call differentiates through the scan as well.
    def fn1(carry, x):
        return carry + x, x

    def fn2(carry, x):
        return carry * x, x

    init = lr.tensor(f32([0.0, 0.0]))
    xs = lr.tensor(XS3, requires_grad=True)
    lr.sync([init, xs])

    def run(fn):
        carry, ys = lr.scan(fn, init, xs)
        (carry.sum() + ys.sum()).backward()
        grad, xs.grad = xs.grad, None
        lr.sync([carry, ys, grad])
        return carry, ys, grad

    def expected(fn):
        t_xs = torch.tensor(XS3, requires_grad=True)
        carry, ys = loopy_scan(fn, torch.tensor([0.0, 0.0]), t_xs)
        (carry.sum() + ys.sum()).backward()
        return carry, ys, t_xs.grad

    lr.cache.clear_memory()
    lr.metrics.reset()
    assert_tree_close(run(fn1), expected(fn1))
    assert lr.metrics.counter("UncachedCompile") == 1
    assert_tree_close(run(fn2), expected(fn2))
    assert lr.metrics.counter("UncachedCompile") == 2, "fn2 ran fn1's executable"
    for fn in (fn1, fn2, fn1):
        assert_tree_close(run(fn), expected(fn))
    assert lr.metrics.counter("UncachedCompile") == 2
    assert lr.metrics.counter("CachedCompile") == 3


def test_scan_reverse():
    def make(lib):
        def fn(carry, x):
            return carry * 0.5 + x, carry - x
        return fn

    run_both(make, f32([1.0, -1.0]), randn(2, 5, 2), reverse=True)


def test_scan_captured_tensor_gradients():
    # Not upstream (torch_xla's scan takes fn's outside tensors as constants): fn reads a weight
    # and a bias from outside the scan; they get gradients, summed over the rows.
    w_np, b_np, init, xs = randn(30, 3, 3), randn(31, 3), randn(32, 3), randn(33, 6, 3)

    def run(lib):
        w, b = lib.tensor(w_np, requires_grad=True), lib.tensor(b_np, requires_grad=True)
        c0, rows = lib.tensor(init, requires_grad=True), lib.tensor(xs, requires_grad=True)

        def fn(carry, x):
            h = lib.T.tanh(carry @ w + x * b)
            return h, h.sum() * b

        scan = lr.scan if lib.lazy else loopy_scan
        carry, ys = scan(fn, c0, rows)
        (carry.sum() + ys.sum()).backward()
        return (carry, ys), (w.grad, b.grad, c0.grad, rows.grad)

    got, got_grads = run(LAZY)
    want, want_grads = run(EAGER)
    assert_tree_close(got, want)
    for name, g, w in zip(("w", "b", "init", "xs"), got_grads, want_grads):
        assert_grad_close(g, w, f"{name}.grad")


def test_scan_detach_in_fn():
    # Not upstream. The carry is scaled by a detached x: xs's gradient comes from y alone.
    def make(lib):
        def fn(carry, x):
            return carry * x.detach(), x * 2
        return fn

    run_both(make, f32([1.0, 1.0]), XS_27)


def test_scan_no_grad_in_fn():
    # Not upstream. The scale is computed under no_grad: xs's gradient comes from y alone.
    def make(lib):
        def fn(carry, x):
            with (lr.no_grad() if lib is LAZY else torch.no_grad()):
                scale = x * 1.0
            return carry * scale, x * 2
        return fn

    run_both(make, f32([1.0, 1.0]), XS_27)


# ---- test_scan.py: PyTreeTest and ValueAndGradPartitionedTest -----------------------------


def test_ys_keep_none_positions():
    def make(lib):
        def fn(carry, x):
            return carry + x, ((x, x * 2), (None, carry), None)
        return fn

    _, ys = run_both(make, f32([0.0, 0.0]), XS3)
    assert ys[1][0] is None and ys[2] is None


def linear_step(lib):
    def fn(carry, x):
        new_carry = carry @ x
        return new_carry, new_carry
    return fn


LINEAR_INIT = f32([[1.0, 2.0], [3.0, 4.0]])
LINEAR_XS = f32([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])


def test_transform_linear_layer():
    # Upstream splits fn into a forward and a backward with value_and_grad_partitioned and checks
    # one step: the outputs, and, for cotangents of ones on new_carry and on y, the gradients
    # (ones + ones) @ x.T for carry and carry.T @ (ones + ones) for x. lazyrt has no such split;
    # the same step is a scan over xs[:1], whose backward from the sum of its outputs gives
    # those cotangents. Then the scan over both rows, gradients against torch's loop.
    carry, ys = run_both(linear_step, LINEAR_INIT, LINEAR_XS[:1])
    x, cot = LINEAR_XS[0], np.full((2, 2), 2.0, np.float32)
    np.testing.assert_allclose(carry.numpy(), LINEAR_INIT @ x, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ys.numpy(), (LINEAR_INIT @ x)[None], rtol=RTOL, atol=ATOL)
    init, xs = lr.tensor(LINEAR_INIT, requires_grad=True), lr.tensor(LINEAR_XS[:1], requires_grad=True)
    carry, ys = lr.scan(linear_step(LAZY), init, xs)
    (carry.sum() + ys.sum()).backward()
    np.testing.assert_allclose(init.grad.numpy(), cot @ x.T, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(xs.grad.numpy(), (LINEAR_INIT.T @ cot)[None], rtol=RTOL, atol=ATOL)

    run_both(linear_step, LINEAR_INIT, LINEAR_XS)


def test_transform_non_trivial_pytree():
    # Upstream: one step of fn (two dict carries through sin/cos of a shared affine map, y a
    # sigmoid) split by value_and_grad_partitioned, its gradients for cotangents of ones
    # compared with torch.autograd's. Here that step is a scan over one row; then over four.
    def make(lib):
        def fn(carry, x):
            weights, biases = x["weights"], x["biases"]
            new_a = lib.T.sin(carry["a"] @ weights + biases)
            new_b = lib.T.cos(carry["b"] @ weights + biases)
            return {"a": new_a, "b": new_b}, lib.T.sigmoid(new_a + new_b)
        return fn

    init = {"a": randn(3, 2, 3), "b": randn(4, 2, 3)}
    xs = {"weights": randn(5, 4, 3, 3), "biases": randn(6, 4, 2, 3)}
    run_both(make, init, {k: v[:1] for k, v in xs.items()})
    run_both(make, init, xs)


# ---- test_scan_layers.py ------------------------------------------------------------------


def torch_copy(lazy_module, torch_module):
    """torch_module takes lazy_module's parameters and buffers (same names)."""
    state = {k: torch.tensor(np.array(v.numpy())) for k, v in lazy_module.state_dict().items()}
    torch_module.load_state_dict(state)
    return torch_module


def assert_param_grads(lazy_modules, torch_modules, rtol=RTOL, atol=ATOL, normwise=False):
    """Every parameter's .grad, module by module, against torch's (see assert_grad_close);
    returns how many torch gradients were compared. normwise: each gradient's atol is at least
    rtol times its largest magnitude (a weight gradient is a sum over every position of terms
    that cancel: an element far below the others carries their rounding, not its own)."""
    checks = 0
    for i, (lazy_module, torch_module) in enumerate(zip(lazy_modules, torch_modules, strict=True)):
        lazy_params, torch_params = list(lazy_module.named_parameters()), list(torch_module.named_parameters())
        assert [n for n, _ in lazy_params] == [n for n, _ in torch_params]
        for (name, p), (_, q) in zip(lazy_params, torch_params):
            tol = atol
            if normwise and q.grad is not None:
                tol = max(atol, rtol * float(q.grad.abs().max()))
            assert_grad_close(p.grad, q.grad, f"module {i}: {name}.grad", rtol, tol)
            checks += q.grad is not None
    return checks


def assert_grads_computed_by_loop(grads):
    """Upstream's assert_while_found_in_hlo on the gradients: before anything runs, each is
    computed by a backward scan (the rows in reverse), not by an unrolled chain of layers."""
    for grad in grads:
        assert grad.is_pending()
        text = lr.debug.graph_text([grad])
        assert any(" = scan(" in line and "reverse=true" in line for line in text.splitlines()), text


def test_empty_layers():
    x = randn(10, 64)
    output = lr.scan_layers([], lr.tensor(x))
    np.testing.assert_allclose(output.numpy(), x, rtol=RTOL, atol=ATOL)


def linear_layers(n):
    lr.manual_seed(42)
    layers = [lr.nn.Linear(64, 64) for _ in range(n)]
    return layers, [torch_copy(layer, torch.nn.Linear(64, 64)) for layer in layers]


@pytest.mark.parametrize("input_grad", [False, True], ids=["input_no_grad", "input_grad"])
def test_linear_layers(input_grad):
    # Upstream's input does not require grad, so only the stacked parameters do; with
    # input_grad the input is differentiated too (the scan's init).
    layers, torch_layers = linear_layers(10)
    x = randn(11, 64)
    l_x, t_x = lr.tensor(x, requires_grad=input_grad), torch.tensor(x, requires_grad=input_grad)
    output = lr.scan_layers(layers, l_x)
    assert output.requires_grad
    output.sum().backward()
    assert_grads_computed_by_loop([p.grad for layer in layers for p in layer.parameters()])
    want = t_x
    for layer in torch_layers:
        want = layer(want)
    want.sum().backward()
    assert_tree_close(output, want)
    assert assert_param_grads(layers, torch_layers) == 20
    if input_grad:
        assert_grad_close(l_x.grad, t_x.grad, "input.grad")


def test_linear_layers_run_as_one_scan_node():
    # Upstream's assert_while_found_in_hlo: the layers run as one loop, not unrolled. In lazyrt's
    # graph text that is one scan node of length n whose body does not depend on n; with
    # gradients, the graph of a parameter's gradient holds that scan and one backward scan
    # (reverse=true) of length n, whose body does not depend on n either.
    def scans(text, count):
        lines = text.splitlines()
        starts = [i for i, line in enumerate(lines) if " = scan(" in line]
        assert len(starts) == count, text
        bodies = []
        for i in starts:
            body = lines[i + 1:]
            # The scan's attributes and types (not its operands' numbers), and its body.
            bodies.append((lines[i].split(") ", 1)[1], "\n".join(body[:body.index("}")])))
        return bodies

    def graphs(n):
        layers, _ = linear_layers(n)
        x = lr.tensor(randn(12, 64))
        lr.sync([x] + [p for layer in layers for p in layer.parameters()])
        output = lr.scan_layers(layers, x)
        forward = scans(lr.debug.graph_text([output]), 1)
        output.sum().backward()
        backward = scans(lr.debug.graph_text([layers[0].weight.grad]), 2)
        assert forward[0] == backward[0], "the gradient's graph holds another forward scan"
        for head, _ in forward + backward:
            assert f"length={n}," in head, head
        assert "reverse=true" in backward[1][0], backward[1][0]
        return forward[0][1], backward[1][1]

    assert graphs(10) == graphs(3)


def test_scan_layers_cache():
    # Upstream: 10 Linear(64, 64) layers, scan_layers called three times; its one-layer cache
    # then holds one entry. Here: the three calls, each with the backward through it, compile
    # one graph, and give PyTorch's values and parameter gradients every time.
    layers, torch_layers = linear_layers(10)
    x = randn(13, 64)
    l_x = lr.tensor(x)
    params = [p for layer in layers for p in layer.parameters()]
    lr.sync([l_x] + params)
    want = torch.tensor(x)
    for layer in torch_layers:
        want = layer(want)
    want.sum().backward()

    lr.cache.clear_memory()
    lr.metrics.reset()
    for _ in range(3):
        for p in params:
            p.grad = None
        output = lr.scan_layers(layers, l_x.clone())
        output.sum().backward()
        lr.sync([output] + [p.grad for p in params])
        assert_tree_close(output, want)
        assert assert_param_grads(layers, torch_layers) == 20
    assert lr.metrics.counter("UncachedCompile") == 1
    assert lr.metrics.counter("CachedCompile") == 2


def tuple_module_class(lib):
    class TupleModule(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = lib.nn.Linear(64, 64)
            self.w = lib.nn.Parameter(lib.T.randn(64, 64))

        def forward(self, x, y, z):
            return self.linear(x).sin(), self.linear(y).cos(), self.linear(z) @ self.w

    return TupleModule


def test_tuple_layers():
    lr.manual_seed(7)
    lazy_class, torch_class = tuple_module_class(LAZY), tuple_module_class(EAGER)
    layers = [lazy_class() for _ in range(10)]
    torch_layers = [torch_copy(layer, torch_class()) for layer in layers]
    raw = [randn(20 + i, 64) * s for i, s in enumerate((100, 200, 300))]
    a = randn(23, 64)
    # As upstream, the input is a pending computation, not just data; here `a` requires grad,
    # so the input's gradient is checked too (through a).
    l_a, t_a = lr.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    output = lr.scan_layers(layers, tuple(lr.tensor(t) + l_a for t in raw))
    # As upstream, backward from the first output only.
    output[0].sum().backward()
    want = tuple(torch.tensor(t) + t_a for t in raw)
    for layer in torch_layers:
        want = layer(*want)
    want[0].sum().backward()
    assert_tree_close(tuple(output), want, rtol=1e-3, atol=1e-4)
    # The first layer's inputs are scaled by 100 to 300 (as upstream's), so the gradient of its
    # weight sums products about that much larger than their result: float32 rounding leaves
    # up to 4e-5 (torch's own float32 result is as far from float64's), hence atol 1e-4 there.
    assert assert_param_grads(layers[:1], torch_layers[:1], atol=1e-4) == 2
    assert assert_param_grads(layers[1:], torch_layers[1:]) == 18  # each w: torch has no gradient
    assert_grad_close(l_a.grad, t_a.grad, "a.grad")


# The example decoder of pytorch/xla's examples/decoder_only_model.py, for either library.
CONFIG = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
              intermediate_size=8 * 128, vocab_size=256)


def decoder_classes(lib):
    T, nn = lib.T, lib.nn
    H, I, V = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"]
    n_heads, n_kv = CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"]
    head_dim = H // n_heads

    class RMSNorm(nn.Module):
        def __init__(self, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(T.ones(H))
            self.eps = eps

        def forward(self, h):
            variance = h.pow(2).mean(-1, keepdim=True)
            return self.weight * (h * T.rsqrt(variance + self.eps))

    def repeat_kv(h, n_rep):
        b, kv, s, d = h.shape
        return h.unsqueeze(2).expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(H, n_heads * head_dim, bias=False)
            self.k_proj = nn.Linear(H, n_kv * head_dim, bias=False)
            self.v_proj = nn.Linear(H, n_kv * head_dim, bias=False)
            self.o_proj = nn.Linear(n_heads * head_dim, H, bias=False)

        def forward(self, h):
            b, s = h.shape[0], h.shape[1]
            q = self.q_proj(h).view(b, s, n_heads, head_dim).transpose(1, 2)
            k = repeat_kv(self.k_proj(h).view(b, s, n_kv, head_dim).transpose(1, 2), n_heads // n_kv)
            v = repeat_kv(self.v_proj(h).view(b, s, n_kv, head_dim).transpose(1, 2), n_heads // n_kv)
            weights = T.softmax(T.matmul(q, k.transpose(2, 3)) / math.sqrt(head_dim), dim=-1)
            out = T.matmul(weights, v).transpose(1, 2).reshape(b, s, H)
            return self.o_proj(out)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(H, I, bias=False)
            self.up_proj = nn.Linear(H, I, bias=False)
            self.down_proj = nn.Linear(I, H, bias=False)

        def forward(self, x):
            return self.down_proj(lib.silu(self.gate_proj(x)) * self.up_proj(x))

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attention()
            self.mlp = MLP()
            self.input_layernorm = RMSNorm()
            self.post_attention_layernorm = RMSNorm()

        def forward(self, h):
            h = h + self.self_attn(self.input_layernorm(h))
            return h + self.mlp(self.post_attention_layernorm(h))

    class DecoderOnlyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, H)
            self.layers = nn.ModuleList([DecoderLayer() for _ in range(CONFIG["num_hidden_layers"])])
            self.norm = RMSNorm()
            self.output = nn.Linear(H, V, bias=False)

        def forward(self, input_ids):
            h = self.embed_tokens(input_ids)
            for layer in self.layers:
                h = layer(h)
            return self.output(self.norm(h))

        def forward_scan(self, input_ids):
            h = lr.scan_layers(list(self.layers), self.embed_tokens(input_ids))
            return self.output(self.norm(h))

    return DecoderOnlyModel


def test_decoder_model():
    lr.manual_seed(42)
    model = decoder_classes(LAZY)()
    torch_model = torch_copy(model, decoder_classes(EAGER)())
    ids = np.random.default_rng(13).integers(0, CONFIG["vocab_size"], size=(2, 8))
    scan_output = model.forward_scan(lr.tensor(ids))
    scan_output.sum().backward()
    assert_grads_computed_by_loop([p.grad for layer in model.layers for p in layer.parameters()])
    loop_output = torch_model(torch.tensor(ids))
    loop_output.sum().backward()
    assert_tree_close(scan_output, loop_output, rtol=1e-5, atol=2e-6)
    # Every parameter, the layers' (upstream's check) and the embedding, norm and output's.
    assert assert_param_grads([model], [torch_model], normwise=True) == 21


def test_heterogenous_layers():
    layer1 = lr.nn.Linear(128, 128)
    layer2 = lr.nn.Sequential(lr.nn.Linear(128, 128))
    with pytest.raises((lr.Error, ValueError), match="(?i)layer 1"):
        lr.scan_layers([layer1, layer2], lr.zeros(128))


def test_mismatched_shapes():
    layer1 = lr.nn.Linear(128, 128)
    layer2 = lr.nn.Linear(128, 129)
    with pytest.raises((lr.Error, ValueError), match="(?i)layer 1"):
        lr.scan_layers([layer1, layer2], lr.zeros(128))
