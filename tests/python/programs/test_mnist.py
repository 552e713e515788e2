"""pytorch/examples mnist, ported: the example's Net (two 3x3 convolutions with 32 and 64
channels, ReLU, 2x2 max pooling, dropout 0.25, a 128-unit hidden layer, dropout 0.5,
log_softmax) trained by its train() loop body (zero_grad, nll_loss, backward, step) with
Adadelta (lr 1.0) and StepLR(step_size=1, gamma=0.7) stepped after every epoch; the test()
pass runs eagerly in eval mode between epochs. The first dropout is nn.Dropout2d, as in the
example's earlier revisions (channel dropout), in one case and nn.Dropout, as now, in the other.

Batches are 4 random 28x28 "digits" per step, 2 steps per epoch, 2 epochs. Dropout masks:
drawn by lazyrt, replayed in the eager oracle (see _compare)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.lr_scheduler import StepLR

import lazyrt.torch
from _compare import (close, kept_fraction_ok, observe_dropouts, replay_masks, same_state, seen, seeded)

EPOCHS, BATCHES, BATCH = 2, 2, 4


class Net(nn.Module):
    def __init__(self, first_dropout=nn.Dropout):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = first_dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def program(first_dropout):
    model = Net(first_dropout)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)

    def train_step(data, target):  # the example's train() loop body
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        return loss, seen(model)

    return train_step, {"model": model, "optimizer": optimizer, "scheduler": scheduler}


def test_pass(model, data, target):
    model.eval()
    with torch.no_grad():
        output = model(data)
        return F.nll_loss(output, target, reduction="sum").item(), output.argmax(dim=1)


test_pass.__test__ = False


@pytest.mark.parametrize("first_dropout", [nn.Dropout, nn.Dropout2d], ids=["dropout", "dropout2d"])
def test_mnist_trains_as_in_eager(first_dropout):
    g = torch.Generator().manual_seed(5)
    loader = [(torch.rand(BATCH, 1, 28, 28, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
              for _ in range(BATCHES)]
    held_out = (torch.rand(BATCH, 1, 28, 28, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
    eager, s_eager = seeded(lambda: program(first_dropout))
    lazy_fn, s_lazy = seeded(lambda: program(first_dropout))
    observe_dropouts(s_lazy["model"], s_eager["model"])
    lazy = lazyrt.torch.compile(lazy_fn)
    kept = []
    for epoch in range(1, EPOCHS + 1):
        for s in (s_eager, s_lazy):
            s["model"].train()
        for batch_idx, (data, target) in enumerate(loader):
            what = f"epoch {epoch} batch {batch_idx}"
            loss, dropped = lazy(data, target)
            replay_masks(s_eager["model"], dropped, kept)
            want, _ = eager(data, target)
            close(loss, want, f"{what} loss")
            same_state(s_lazy, s_eager, f"{what}:")
        (l_lazy, p_lazy), (l_eager, p_eager) = test_pass(s_lazy["model"], *held_out), test_pass(s_eager["model"], *held_out)
        close(l_lazy, l_eager, f"epoch {epoch} test loss")
        assert torch.equal(p_lazy, p_eager)
        for s in (s_eager, s_lazy):
            s["scheduler"].step()
        same_state(s_lazy, s_eager, f"after epoch {epoch}:")
    kept_fraction_ok(kept)
    assert lazy.captures == 1, "StepLR changes the learning rate only, a graph input"
