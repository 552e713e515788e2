"""The backend choice from Python: lazyrt.set_backend / current_backend / available_backends,
LAZYRT_BACKEND in a fresh interpreter, and a small model trained on both backends against
PyTorch (the reference backend runs every op on its own: the oracle for the cpu backend)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import lazyrt as lr
from conftest import assert_same, pair


@pytest.fixture
def restore_backend():
    before = lr.current_backend()
    yield
    lr.set_backend(before)


def test_backends_are_listed_and_chosen(restore_backend):
    assert lr.available_backends() == ["cpu", "reference"]
    lr.set_backend("reference")
    assert lr.current_backend() == "reference"
    with pytest.raises(lr.Error, match="unknown backend 'tpu' \\(known: cpu, reference\\)"):
        lr.set_backend("tpu")
    assert lr.current_backend() == "reference"


def test_lazyrt_backend_in_the_environment_chooses_at_start():
    code = "import lazyrt as lr; x = lr.ones(3) * 2; print(lr.current_backend(), x.tolist())"
    env = dict(os.environ, LAZYRT_BACKEND="reference")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["reference", "[2.0,", "2.0,", "2.0]"]
    env["LAZYRT_BACKEND"] = "nope"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "LAZYRT_BACKEND: unknown backend 'nope'" in bad.stderr


@pytest.mark.parametrize("name", ["cpu", "reference"])
def test_a_training_step_matches_torch_on_each_backend(name, rng, restore_backend):
    lr.set_backend(name)
    x, tx = pair(rng, (8, 5), lr.float32)
    w1, tw1 = pair(rng, (5, 6), lr.float32, -0.5, 0.5, requires_grad=True)
    w2, tw2 = pair(rng, (6, 2), lr.float32, -0.5, 0.5, requires_grad=True)
    for a, b, c in [(x, w1, w2), (tx, tw1, tw2)]:
        h = (a @ b).tanh() * 1.5 + 0.25
        loss = ((h @ c).softmax(-1) - 0.5).pow(2).mean()
        loss.backward()
    assert_same(w1.grad, tw1.grad, rtol=1e-5, atol=1e-6)
    assert_same(w2.grad, tw2.grad, rtol=1e-5, atol=1e-6)


def _halved(values):
    x = lr.tensor(np.array(values, dtype=np.float32))
    return (x * 0.5).numpy()


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_denormals_are_flushed_as_xla_does_and_the_thread_keeps_its_own_mode(backend, restore_backend):
    # 2e-38 / 2 is below float32's smallest normal (1.18e-38): a denormal, which x86 computes
    # 10-100x slower. lazyrt's kernels flush it to zero by default (torch.set_flush_denormal's
    # switch); the caller's thread keeps producing denormals outside them.
    lr.set_backend(backend)
    assert lr.flush_denormal()
    got = _halved([2e-38, 3.0] * 40000)  # large enough for the kernels' threads to share it
    assert got[0] == 0 and got[2] == 0 and got[1] == 1.5
    assert np.float32(2e-38) * np.float32(0.5) > 0  # numpy, on this thread, after lazyrt ran
    t = torch.tensor([2e-38]) * 0.5
    assert t.item() > 0  # and PyTorch's kernels, on this thread and its OpenMP team
    assert lr.set_flush_denormal(False)
    try:
        got = _halved([2e-38, 3.0])
        assert got[0] == np.float32(1e-38) and got[1] == 1.5
    finally:
        lr.set_flush_denormal(True)
    code = "import lazyrt, numpy as np; print(lazyrt.flush_denormal())"
    env = dict(os.environ, LAZYRT_FLUSH_DENORMAL="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
