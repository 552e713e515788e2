"""Fused reductions from Python: a layer norm (forward and backward), a softmax written out of
its parts and a mean squared error per row equal PyTorch's values; the same programs with
fused reductions turned off (LAZYRT_FUSE_REDUCTIONS=0, in a child process) give the same bits,
and only the default process made fused reductions (its dumped graphs say so)."""

import glob
import os
import subprocess
import sys

import numpy as np
import torch

import lazyrt as lr

PROGRAMS = r"""
import sys
import numpy as np
import lazyrt as lr

rng = np.random.default_rng(5)
x = rng.standard_normal((64, 96)).astype(np.float32) * 2 + 0.5
t = rng.standard_normal((64, 96)).astype(np.float32)
w = rng.standard_normal(96).astype(np.float32)
b = rng.standard_normal(96).astype(np.float32)


def run(mod, tensor, layer_norm):
    xs, ws, bs = tensor(x, requires_grad=True), tensor(w, requires_grad=True), tensor(b, requires_grad=True)
    y = layer_norm(xs, [96], ws, bs, 1e-5)
    (y * y).sum().backward()
    e = mod.exp(xs - xs.amax(-1, keepdim=True))
    soft = e / e.sum(-1, keepdim=True)
    mse = ((xs - tensor(t)) * (xs - tensor(t))).mean(-1)
    return [v.detach() for v in (y, xs.grad, ws.grad, bs.grad, soft, mse)]


if __name__ == "__main__":
    out = run(lr, lr.tensor, lr.nn.functional.layer_norm)
    lr.mark_step()
    np.save(sys.argv[1], np.concatenate([v.numpy().ravel() for v in out]))
"""


def run_child(tmp_path, name, **env):
    script = tmp_path / "programs.py"
    script.write_text(PROGRAMS)
    dump = tmp_path / f"dump_{name}"
    dump.mkdir()
    out = tmp_path / f"{name}.npy"
    r = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, LAZYRT_DUMP_GRAPH=str(dump), LAZYRT_BACKEND="cpu", **env))
    assert r.returncode == 0, r.stderr[-3000:]
    graphs = "".join(open(f).read() for f in glob.glob(str(dump / "*.txt")))
    return np.load(out), graphs


def test_fused_and_unfused_reductions_give_the_same_bits_and_torchs_values(tmp_path):
    fused, fused_graphs = run_child(tmp_path, "fused")
    plain, plain_graphs = run_child(tmp_path, "plain", LAZYRT_FUSE_REDUCTIONS="0")
    assert "reduced=1" in fused_graphs
    assert "reduced=1" not in plain_graphs and "fusion(" in plain_graphs
    assert np.array_equal(fused.view(np.uint32), plain.view(np.uint32))

    sys.path.insert(0, str(tmp_path))
    try:
        import programs
    finally:
        sys.path.pop(0)
    want = programs.run(torch, torch.tensor, torch.nn.functional.layer_norm)
    np.testing.assert_allclose(fused, np.concatenate([v.numpy().ravel() for v in want]), rtol=2e-5, atol=2e-5)
