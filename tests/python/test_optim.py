"""lazyrt.optim against torch.optim: PyTorch's keywords and update formulas, found_inf,
hyperparameter changes through param_groups, closures."""

import numpy as np
import pytest
import torch

import lazyrt as lr
from conftest import pair

CONFIGS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.5, nesterov=True)),
    ("Adam", dict()),
    ("Adam", dict(lr=0.01, betas=(0.5, 0.9), eps=1e-6, weight_decay=0.1)),
    ("AdamW", dict()),
    ("AdamW", dict(lr=0.02, betas=[0.8, 0.95], weight_decay=0.3)),
]


@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=str)
def test_steps_match_torch(name, kwargs, rng):
    p, tp = pair(rng, (3, 4), lr.float32, -1, 1, requires_grad=True)
    q, tq = pair(rng, (4,), lr.float32, -1, 1, requires_grad=True)
    opt = getattr(lr.optim, name)([p, q], **kwargs)
    topt = getattr(torch.optim, name)([tp, tq], **kwargs)
    for step in range(5):
        g, tg = pair(rng, (3, 4), lr.float32, -1, 1)
        ((p * g).sum() + (q * q).sum()).backward()
        ((tp * tg).sum() + (tq * tq).sum()).backward()
        opt.step()
        topt.step()
        opt.zero_grad()
        topt.zero_grad()
        lr.mark_step()
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
        np.testing.assert_allclose(q.numpy(), tq.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert opt.step_count.item() == 5


def test_found_inf_skips_the_whole_update():
    p = lr.tensor([1.0, 2.0], requires_grad=True)
    opt = lr.optim.AdamW([p], lr=0.1)
    (p * p).sum().backward()
    opt.step(found_inf=lr.tensor([1.0]))
    lr.mark_step()
    assert p.tolist() == [1.0, 2.0] and opt.step_count.item() == 0
    opt.step(found_inf=lr.tensor(0.0))
    lr.mark_step()
    assert p.tolist() != [1.0, 2.0] and opt.step_count.item() == 1


def test_hyperparameters_change_through_param_groups():
    p, tp = lr.tensor([1.0, -1.0], requires_grad=True), torch.tensor([1.0, -1.0], requires_grad=True)
    opt, topt = lr.optim.SGD([p], lr=0.1, momentum=0.9), torch.optim.SGD([tp], lr=0.1, momentum=0.9)
    for new_lr in [0.1, 0.01, 0.5]:
        opt.param_groups[0]["lr"] = new_lr
        topt.param_groups[0]["lr"] = new_lr
        (p * p).sum().backward()
        (tp * tp).sum().backward()
        opt.step()
        topt.step()
        opt.zero_grad()
        topt.zero_grad()
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-6)
    assert opt._impl.lr == 0.5


def test_param_group_dicts_closures_and_state():
    p = lr.tensor([3.0], requires_grad=True)
    opt = lr.optim.Adam([{"params": [p], "lr": 0.5}])
    # As torch: defaults are the constructor's keywords; the group overrides them.
    assert opt.param_groups[0]["lr"] == 0.5 and opt.defaults["lr"] == 1e-3

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 9.0
    assert p.item() < 3.0
    state = opt.state_tensors()
    assert len(state) == 3 and state[0].item() == 1.0  # step count, exp_avg, exp_avg_sq
    assert "Adam(lr=0.5" in repr(opt)


def test_optimizer_errors():
    with pytest.raises(lr.Error, match="leaf"):
        lr.optim.SGD([lr.tensor([1.0]) * 2], lr=0.1)
    with pytest.raises(ValueError):
        lr.optim.SGD([], lr=0.1)
    with pytest.raises(lr.Error):
        lr.optim.Adam([lr.tensor([1.0], requires_grad=True)], betas=(1.5, 0.9))
    with pytest.raises(lr.Error):
        lr.optim.SGD([lr.tensor([1.0], requires_grad=True)], lr=0.1, nesterov=True)
