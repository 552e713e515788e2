"""Max pooling against PyTorch on seeded random geometries: values, indices and gradients, with
ties, NaN and infinities in the windows, windows clipped at every edge, dilation and ceil_mode;
through lazyrt's own API and through lazyrt.torch.compile (training and inference graphs)."""
import numpy as np
import pytest
import torch

import lazyrt as lr
import lazyrt.torch

TF = torch.nn.functional


def geometries(seed, count):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        k = (int(rng.integers(1, 5)), int(rng.integers(1, 5)))
        s = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        d = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
        p = (int(rng.integers(0, k[0] // 2 + 1)), int(rng.integers(0, k[1] // 2 + 1)))
        h, w = int(rng.integers(1, 13)), int(rng.integers(1, 40))
        ceil = bool(rng.integers(0, 2))
        if any((k[i] - 1) * d[i] + 1 > (h, w)[i] + 2 * p[i] for i in range(2)):
            continue  # the window does not fit: torch refuses it as lazyrt does
        out.append(dict(shape=(int(rng.integers(1, 3)), int(rng.integers(1, 4)), h, w), kernel_size=k, stride=s,
                        padding=p, dilation=d, ceil_mode=ceil))
    return out


def data(shape, rng, special):
    # Small integers make ties common; special values go where they land.
    x = rng.integers(-3, 4, size=shape).astype(np.float64)
    if special:
        flat = x.reshape(-1)
        n = flat.size
        for value, share in ((np.nan, 0.05), (-np.inf, 0.05), (np.inf, 0.02)):
            flat[rng.choice(n, size=max(1, int(n * share)), replace=False)] = value
    return x


def check_against_torch(x, kw, rng):
    """max_pool2d(x, return_indices=True, **kw) and its gradient for a random output gradient,
    lazyrt's against torch's, bit for bit; returns torch's values, the output gradient and
    torch's input gradient."""
    tx = torch.from_numpy(x.copy()).requires_grad_()
    tv, ti = TF.max_pool2d(tx, return_indices=True, **kw)
    gy = rng.standard_normal(tuple(tv.shape)).astype(x.dtype)
    # A window with no element in the input (dilation steps over it) is -inf with an index past
    # the plane; torch's backward adds its gradient there, into the next plane. Its value
    # depends on no element: lazyrt gives it no gradient, torch agrees once it is 0.
    gy[ti.numpy() >= x.shape[-2] * x.shape[-1]] = 0
    tv.backward(torch.from_numpy(gy))
    lx = lr.tensor(x, requires_grad=True)
    lv, li = lr.nn.functional.max_pool2d(lx, return_indices=True, **kw)
    np.testing.assert_array_equal(li.numpy(), ti.numpy())
    np.testing.assert_array_equal(lv.numpy(), tv.detach().numpy())
    lv.backward(lr.tensor(gy))
    np.testing.assert_array_equal(lx.grad.numpy(), tx.grad.numpy())
    return tv.detach().numpy(), gy, tx.grad.numpy()


CASES = [(i, g) for i, g in enumerate(geometries(11, 60))]


@pytest.mark.parametrize("i,g", CASES, ids=[f"g{i}" for i, _ in CASES])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_pool_matches_torch(i, g, dtype):
    rng = np.random.default_rng(100 + i)
    kw = {k: v for k, v in g.items() if k != "shape"}
    for special in (False, True):
        x = data(g["shape"], rng, special).astype(dtype)
        tv, gy, tgrad = check_against_torch(x, kw, rng)
        # The values alone (their own kernel) and their gradient.
        lx2 = lr.tensor(x, requires_grad=True)
        lv2 = lr.nn.functional.max_pool2d(lx2, **kw)
        np.testing.assert_array_equal(lv2.numpy(), tv)
        (lv2 * lr.tensor(gy)).sum().backward()
        np.testing.assert_array_equal(lx2.grad.numpy(), tgrad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_max_pool_16_bit(dtype):
    rng = np.random.default_rng(5)
    for g in geometries(12, 10):
        kw = {k: v for k, v in g.items() if k != "shape"}
        x = torch.from_numpy(data(g["shape"], rng, True)).to(dtype)
        if dtype == torch.float16:  # torch 1.13 pools no f16 on the cpu: its f32 maxima are the same values
            tv, ti = TF.max_pool2d(x.float(), return_indices=True, **kw)
            tv = tv.to(dtype)
        else:
            tv, ti = TF.max_pool2d(x, return_indices=True, **kw)
        lv, li = lr.nn.functional.max_pool2d(lr.tensor(x.float().numpy()).to(lr.bfloat16 if dtype == torch.bfloat16
                                                                            else lr.float16),
                                             return_indices=True, **kw)
        np.testing.assert_array_equal(li.numpy(), ti.numpy())
        np.testing.assert_array_equal(lv.float().numpy(), tv.float().numpy())


def test_max_pool_large_planes_split_across_threads():
    # Enough planes and windows that the kernel runs them in pieces, on the pool's threads.
    rng = np.random.default_rng(9)
    x = data((4, 16, 40, 41), rng, True).astype(np.float32)
    for kw in (dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=(2, 3), stride=(1, 3), dilation=(2, 1))):
        check_against_torch(x, kw, rng)


class Pool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return TF.max_pool2d(torch.relu(self.conv(x)), 3, 2, 1).sum(dim=(2, 3))


def test_max_pool_through_torch_compile_training_and_inference():
    torch.manual_seed(0)
    eager, lazy = Pool(), Pool()
    lazy.load_state_dict(eager.state_dict())
    x = torch.randn(2, 3, 11, 14)

    def step(m):
        def f(x):
            loss = m(x).square().sum()
            loss.backward()
            return loss
        return f

    compiled = lazyrt.torch.compile(step(lazy))
    for _ in range(2):
        for m in (eager, lazy):
            m.zero_grad()
        ref = step(eager)(x)
        got = compiled(x)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lazy.conv.weight.grad, eager.conv.weight.grad, rtol=1e-5, atol=1e-5)

    def infer(m):
        def f(x):
            with torch.no_grad():
                return m(x)
        return f
    compiled_infer = lazyrt.torch.compile(infer(lazy))
    lr.metrics.reset()
    lr.metrics.set_kernel_timings(True)
    try:
        torch.testing.assert_close(compiled_infer(x), infer(eager)(x), rtol=1e-5, atol=1e-5)
        report = lr.metrics.report()
    finally:
        lr.metrics.set_kernel_timings(False)
    # An inference graph never reads the indices, so it does not compute them.
    assert "Kernel:max_pool2d:" in report
    assert "Kernel:max_pool2d_indices" not in report
