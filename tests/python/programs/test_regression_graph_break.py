"""A regression net whose forward has a graph break: the features of each input are read as
2x2 matrices and their determinants (torch.linalg.det, which lazyrt does not lower, so it runs
in PyTorch eager between compiled pieces) feed the head; a plain regression training loop in
the style of pytorch/examples regression (mse loss, zero_grad / backward / step), with SGD
momentum. Eager PyTorch is the oracle, compared after every step."""

import warnings

import torch
from torch import nn
from torch.nn import functional as F

import lazyrt
import lazyrt.torch
from _compare import same_results, same_state, seeded

STEPS = 5


class DetNet(nn.Module):
    def __init__(self, inputs=6, blocks=5):
        super().__init__()
        self.blocks = blocks
        self.lift = nn.Linear(inputs, 4 * blocks)
        self.head = nn.Sequential(nn.Linear(blocks, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        m = torch.tanh(self.lift(x)).view(x.shape[0], self.blocks, 2, 2)
        return self.head(torch.linalg.det(m))


def program():
    model = DetNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x, y):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step, {"model": model, "optimizer": optimizer}


def test_regression_with_a_det_graph_break_trains_as_in_eager():
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)) for _ in range(STEPS)]
    eager, s_eager = seeded(program)
    lazy_fn, s_lazy = seeded(program)
    lazy = lazyrt.torch.compile(lazy_fn)
    from lazyrt.torch._lower import _WARNED_BREAKS
    _WARNED_BREAKS.clear()  # the warning is once per op and process
    breaks = lazyrt.metrics.counter("GraphBreak")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k, (x, y) in enumerate(data):
            same_results(lazy(x, y), eager(x, y), f"step {k}")
            same_state(s_lazy, s_eager, f"after step {k}:")
    assert lazyrt.metrics.counter("GraphBreak") > breaks, "det runs at a graph break"
    assert any(issubclass(w.category, lazyrt.torch.GraphBreakWarning) for w in caught)
    assert lazy.captures == 1
