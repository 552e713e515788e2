"""Two optimizers created and stepped inside the compiled function on every call (a step that
builds its per-part optimizers itself, as the per-network optimizers of pytorch/examples dcgan
would be if made in the loop body): a fresh Adam for the feature layers and a fresh SGD
(momentum) for the head each call, so every call is Adam's first step and SGD's first momentum
step. Eager PyTorch is the oracle, compared after every step."""

import torch
from torch.nn import functional as F

import lazyrt.torch
from _compare import close, same_state, seeded
from test_two_optimizers import TwoPart, batches


def test_optimizers_created_inside_the_step_each_call():
    # Both optimizers made inside the step (fresh state every call, as a step that builds its
    # optimizers per call would): Adam's first step and SGD's first momentum step every call.
    def step_of(model):
        def step(x, y):
            opt_a = torch.optim.Adam(model.features.parameters(), lr=1e-2)
            opt_b = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt_a.step()
            opt_b.step()
            opt_a.zero_grad()
            opt_b.zero_grad()
            return loss
        return step

    m_eager, m_lazy = seeded(TwoPart), seeded(TwoPart)
    eager, lazy = step_of(m_eager), lazyrt.torch.compile(step_of(m_lazy))
    for k, (x, y) in enumerate(batches()):
        close(lazy(x, y), eager(x, y), f"loss at step {k}")
        same_state({"model": m_lazy}, {"model": m_eager}, f"after step {k}:")
