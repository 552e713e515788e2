"""A graph run that throws on a bad value (a token id or a class target out of range, a bad
probability) changes nothing: a replayed training step that fails leaves every parameter and
optimizer state as it was, and the next good step gives what PyTorch gives for the good steps
alone."""
import numpy as np
import pytest
import torch

import lazyrt as lr


class Net:
    def __init__(self, nn):
        self.emb = nn.Embedding(10, 4)
        self.lin = nn.Linear(4, 3)

    def params(self):
        return list(self.emb.parameters()) + list(self.lin.parameters())


def batch(rng, bad=None):
    tokens = rng.integers(0, 10, size=6)
    targets = rng.integers(0, 3, size=6)
    probe = -rng.integers(0, 10, size=2)  # ids read after the update, as |probe|
    if bad == "token":
        tokens[4] = 12
    if bad == "target":
        targets[1] = 3
    if bad == "probe":
        probe[0] = -11
    return tokens, targets, probe


# A bad token or target fails before the update; a bad probe id only after it, where the
# parameters and the optimizer state were already computed.
@pytest.mark.parametrize("bad", ["token", "target", "probe"])
def test_a_replayed_training_step_that_fails_changes_nothing(bad, rng):
    torch.manual_seed(0)
    ref = Net(torch.nn)
    net = Net(lr.nn)
    net.emb.load_state_dict(ref.emb.state_dict())
    net.lin.load_state_dict(ref.lin.state_dict())
    ref_opt = torch.optim.Adam(ref.params(), lr=0.05)
    opt = lr.optim.Adam(net.params(), lr=0.05)

    def make_step(F, net, opt):  # one program, for lazyrt's modules and for torch's
        def step(tokens, targets, probe):
            opt.zero_grad()
            loss = F.cross_entropy(net.lin(net.emb(tokens)), targets)
            loss.backward()
            opt.step()
            return loss, net.emb(probe.abs()).sum()
        return step

    lr_step = make_step(lr.nn.functional, net, opt)
    ref_step = make_step(torch.nn.functional, ref, ref_opt)

    def compare():
        for p, q in zip(net.params(), ref.params()):
            np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)
        mine, theirs = opt.state_dict()["state"], ref_opt.state_dict()["state"]
        assert sorted(mine) == sorted(theirs)
        for i in theirs:
            assert float(mine[i]["step"]) == float(theirs[i]["step"])
            for key in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_allclose(np.asarray(mine[i][key]), theirs[i][key].numpy(), rtol=1e-5, atol=1e-7)

    step = None
    for i in range(5):
        tokens, targets, probe = batch(rng, bad if i == 2 else None)
        args = (lr.tensor(tokens), lr.tensor(targets), lr.tensor(probe))
        if step is None:
            step = lr.compile_step(lr_step, args)
        if i == 2:
            with pytest.raises(lr.Error, match="out of bounds"):
                step(*args)
        else:
            loss, probed = step(*args)
            ref_loss, ref_probed = ref_step(*(torch.tensor(a) for a in (tokens, targets, probe)))
            np.testing.assert_allclose(loss.item(), ref_loss.item(), rtol=1e-5)
            np.testing.assert_allclose(probed.item(), ref_probed.item(), rtol=1e-5, atol=1e-6)
        compare()
    assert step.traces == 1
