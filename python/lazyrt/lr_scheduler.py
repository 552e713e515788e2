"""lazyrt.optim.lr_scheduler: PyTorch's learning-rate schedulers for lazyrt optimizers.

Each scheduler computes the same sequence of rates as torch.optim.lr_scheduler (the same
formulas in the same order, so the floats are equal) and writes them through
optimizer.param_groups[i]['lr']. A learning rate lives in a tensor every step reads, so a
schedule never makes a compiled step (compile_step) retrace: call scheduler.step() between
replays as between plain steps.

Two exceptions. OneCycleLR's step past its cycle (last_epoch == total_steps, which PyTorch
allows) gives a rate of 0 where PyTorch's linear annealing overshoots to a negative rate, which
lazyrt's optimizers refuse. And OneCycleLR with cycle_momentum=True (its default) also changes momentum (SGD) or
betas[0] (Adam, AdamW) every step. These are constants of the traced graph, so every step then
retraces and compiles a new graph; pass cycle_momentum=False to keep compiled steps replaying.

State: state_dict() holds every attribute but the optimizer, with PyTorch's names, so a state
saved by PyTorch's scheduler of the same kind loads here (and the other way round).
"""

import math
import types
import warnings
from bisect import bisect_right
from collections import Counter

from lazyrt.optim import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "MultiStepLR", "LinearLR", "ExponentialLR",
           "CosineAnnealingLR", "OneCycleLR"]

_EPOCH_DEPRECATION_WARNING = (
    "The epoch parameter in `scheduler.step()` is deprecated, as in PyTorch: call "
    "`scheduler.step()` without it. With an epoch, the closed form is used where the scheduler has one."
)


def _get_lr_warning(scheduler):
    if not scheduler._get_lr_called_within_step:
        warnings.warn("To get the last learning rate computed by the scheduler, please use `get_last_lr()`.",
                      UserWarning)


class LRScheduler:
    """Base class: base_lrs (each group's 'initial_lr'), last_epoch (the number of step() calls
    so far, -1 before the first, which the constructor makes), and step(), which writes the
    rates get_lr() computes into the parameter groups."""

    def __init__(self, optimizer, last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__}: {type(optimizer).__name__} is not a lazyrt optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"{type(self).__name__}: param 'initial_lr' is not specified in "
                                   f"param_groups[{i}] when resuming an optimizer (last_epoch={last_epoch})")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self):
        # The constructor's step. As PyTorch 2.x: while it runs _is_initial is True, and the
        # schedulers whose get_lr scales the groups' current rates keep them, so that resuming
        # (last_epoch >= 0) does not move the rate one step ahead of the saved one.
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def state_dict(self):
        """Every attribute but the optimizer (PyTorch's names and values)."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict):
        """Restores the attributes state_dict() saved."""
        self._check_state(state_dict)
        self.__dict__.update(state_dict)

    def _check_state(self, state_dict):
        name = f"load_state_dict of {type(self).__name__}"
        if not isinstance(state_dict, dict):
            raise TypeError(f"{name}: expected a dict, got {type(state_dict).__name__}")
        if "optimizer" in state_dict:
            raise ValueError(f"{name}: a scheduler's state does not hold its optimizer")
        groups = len(self.optimizer.param_groups)
        for key in ("base_lrs", "_last_lr"):
            if key in state_dict and len(state_dict[key]) != groups:
                raise ValueError(f"{name}: '{key}' has {len(state_dict[key])} values, the optimizer has "
                                 f"{groups} parameter groups")

    def get_last_lr(self):
        """The rates the last step() wrote, one per parameter group."""
        return self._last_lr

    def get_lr(self):
        """The rates of the step being made (chainable form: from the groups' current rates)."""
        raise NotImplementedError

    def step(self, epoch=None):
        """Advances the schedule by one step and writes the new rates into the groups. If a rate
        is refused (the optimizer checks it) or the schedule is over (OneCycleLR), it raises
        and the scheduler and the groups keep their values."""
        groups = self.optimizer.param_groups
        # get_lr may also set momentum (OneCycleLR): saved with the rates, to undo a failed step.
        saved = [{k: g[k] for k in ("lr", "momentum", "betas") if k in g} for g in groups]
        before = (self.last_epoch, self._step_count)
        self._step_count += 1
        self._get_lr_called_within_step = True
        try:
            if epoch is None:
                self.last_epoch += 1
                values = self.get_lr()
            else:
                warnings.warn(_EPOCH_DEPRECATION_WARNING, UserWarning)
                self.last_epoch = epoch
                values = self._get_closed_form_lr() if hasattr(self, "_get_closed_form_lr") else self.get_lr()
            for group, lr in zip(groups, values):
                group["lr"] = lr
        except Exception:
            self.last_epoch, self._step_count = before
            for group, old in zip(groups, saved):
                group.update(old)
            raise
        finally:
            self._get_lr_called_within_step = False
        self._last_lr = [group["lr"] for group in groups]


_LRScheduler = LRScheduler  # PyTorch 1.13's name


class LambdaLR(LRScheduler):
    """lr = initial lr * lr_lambda(epoch); lr_lambda: a function or one per group."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.optimizer = optimizer
        groups = len(optimizer.param_groups) if isinstance(optimizer, Optimizer) else 0
        if not isinstance(lr_lambda, (list, tuple)):
            self.lr_lambdas = [lr_lambda] * groups
        else:
            if len(lr_lambda) != groups:
                raise ValueError(f"LambdaLR: expected {groups} lr_lambdas (one per parameter group), "
                                 f"got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        super().__init__(optimizer, last_epoch)

    def state_dict(self):
        """As the base class; of the lambdas, only the attributes of callable objects are saved
        (functions and lambdas are not)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else fn.__dict__.copy()
                               for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict):
        self._check_state(state_dict)
        lambdas = state_dict.get("lr_lambdas", [None] * len(self.lr_lambdas))
        if len(lambdas) != len(self.lr_lambdas):
            raise ValueError(f"load_state_dict of LambdaLR: 'lr_lambdas' has {len(lambdas)} entries, "
                             f"the scheduler has {len(self.lr_lambdas)}")
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "lr_lambdas"})
        for fn, attrs in zip(self.lr_lambdas, lambdas):
            if attrs is not None:
                fn.__dict__.update(attrs)

    def get_lr(self):
        _get_lr_warning(self)
        return [base_lr * fn(self.last_epoch) for fn, base_lr in zip(self.lr_lambdas, self.base_lrs)]


class StepLR(LRScheduler):
    """Multiplies the rate by gamma every step_size epochs."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        _get_lr_warning(self)
        groups = self.optimizer.param_groups
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [group["lr"] for group in groups]
        return [group["lr"] * self.gamma for group in groups]

    def _get_closed_form_lr(self):
        return [base_lr * self.gamma ** (self.last_epoch // self.step_size) for base_lr in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiplies the rate by gamma at each milestone (a milestone listed k times: gamma**k)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        _get_lr_warning(self)
        groups = self.optimizer.param_groups
        if self.last_epoch not in self.milestones:
            return [group["lr"] for group in groups]
        return [group["lr"] * self.gamma ** self.milestones[self.last_epoch] for group in groups]

    def _get_closed_form_lr(self):
        milestones = sorted(self.milestones.elements())
        return [base_lr * self.gamma ** bisect_right(milestones, self.last_epoch) for base_lr in self.base_lrs]


class LinearLR(LRScheduler):
    """Scales the rate by a factor going linearly from start_factor to end_factor over
    total_iters epochs, then keeps it."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if start_factor > 1.0 or start_factor < 0:
            raise ValueError(f"LinearLR: start_factor must be between 0 and 1, got {start_factor}")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError(f"LinearLR: end_factor must be between 0 and 1, got {end_factor}")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        _get_lr_warning(self)
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [group["lr"] * self.start_factor for group in groups]
        if self._is_initial or self.last_epoch > self.total_iters:
            return [group["lr"] for group in groups]
        # The ratio of this epoch's factor to the last one's.
        delta = self.end_factor - self.start_factor
        ratio = 1.0 + delta / (self.total_iters * self.start_factor + (self.last_epoch - 1) * delta)
        return [group["lr"] * ratio for group in groups]

    def _get_closed_form_lr(self):
        delta = self.end_factor - self.start_factor
        return [base_lr * (self.start_factor + delta * min(self.total_iters, self.last_epoch) / self.total_iters)
                for base_lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiplies the rate by gamma every epoch."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        _get_lr_warning(self)
        groups = self.optimizer.param_groups
        if self._is_initial:  # the constructor's step (last_epoch 0, or resuming) keeps the rate
            return [group["lr"] for group in groups]
        return [group["lr"] * self.gamma for group in groups]

    def _get_closed_form_lr(self):
        return [base_lr * self.gamma ** self.last_epoch for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the initial rate to eta_min over T_max epochs (and back up over
    the next T_max, as PyTorch's recursive form does)."""

    def __init__(self, optimizer, T_max, eta_min=0, last_epoch=-1):
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        _get_lr_warning(self)
        groups = self.optimizer.param_groups
        if self._is_initial:  # the constructor's step (last_epoch 0, or resuming) keeps the rate
            return [group["lr"] for group in groups]
        if self._step_count == 1 and self.last_epoch > 0:
            # Resuming: the closed form at last_epoch.
            return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(self.last_epoch * math.pi / self.T_max)) / 2
                    for base_lr in self.base_lrs]
        if (self.last_epoch - 1 - self.T_max) % (2 * self.T_max) == 0:
            # Past the minimum: the first step back up.
            return [group["lr"] + (base_lr - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
                    for base_lr, group in zip(self.base_lrs, groups)]
        # Each step scales the distance to eta_min by the ratio of successive cosine terms.
        return [(1 + math.cos(math.pi * self.last_epoch / self.T_max)) /
                (1 + math.cos(math.pi * (self.last_epoch - 1) / self.T_max)) *
                (group["lr"] - self.eta_min) + self.eta_min
                for group in groups]

    def _get_closed_form_lr(self):
        return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base_lr in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the rate rises from max_lr/div_factor to max_lr over pct_start of
    total_steps, then falls to initial/final_div_factor ('cos' or 'linear' annealing;
    three_phase: up, down to the initial rate, then down to the minimum). With cycle_momentum,
    momentum (SGD) or betas[0] (Adam) moves inversely between max_momentum and base_momentum:
    see the module's note, every step then retraces a compiled step."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95,
                 div_factor=25.0, final_div_factor=1e4, three_phase=False, last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"OneCycleLR: {type(optimizer).__name__} is not a lazyrt optimizer")
        self.optimizer = optimizer
        # Everything is checked before a group changes.
        if total_steps is None and epochs is None and steps_per_epoch is None:
            raise ValueError("OneCycleLR: give either total_steps or both epochs and steps_per_epoch")
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"OneCycleLR: expected a positive integer total_steps, got {total_steps}")
            self.total_steps = total_steps
        else:
            if not isinstance(epochs, int) or epochs <= 0:
                raise ValueError(f"OneCycleLR: expected a positive integer epochs, got {epochs}")
            if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
                raise ValueError(f"OneCycleLR: expected a positive integer steps_per_epoch, got {steps_per_epoch}")
            self.total_steps = epochs * steps_per_epoch
        if not isinstance(pct_start, float) or pct_start < 0 or pct_start > 1:
            raise ValueError(f"OneCycleLR: expected a float between 0 and 1 for pct_start, got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        groups = optimizer.param_groups
        max_lrs = self._format_param("max_lr", max_lr)
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("OneCycleLR: the optimizer must have momentum or betas with cycle_momentum")
            max_momentums = self._format_param("max_momentum", max_momentum)
            base_momentums = self._format_param("base_momentum", base_momentum)
            if "betas" not in optimizer.defaults:
                for i, group in enumerate(groups):
                    if group["momentum"] == 0:
                        raise ValueError(
                            f"OneCycleLR: param_groups[{i}] has momentum 0 and lazyrt's SGD cannot switch "
                            "momentum on after construction; construct it with momentum > 0 or pass "
                            "cycle_momentum=False")

        end_up = float(pct_start * self.total_steps) - 1
        if three_phase:
            self._schedule_phases = [
                dict(end_step=end_up, start_lr="initial_lr", end_lr="max_lr",
                     start_momentum="max_momentum", end_momentum="base_momentum"),
                dict(end_step=float(2 * pct_start * self.total_steps) - 2, start_lr="max_lr",
                     end_lr="initial_lr", start_momentum="base_momentum", end_momentum="max_momentum"),
                dict(end_step=self.total_steps - 1, start_lr="initial_lr", end_lr="min_lr",
                     start_momentum="max_momentum", end_momentum="max_momentum"),
            ]
        else:
            self._schedule_phases = [
                dict(end_step=end_up, start_lr="initial_lr", end_lr="max_lr",
                     start_momentum="max_momentum", end_momentum="base_momentum"),
                dict(end_step=self.total_steps - 1, start_lr="max_lr", end_lr="min_lr",
                     start_momentum="base_momentum", end_momentum="max_momentum"),
            ]
        self._anneal_func_type = anneal_strategy
        if last_epoch == -1:
            for group, top in zip(groups, max_lrs):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.use_beta1 = "betas" in optimizer.defaults
            if last_epoch == -1:
                for top, base, group in zip(max_momentums, base_momentums, groups):
                    if self.use_beta1:
                        group["betas"] = (top, *group["betas"][1:])
                    else:
                        group["momentum"] = top
                    group["max_momentum"] = top
                    group["base_momentum"] = base
        super().__init__(optimizer, last_epoch)

    def _format_param(self, name, param):
        """One value per parameter group."""
        groups = len(self.optimizer.param_groups)
        if isinstance(param, (list, tuple)):
            if len(param) != groups:
                raise ValueError(f"OneCycleLR: expected {groups} values for {name} (one per parameter group), "
                                 f"got {len(param)}")
            return list(param)
        return [param] * groups

    def anneal_func(self, start, end, pct):
        """From start (pct 0) to end (pct 1), by the anneal strategy."""
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def load_state_dict(self, state_dict):
        self._check_state(state_dict)
        state = dict(state_dict)
        # The annealing is saved by name, '_anneal_func_type' (PyTorch 2.x, lazyrt); older states
        # hold PyTorch 1.x's function itself (a bound method, 'anneal_func') or lazyrt's earlier
        # '_anneal_strategy'.
        fn = state.pop("anneal_func", None)
        legacy = state.pop("_anneal_strategy", None)
        if "_anneal_func_type" not in state:
            if legacy is not None:
                state["_anneal_func_type"] = legacy
            elif fn is not None:
                fn_name = getattr(fn, "__name__", "")
                if fn_name not in ("_annealing_cos", "_annealing_linear"):
                    raise ValueError(f"load_state_dict of OneCycleLR: unknown anneal_func {fn!r}")
                state["_anneal_func_type"] = "cos" if fn_name == "_annealing_cos" else "linear"
        if state.get("_anneal_func_type", self._anneal_func_type) not in ("cos", "linear"):
            raise ValueError("load_state_dict of OneCycleLR: unknown _anneal_func_type "
                             f"{state['_anneal_func_type']!r} (expected 'cos' or 'linear')")
        super().load_state_dict(state)

    def get_lr(self):
        _get_lr_warning(self)
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise ValueError(f"OneCycleLR: tried to step {step_num + 1} times; the schedule has "
                             f"total_steps={self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start_step = 0
            for i, phase in enumerate(self._schedule_phases):
                end_step = phase["end_step"]
                if step_num <= end_step or i == len(self._schedule_phases) - 1:
                    pct = (step_num - start_step) / (end_step - start_step)
                    lr = self.anneal_func(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    # PyTorch allows one step past the cycle (last_epoch == total_steps), where
                    # linear annealing overshoots below zero; lazyrt's optimizers refuse a
                    # negative rate, so that step's rate is 0.
                    lr = max(lr, 0.0)
                    if self.cycle_momentum:
                        momentum = self.anneal_func(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
                    break
                start_step = phase["end_step"]
            lrs.append(lr)
            if self.cycle_momentum:
                if self.use_beta1:
                    group["betas"] = (momentum, *group["betas"][1:])
                else:
                    group["momentum"] = momentum
        return lrs
