"""The acceptance programs of examples/models (a GPT in nanoGPT's architecture, ResNet-18 in
torchvision's layout): each file is plain PyTorch code, run here once by PyTorch and once by
lazyrt with only its torch import lines changed, both trained for 20 steps from the same
initial weights, lazyrt's steps replayed by compile_step. Losses agree to 1e-4 relative."""

import os
import types

import numpy as np
import pytest
import torch

import lazyrt as lr
from conftest import REPO

# The only lines that differ between the PyTorch and the lazyrt program.
IMPORTS = {
    "import torch": "import lazyrt as torch",
    "import torch.nn as nn": "import lazyrt.nn as nn",
    "from torch.nn import functional as F": "from lazyrt.nn import functional as F",
}


def load(name, on_lazyrt):
    path = os.path.join(REPO, "examples", "models", name + ".py")
    with open(path) as f:
        lines = f.read().split("\n")
    if on_lazyrt:
        swapped = [IMPORTS.get(line, line) for line in lines]
        changed = [a for a, b in zip(lines, swapped) if a != b]
        assert sorted(changed) == sorted(IMPORTS), f"{name}.py must have exactly the torch import lines {list(IMPORTS)}"
        lines = swapped
    module = types.ModuleType(f"{name}_{'lazyrt' if on_lazyrt else 'torch'}")
    module.__file__ = path
    exec(compile("\n".join(lines), path, "exec"), module.__dict__)
    return module


def copy_weights(model, tmodel):
    state = tmodel.state_dict()
    model.load_state_dict({k: lr.from_torch(v.detach().clone()) for k, v in state.items()})


def train_side_by_side(model, tmodel, opt, topt, forward_loss, tforward_loss, batches, steps=20):
    def step(x, y):
        opt.zero_grad()
        loss = forward_loss(model, x, y)
        loss.backward()
        opt.step()
        return loss

    compiled = lr.compile_step(step, (lr.from_torch(batches[0][0]), lr.from_torch(batches[0][1])))
    losses, tlosses = [], []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        losses.append(compiled(lr.from_torch(x), lr.from_torch(y)).item())
        topt.zero_grad()
        tloss = tforward_loss(tmodel, x, y)
        tloss.backward()
        topt.step()
        tlosses.append(tloss.item())
    return compiled, losses, tlosses


def test_gpt_trains_like_pytorch():
    tgpt, lgpt = load("gpt", False), load("gpt", True)
    cfg = dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True)
    torch.manual_seed(0)
    tmodel = tgpt.GPT(tgpt.GPTConfig(**cfg))
    model = lgpt.GPT(lgpt.GPTConfig(**cfg))
    assert model.lm_head.weight is model.transformer.wte.weight, "weights are tied"
    assert list(model.state_dict()) == list(tmodel.state_dict())
    copy_weights(model, tmodel)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95))
    topt = tmodel.configure_optimizers(weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95))
    assert [len(g["params"]) for g in opt.param_groups] == [len(g["params"]) for g in topt.param_groups]

    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(4):
        x = torch.randint(0, 64, (4, 16), generator=g)
        y = torch.randint(0, 64, (4, 16), generator=g)
        y[:, :3] = -1  # ignored positions
        batches.append((x, y))
    compiled, losses, tlosses = train_side_by_side(
        model, tmodel, opt, topt, lambda m, x, y: m(x, y)[1], lambda m, x, y: m(x, y)[1], batches)
    np.testing.assert_allclose(losses, tlosses, rtol=1e-4)
    assert compiled.traces == 1
    assert tlosses[-1] < tlosses[0] - 0.1, "the model learns"
    for (name, p), tp in zip(model.named_parameters(), tmodel.parameters()):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-3, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("dtype,steps", [(torch.float64, 20), (torch.float32, 3)])
def test_resnet18_trains_like_pytorch(dtype, steps):
    """In f64 for the 20 steps: training this network on a few random batches is chaotic, and in
    f32 PyTorch's own f32 and f64 runs part beyond 1e-4 after a few steps (a near-tie decided the
    other way), so f32 is compared over the first steps only."""
    tres, lres = load("resnet", False), load("resnet", True)
    torch.manual_seed(0)
    tmodel = tres.resnet18(num_classes=10).to(dtype)
    model = lres.resnet18(num_classes=10).to(lr.float64 if dtype == torch.float64 else lr.float32)
    assert list(model.state_dict()) == list(tmodel.state_dict())
    copy_weights(model, tmodel)
    opt = lr.optim.SGD(model.parameters(), lr=0.002, momentum=0.9, weight_decay=5e-4)
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.002, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(16, 3, 32, 32, generator=g).to(dtype), torch.randint(0, 10, (16,), generator=g))
               for _ in range(4)]
    compiled, losses, tlosses = train_side_by_side(
        model, tmodel, opt, topt, lambda m, x, y: lres.loss_fn(m(x), y), lambda m, x, y: tres.loss_fn(m(x), y), batches,
        steps)
    np.testing.assert_allclose(losses, tlosses, rtol=1e-4)
    assert compiled.traces == 1
    if steps < 20:
        return
    assert tlosses[-1] < tlosses[0] / 2, "the model learns"
    # The running statistics the replays wrote back are torch's, so evaluation agrees too.
    model.eval()
    tmodel.eval()
    x = batches[0][0]
    np.testing.assert_allclose(model(lr.from_torch(x)).numpy(), tmodel(x).detach().numpy(), rtol=1e-6, atol=1e-6)
