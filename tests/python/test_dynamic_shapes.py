"""Shape-polymorphic graphs (lazyrt.mark_dynamic): one executable per bucket of sizes.

The oracle is PyTorch eager. Seeded random programs (forward, backward) over a batch marked
dynamic run at several sizes, each result compared with eager's; a failure prints the seed and
the shortest program that still fails. Compile counts are checked where a bucket must share one
executable, and a size that cannot be padded must still compute eager's values.
"""

import numpy as np
import pytest
import torch

import lazyrt as lr

F = 6  # features: even, so that regrouping ops can halve it


def _ops():
    """name -> fn(M, h, ctx) with M the module (lazyrt or torch); h is [n, F] before and after."""
    def linear(M, h, c):
        return h @ c.param(M, (F, F)) + c.param(M, (F,))

    def gram(M, h, c):  # contracts the dynamic dim
        return h @ ((h.t() @ h) * 0.05)

    def regroup(M, h, c):  # [n, F] -> [2n, F/2] -> [n, F]
        n = h.shape[0]
        return h.reshape(n * 2, F // 2).tanh().reshape(n, F)

    def split3(M, h, c):  # [n, F] -> [n, 2, F/2], reduced over the middle
        n = h.shape[0]
        g = h.reshape(n, 2, F // 2)
        return M.cat([g.sum(1), g.amax(1)], 1)

    def permute3(M, h, c):  # the dynamic dim moved inside, then back
        n = h.shape[0]
        g = h.reshape(n, 2, F // 2).permute(2, 0, 1)
        return g.softmax(1).permute(1, 2, 0).reshape(n, F)

    def gather(M, h, c):
        return h + h.gather(1, h.argmax(1, keepdim=True))

    def embed(M, h, c):
        return h + c.param(M, (7, F))[c.tokens(M)]

    def cat_slice(M, h, c):
        return M.cat([h, h * 2], 1)[:, 1:F + 1]

    def flip_features(M, h, c):
        return h.flip([1]) - h

    def batch_norm(M, h, c):
        mean = h.mean(0, keepdim=True)
        return (h - mean) / (h.var(0, keepdim=True, unbiased=False) + 1e-3).sqrt()

    def index_rows(M, h, c):  # indexes the dynamic dim: refused, computed as traced
        return h + h[M.zeros(F, dtype=M.int64) if M is torch else lr.zeros([F], dtype=lr.int64)].sum(0)

    def sort_batch(M, h, c):  # sorts along the dynamic dim: refused
        return h.sort(0)[0]

    return {
        "linear": linear,
        "relu": lambda M, h, c: h.relu(),
        "tanh": lambda M, h, c: h.tanh(),
        "sigmoid": lambda M, h, c: h.sigmoid(),
        "exp": lambda M, h, c: (-h.abs()).exp(),
        "softmax1": lambda M, h, c: h.softmax(1),
        "log_softmax1": lambda M, h, c: h.log_softmax(1),
        "softmax0": lambda M, h, c: h.softmax(0) * h.shape[0],
        "log_softmax0": lambda M, h, c: h.log_softmax(0),
        "center0": lambda M, h, c: h - h.mean(0, keepdim=True),
        "batch_norm": batch_norm,
        "std0": lambda M, h, c: h / (h.std(0, keepdim=True) + 1),
        "std1": lambda M, h, c: h / (h.std(1, keepdim=True) + 1),
        "cumsum0": lambda M, h, c: h.cumsum(0) * 0.2,
        "cumsum1": lambda M, h, c: h.cumsum(1) * 0.5,
        "amax0": lambda M, h, c: h - h.amax(0, keepdim=True),
        "amin0": lambda M, h, c: h - h.amin(0, keepdim=True),
        "amax1": lambda M, h, c: h - h.amax(1, keepdim=True),
        "sum0": lambda M, h, c: h + h.sum(0) * 0.1,
        "prod0": lambda M, h, c: h + h.tanh().prod(0, keepdim=True),
        "norm0": lambda M, h, c: h / (h.norm(dim=0, keepdim=True) + 1),
        "where": lambda M, h, c: M.where(h > 0, h, h * 0.1),
        "gram": gram,
        "regroup": regroup,
        "split3": split3,
        "permute3": permute3,
        "gather": gather,
        "embed": embed,
        "cat_slice": cat_slice,
        "flip_features": flip_features,
        "index_rows": index_rows,
        "sort_batch": sort_batch,
    }


OPS = _ops()
REFUSED = {"index_rows", "sort_batch"}


class _Ctx:
    """The values a program reads, made alike for lazyrt and torch: parameters in order of use,
    and the tokens an embedding reads."""

    def __init__(self, rng_seed, n):
        self.rng = np.random.default_rng(rng_seed)
        self.n = n
        self.params = []  # (numpy value) in order of use
        self.made = {}  # module -> list of tensors
        self.at = {}
        self.tok = self.rng.integers(0, 7, size=n)

    def param(self, M, shape):
        i = self.at.get(M, 0)
        self.at[M] = i + 1
        while len(self.params) <= i:
            self.params.append(None)
        if self.params[i] is None:
            self.params[i] = (self.rng.standard_normal(shape) * 0.5).astype(np.float32)
        t = (lr.tensor(self.params[i], requires_grad=True) if M is lr
             else torch.tensor(self.params[i], requires_grad=True))
        self.made.setdefault(M, []).append(t)
        return t

    def tokens(self, M):
        if M is torch:
            return torch.tensor(self.tok)
        t = lr.tensor(self.tok.astype(np.int64))
        lr.mark_dynamic(t, 0)
        return t


def _run(M, program, x, target, seed, n, dynamic):
    ctx = _Ctx(seed, n)
    h0 = h = lr.tensor(x, requires_grad=True) if M is lr else torch.tensor(x, requires_grad=True)
    y = lr.tensor(target) if M is lr else torch.tensor(target)
    if M is lr and dynamic:
        lr.mark_dynamic(h, 0)
        lr.mark_dynamic(y, 0)
    for name in program:
        h = OPS[name](M, h, ctx)
    loss = (h.sum(1) * y).mean() + (h * h).mean()
    loss.backward()
    grads = [h0.grad] + [p.grad for p in ctx.made.get(M, [])]
    if M is lr:
        lr.sync([loss, h] + [g for g in grads if g is not None])
        return [loss.numpy(), h.numpy()] + [g.numpy() for g in grads]
    return [loss.detach().numpy(), h.detach().numpy()] + [g.numpy() for g in grads]


def _mismatch(program, seed, n, dynamic=True):
    rng = np.random.default_rng(seed * 1000 + n)
    x = rng.standard_normal((n, F)).astype(np.float32)
    target = rng.standard_normal(n).astype(np.float32)
    want = _run(torch, program, x, target, seed, n, False)
    got = _run(lr, program, x, target, seed, n, dynamic)
    for k, (g, w) in enumerate(zip(got, want)):
        scale = max(1.0, float(np.abs(w).max()) if w.size else 1.0)
        if g.shape != w.shape or not np.allclose(g, w, rtol=2e-4, atol=2e-4 * scale):
            return f"result {k}: shape {g.shape} vs {w.shape}, max diff {np.abs(g - w).max() if g.shape == w.shape else '-'}"
    return None


def _program(seed):
    rng = np.random.default_rng(seed)
    names = sorted(OPS)
    length = int(rng.integers(2, 7))
    return [names[int(rng.integers(len(names)))] for _ in range(length)]


def _shrink(program, fails):
    shrunk = list(program)
    changed = True
    while changed:
        changed = False
        for i in range(len(shrunk)):
            candidate = shrunk[:i] + shrunk[i + 1:]
            if candidate and fails(candidate):
                shrunk, changed = candidate, True
                break
    return shrunk


SIZES = [5, 7, 6, 8, 3, 2, 12]  # buckets 8, 8, 8, 8, 4, 2, 16


def test_random_programs_at_several_sizes_match_eager():
    lr.metrics.reset()
    polymorphic_programs = 0
    seeds = range(60)
    for seed in seeds:
        program = _program(seed)
        for n in SIZES:
            why = _mismatch(program, seed, n)
            if why:
                shortest = _shrink(program, lambda p: _mismatch(p, seed, n) is not None)
                pytest.fail(f"seed {seed}, n {n}: {why}\nprogram {program}\nshortest failing {shortest}")
        if not REFUSED.intersection(program):
            polymorphic_programs += 1
    # The path under test ran: every sync of a program without a refused op is polymorphic,
    # and none of those refused.
    assert lr.metrics.counter("PolymorphicGraph") >= polymorphic_programs * (len(SIZES) - 1)
    assert polymorphic_programs >= 40


def test_one_compile_per_bucket_for_a_training_step():
    rng = np.random.default_rng(1)
    w1 = lr.tensor((rng.standard_normal((F, 16)) * 0.3).astype(np.float32), requires_grad=True)
    w2 = lr.tensor((rng.standard_normal((16, 3)) * 0.3).astype(np.float32), requires_grad=True)
    tw1 = torch.tensor(w1.numpy(), requires_grad=True)
    tw2 = torch.tensor(w2.numpy(), requires_grad=True)
    opt = lr.optim.SGD([w1, w2], lr=0.1)
    topt = torch.optim.SGD([tw1, tw2], lr=0.1)
    lr.cache.clear_memory()
    lr.metrics.reset()
    sizes = list(range(33, 65)) + list(range(2, 33))
    for n in sizes:
        x = rng.standard_normal((n, F)).astype(np.float32)
        labels = rng.integers(0, 3, size=n)
        xt, lt = lr.tensor(x), lr.tensor(labels.astype(np.int64))
        lr.mark_dynamic(xt, 0)
        lr.mark_dynamic(lt, 0)
        opt.zero_grad()
        loss = lr.nn.functional.cross_entropy((xt @ w1).relu() @ w2, lt)
        loss.backward()
        opt.step()
        lr.mark_step()
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy((torch.tensor(x) @ tw1).relu() @ tw2, torch.tensor(labels))
        tloss.backward()
        topt.step()
        assert abs(loss.item() - tloss.item()) < 1e-4 * max(1, abs(tloss.item())), n
        if n == sizes[0]:
            lr.metrics.reset()  # the first step's graph is another one (no gradients yet)
    np.testing.assert_allclose(w1.numpy(), tw1.detach().numpy(), rtol=1e-4, atol=1e-5)
    # 2 .. 64 after the first step: buckets 2, 4, 8, 16, 32, 64, one step graph each.
    assert lr.metrics.counter("PolymorphicRefused") == 0
    assert lr.metrics.counter("UncachedCompile") <= 6, lr.metrics.report()


def test_outputs_keep_the_mark_and_a_size_of_one_is_not_padded():
    x = lr.tensor(np.ones((3, 2), np.float32))
    lr.mark_dynamic(x, 0)
    assert lr.dynamic_dims(x) == [0]
    y = (x * 2).sum(1)
    lr.sync([y])
    assert lr.dynamic_dims(y) == [0] and y.tolist() == [4.0, 4.0, 4.0]
    one = lr.tensor(np.ones((1, 2), np.float32))
    lr.mark_dynamic(one, 0)
    lr.metrics.reset()
    assert (one * 3).tolist() == [[3.0, 3.0]]
    assert lr.metrics.counter("PolymorphicGraph") == 0


def test_bad_marks_are_refused_with_the_call_and_shape():
    x = lr.tensor(np.ones((3, 2), np.float32))
    with pytest.raises(RuntimeError, match=r"mark_dynamic: dim 2 is out of range for a tensor of shape \[3, 2\]"):
        lr.mark_dynamic(x, 2)
    assert lr.dynamic_dims(x) == []
    with pytest.raises(RuntimeError, match="mark_dynamic: the tensor is a view"):
        lr.mark_dynamic(x[1:], 0)
    lr.mark_dynamic(x, [-1, 0])
    assert lr.dynamic_dims(x) == [0, 1]


def test_the_bucket_graph_and_why_a_graph_is_not_polymorphic():
    x = lr.tensor(np.arange(10, dtype=np.float32).reshape(5, 2))
    lr.mark_dynamic(x, 0)
    text = lr.debug.polymorphic_graph_text([x.mean(0)])
    # padded to 8 rows, the size a parameter, the mean's count read from it
    assert "f32[8, 2]" in text and ": i64[]" in text and "iota" in text, text
    assert lr.debug.polymorphic_graph_text([x.flip([0])]) == "not polymorphic: flip: flips a dynamic dim"
    assert lr.debug.polymorphic_graph_text([lr.tensor([1.0]) * 2]) == (
        "not polymorphic: it reads no dim marked dynamic")
    lr.metrics.reset()
    y = x.flip([0]) + 1  # refused: computed as traced
    np.testing.assert_array_equal(y.numpy(), np.arange(10, dtype=np.float32).reshape(5, 2)[::-1] + 1)
    assert lr.metrics.counter("PolymorphicRefused") == 1 and lr.metrics.counter("PolymorphicGraph") == 0


def test_a_compiled_step_shares_one_executable_per_bucket_and_trains_as_eager():
    rng = np.random.default_rng(2)
    w0 = (rng.standard_normal((F, 3)) * 0.3).astype(np.float32)
    w = lr.tensor(w0, requires_grad=True)
    tw = torch.tensor(w0, requires_grad=True)
    opt = lr.optim.Adam([w], lr=0.05)
    topt = torch.optim.Adam([tw], lr=0.05)

    def step(x, y):
        opt.zero_grad()
        out = x @ w
        loss = ((out.sum(1) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss, out

    def batch(n):
        return (rng.standard_normal((n, F)).astype(np.float32), rng.standard_normal(n).astype(np.float32))

    def marked(x, y):
        xt, yt = lr.tensor(x), lr.tensor(y)
        lr.mark_dynamic(xt, 0)
        lr.mark_dynamic(yt, 0)
        return xt, yt

    compiled = lr.compile_step(step, marked(*batch(5)))
    lr.metrics.reset()
    for n in [5, 6, 7, 8, 5, 3, 4, 7]:
        x, y = batch(n)
        loss, out = compiled(*marked(x, y))
        topt.zero_grad()
        tout = torch.tensor(x) @ tw
        tloss = ((tout.sum(1) - torch.tensor(y)) ** 2).mean()
        tloss.backward()
        topt.step()
        assert tuple(out.shape) == (n, 3) and lr.dynamic_dims(out) == [0]
        np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-5)
        assert abs(loss.item() - tloss.item()) <= 1e-5 * max(1.0, abs(tloss.item())), n
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    # sizes 5..8 share bucket 8 (compiled when the step was traced), 3..4 bucket 4
    assert lr.metrics.counter("UncachedCompile") == 1, lr.metrics.report()
    assert lr.metrics.counter("PolymorphicRefused") == 0
    assert lr.metrics.counter("ReplayGraph") == 8
