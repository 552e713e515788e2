"""The convolutions of a ResNet-18 training step, one layer shape at a time, against PyTorch.

Workload: for each distinct conv2d of ResNet-18 on a batch of 16 64x64 images (f32, no bias),
one step computes the convolution and both its gradients, for a fixed output gradient gy:
y = conv2d(x, w); (y * gy).sum().backward(); the step returns x.grad and w.grad. Inputs,
weights and gy are standard normal (numpy default_rng(5)), the same in every peer.

Peers: lazyrt replayed (compile_step) on the cpu backend, whose convolutions go through
oneDNN, and on the reference backend (the hand-written im2col + GEMM kernels), against PyTorch
eager autograd. Every peer's x.grad and w.grad are checked against PyTorch's before timing.
"""

import numpy as np
import torch

import lazyrt as lr
from harness import BenchmarkError, check_close, ratio, table, time_side_by_side

BATCH = 16
# (name, C in, O out, input size, kernel, stride, padding): ResNet-18's conv2d shapes at 64x64.
LAYERS = [
    ("stem 7x7/2, 3->64", 3, 64, 64, 7, 2, 3),
    ("layer1 3x3, 64->64", 64, 64, 16, 3, 1, 1),
    ("layer2 3x3/2, 64->128", 64, 128, 16, 3, 2, 1),
    ("layer2 1x1/2 shortcut, 64->128", 64, 128, 16, 1, 2, 0),
    ("layer2 3x3, 128->128", 128, 128, 8, 3, 1, 1),
    ("layer3 3x3/2, 128->256", 128, 256, 8, 3, 2, 1),
    ("layer3 3x3, 256->256", 256, 256, 4, 3, 1, 1),
    ("layer4 3x3/2, 256->512", 256, 512, 4, 3, 2, 1),
    ("layer4 3x3, 512->512", 512, 512, 2, 3, 1, 1),
]


def lazyrt_step(backend, x_np, w_np, gy_np, stride, padding):
    """A compiled step on `backend` and the function that replays it there."""
    lr.set_backend(backend)
    try:
        x = lr.tensor(x_np, requires_grad=True)
        w = lr.tensor(w_np, requires_grad=True)
        gy = lr.tensor(gy_np)

        def step():
            y = lr.nn.functional.conv2d(x, w, stride=stride, padding=padding)
            (y * gy).sum().backward()
            dx, dw = x.grad, w.grad
            x.grad = None
            w.grad = None
            return dx, dw

        compiled = lr.compile_step(step, ())
        compiled()
    finally:
        lr.set_backend("cpu")

    def replay():
        lr.set_backend(backend)
        try:
            return compiled()
        finally:
            lr.set_backend("cpu")
    return compiled, replay


def run(opts):
    rng = np.random.default_rng(5)
    reps = 3 if opts.quick else 7
    rows, summary, speedups = [], [], []
    total = {"cpu": 0.0, "reference": 0.0, "torch": 0.0}
    for name, c, o, size, k, stride, padding in LAYERS:
        x_np = rng.standard_normal((BATCH, c, size, size), dtype=np.float32)
        w_np = rng.standard_normal((o, c, k, k), dtype=np.float32)
        out = (size + 2 * padding - k) // stride + 1
        gy_np = rng.standard_normal((BATCH, o, out, out), dtype=np.float32)

        tx = torch.from_numpy(x_np.copy()).requires_grad_()
        tw = torch.from_numpy(w_np.copy()).requires_grad_()
        tgy = torch.from_numpy(gy_np.copy())

        def torch_step():
            y = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=padding)
            (y * tgy).sum().backward()
            dx, dw = tx.grad, tw.grad
            tx.grad = None
            tw.grad = None
            return dx, dw

        want = [t.numpy() for t in torch_step()]
        peers = {"torch": torch_step}
        compiled = {}
        for backend in ("cpu", "reference"):
            compiled[backend], peers[backend] = lazyrt_step(backend, x_np, w_np, gy_np, stride, padding)
            got = [t.numpy() for t in peers[backend]()]
            # Each gradient element sums O*k*k (dx) or N*out*out (dw) products of normal values.
            for what, g, e, n in (("x.grad", got[0], want[0], o * k * k), ("w.grad", got[1], want[1],
                                                                              BATCH * out * out)):
                check_close(f"conv {name}, lazyrt {backend}: {what}", g, e, rtol=1e-4,
                            atol=2e-6 * n ** 0.5 * 4)
        ms = {n: s.scaled(1e3) for n, s in time_side_by_side(peers, 1, reps, warmup=2).items()}
        for backend, step in compiled.items():
            if step.traces != 1:
                raise BenchmarkError(f"conv {name}: compile_step on {backend} retraced")
        flops = 3 * 2 * BATCH * o * out * out * c * k * k  # forward, backward input, backward weight
        for p in total:
            total[p] += ms[p].median
        speedups.append(ms["torch"].median / ms["cpu"].median)
        rows.append((name, f"{BATCH}x{c}x{size}x{size}", ms["cpu"].cell(), ms["reference"].cell(),
                     ms["torch"].cell(), ratio(ms["torch"].median / ms["cpu"].median),
                     ratio(ms["reference"].median / ms["cpu"].median),
                     f"{flops / (ms['cpu'].median * 1e-3) / 1e9:.1f}"))
    rows.append(("all nine, summed medians", "", f"{total['cpu']:.2f}", f"{total['reference']:.2f}",
                 f"{total['torch']:.2f}", ratio(total["torch"] / total["cpu"]),
                 ratio(total["reference"] / total["cpu"]), ""))
    md = ["## Convolutions of a ResNet-18 training step, layer by layer\n",
          f"Batch {BATCH}, 64x64 images, f32, no bias: each distinct conv2d of ResNet-18 at that size. One step = the "
          "convolution and both gradients for a fixed output gradient (`(conv2d(x, w) * gy).sum().backward()`, "
          "returning x.grad and w.grad). lazyrt replays the step (`compile_step`) on the cpu backend (oneDNN "
          "convolutions) and on the reference backend (hand-written im2col + GEMM); PyTorch runs eager autograd. "
          "Both lazyrt peers' gradients are checked against PyTorch's before timing (rtol 1e-4, atol scaled by the "
          f"square root of the reduction length). {reps} steps per peer after 2 warm-up, alternating.\n",
          table(["layer", "input", "lazyrt cpu (oneDNN) ms", "lazyrt reference ms", "PyTorch eager ms",
                 "PyTorch / lazyrt cpu", "reference / cpu", "lazyrt cpu GFLOP/s"], rows, "llrrrrrr"), ""]
    summary = [("ResNet-18 convolutions, fwd+bwd, 9 layers", "lazyrt replayed (cpu, oneDNN)", f"{total['cpu']:.2f}",
                "ms (sum)", "PyTorch eager", f"{total['torch']:.2f}", ratio(total["torch"] / total["cpu"]))]
    return {"markdown": "\n".join(md), "summary": summary}
