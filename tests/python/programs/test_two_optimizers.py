"""Two optimizers created for two parts of one model and stepped inside one step, as the
multi-optimizer pattern of PyTorch's tutorials and pytorch/examples (e.g. the dcgan and
word-embedding examples keep one optimizer per network; "Optimizing with per-module
optimizers" in the torch.optim docs): a feature layer trained with Adam and a head trained
with SGD (momentum), both zeroed and stepped inside the compiled function. Eager PyTorch is the oracle, compared after every step."""

import torch
from torch import nn
from torch.nn import functional as F

import lazyrt.torch
from _compare import same_results, same_state, seeded

STEPS = 5


class TwoPart(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.features(x))


def program():
    model = TwoPart()
    opt_features = torch.optim.Adam(model.features.parameters(), lr=1e-2)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):  # the loop body as written, with its two optimizers
        opt_features.zero_grad()
        opt_head.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt_features.step()
        opt_head.step()
        return loss

    return step, {"model": model, "opt_features": opt_features, "opt_head": opt_head}


def batches(n=STEPS):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(10, 12, generator=g), torch.randint(0, 3, (10,), generator=g)) for _ in range(n)]


def test_two_optimizers_in_one_step_train_as_in_eager():
    eager, s_eager = seeded(program)
    lazy_fn, s_lazy = seeded(program)
    lazy = lazyrt.torch.compile(lazy_fn)
    losses = []
    for k, (x, y) in enumerate(batches()):
        got, want = lazy(x, y), eager(x, y)
        same_results(got, want, f"step {k}")
        same_state(s_lazy, s_eager, f"after step {k}:")
        losses.append(got.item())
    assert lazy.captures == 1
    assert len(set(losses)) == len(losses)

