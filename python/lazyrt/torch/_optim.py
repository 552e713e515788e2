"""The optimizers lazyrt.torch knows: their update rules, written with the learning rate (and
the step count) as tensors, and the state a fresh optimizer creates on its first step.

PyTorch's SGD, Adam, AdamW, Adagrad, Adamax, NAdam, RAdam, RMSprop and Adadelta take the
learning rate as a Python float (a tensor learning rate is read with ``.item()``), and Adam,
AdamW, Adagrad, Adamax, NAdam and RAdam read their step count with ``.item()`` (unless
``capturable=True``, which insists on an accelerator). A graph
captured with those would hold the learning rate as a constant and could not be captured at all
(``.item()`` has no value while tracing). During a capture the module-level update functions the
optimizers' ``step()`` calls (``torch.optim.sgd.sgd``, ``torch.optim.adam.adam`` — AdamW is
Adam with decoupled weight decay —, ...) are replaced by the ones below:
the same arithmetic, with the learning rate a 0-d float64 tensor (an input of the graph, so a
scheduler changes it without a recapture) and the scalars eager computes from the step count in
Python floats computed from the step count tensor in float64. ``foreach=True`` groups take the
same per-tensor path (one graph either way; lazyrt fuses the elementwise work itself).

Everything else about ``step()`` stays the optimizer's own: which parameters have gradients,
state initialisation, ``zero_grad``. The state a fresh optimizer's first step creates
(`initial_state`) stands in for missing state, so the first step and the later ones share one
capture; RMSprop's and Adadelta's start at zeros, from which eager's first step computes what
the later steps' arithmetic computes.
"""

import contextlib
import importlib

import torch
import torch.optim

from lazyrt.torch import _discover, _patch


def _lr_as(lr, like):
    """The learning rate (a tensor while capturing, else a float) in `like`'s dtype."""
    if isinstance(lr, torch.Tensor):
        return lr.to(like.dtype)
    return lr


def _neg(x):
    return -x


def _bias_correction(beta, step):
    """1 - beta ** step over the float64 step tensor (eager: Python floats from .item())."""
    return torch.pow(beta, step).neg().add(1)


def _sgd_update(record, params, grads, momentum_buffers, *_, weight_decay, momentum, lr, dampening,
                nesterov, maximize, foreach=False, **_ignored):
    # Eager's for-each nesterov step adds the momentum into the gradients themselves (they are
    # its working list unless maximize or weight decay made a copy): the step leaves them so.
    grads_changed = foreach and nesterov and momentum != 0 and not maximize and weight_decay == 0
    for i, param in enumerate(params):
        record(param)
        d_p = grads[i] if not maximize else _neg(grads[i])
        if weight_decay != 0:
            d_p = d_p.add(param, alpha=weight_decay)
        if momentum != 0:
            buf = momentum_buffers[i]
            if buf is None:  # the first step: the buffer starts as the gradient itself
                buf = torch.clone(d_p).detach()
                momentum_buffers[i] = buf
            else:
                buf.mul_(momentum).add_(d_p, alpha=1 - dampening)
            d_p = d_p.add(buf, alpha=momentum) if nesterov else buf
            if grads_changed:
                grads[i].copy_(d_p)
        # param -= lr * d_p, the product rounded to the parameter's dtype as eager's alpha is.
        param.add_(d_p * _lr_as(_neg(lr), param))


def _decay(param, grad, lr, weight_decay, decoupled):
    """Weight decay as eager applies it: decoupled (AdamW, and NAdam/RAdam with
    ``decoupled_weight_decay``) scales the weights by 1 - lr * wd (float64, as eager's Python
    float); otherwise an L2 penalty through the gradient. Returns the gradient to use."""
    if weight_decay == 0:
        return grad
    if decoupled:
        factor = 1 - lr * weight_decay
        param.mul_(factor.to(param.dtype) if isinstance(factor, torch.Tensor) else factor)
        return grad
    return grad.add(param, alpha=weight_decay)


def _adam_update(record, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *_, amsgrad, beta1,
                 beta2, lr, weight_decay, eps, maximize, decoupled_weight_decay=False, **_ignored):
    for i, param in enumerate(params):
        record(param)
        grad = grads[i] if not maximize else _neg(grads[i])
        exp_avg, exp_avg_sq, step_t = exp_avgs[i], exp_avg_sqs[i], state_steps[i]
        step_t.add_(1)
        grad = _decay(param, grad, lr, weight_decay, decoupled_weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        # Bias corrections from the step count, in float64 (eager: Python floats from .item()).
        step = step_t.to(torch.float64)
        step_size = lr / _bias_correction(beta1, step)
        correction2_sqrt = _bias_correction(beta2, step).sqrt()
        if amsgrad:
            max_sq = max_exp_avg_sqs[i]
            max_sq.copy_(torch.maximum(max_sq, exp_avg_sq))
            second = max_sq
        else:
            second = exp_avg_sq
        denom = (second.sqrt() / correction2_sqrt.to(param.dtype)).add_(eps)
        # param += (-step_size * exp_avg) / denom, in the order of eager's addcdiv.
        param.add_(exp_avg * step_size.neg().to(param.dtype) / denom)


def _adagrad_update(record, params, grads, state_sums, state_steps, *_, lr, weight_decay, lr_decay, eps, maximize,
                    **_ignored):
    for param, grad, state_sum, step_t in zip(params, grads, state_sums, state_steps):
        record(param)
        step_t.add_(1)
        grad = grad if not maximize else _neg(grad)
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        # clr = lr / (1 + (step - 1) * lr_decay), in float64 (eager: Python floats from .item()).
        clr = lr / (step_t.to(torch.float64).sub(1).mul(lr_decay).add(1))
        state_sum.addcmul_(grad, grad, value=1)
        std = state_sum.sqrt().add_(eps)
        # param += (-clr * grad) / std, in the order of eager's addcdiv.
        param.add_(grad * clr.neg().to(param.dtype) / std)


def _adamax_update(record, params, grads, exp_avgs, exp_infs, state_steps, *_, eps, beta1, beta2, lr, weight_decay,
                   maximize=False, **_ignored):
    for i, param in enumerate(params):
        record(param)
        grad = grads[i] if not maximize else _neg(grads[i])
        exp_avg, exp_inf, step_t = exp_avgs[i], exp_infs[i], state_steps[i]
        step_t.add_(1)
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        # Eager: the larger of exp_inf * beta2 and |grad| + eps, written into exp_inf.
        exp_inf.copy_(torch.maximum(exp_inf.mul(beta2), grad.abs().add(eps)))
        clr = lr / _bias_correction(beta1, step_t.to(torch.float64))
        param.add_(exp_avg * clr.neg().to(param.dtype) / exp_inf)


def _nadam_update(record, params, grads, exp_avgs, exp_avg_sqs, mu_products, state_steps, *_, beta1, beta2, lr,
                  weight_decay, momentum_decay, eps, decoupled_weight_decay=False, maximize=False, **_ignored):
    for i, param in enumerate(params):
        record(param)
        grad = grads[i] if not maximize else _neg(grads[i])
        exp_avg, exp_avg_sq, mu_product = exp_avgs[i], exp_avg_sqs[i], mu_products[i]
        step_t = state_steps[i]
        step_t.add_(1)
        step = step_t.to(torch.float64)  # eager: Python floats from .item()
        bias_correction2 = _bias_correction(beta2, step)
        grad = _decay(param, grad, lr, weight_decay, decoupled_weight_decay)
        mu = torch.pow(0.96, step * momentum_decay).mul(-0.5).add(1).mul(beta1)
        mu_next = torch.pow(0.96, (step + 1) * momentum_decay).mul(-0.5).add(1).mul(beta1)
        # mu_product is a float32 tensor in eager too: its product rounds there; the next one is
        # eager's Python float (the float32 value times mu_next in float64).
        mu_product.mul_(mu.to(mu_product.dtype))
        mu_product_next = mu_product.to(torch.float64) * mu_next
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = exp_avg_sq.div(bias_correction2.to(param.dtype)).sqrt().add_(eps)
        # The two addcdivs, their values in float64 as eager's Python floats.
        value = -lr * mu.neg().add(1) / mu_product.to(torch.float64).neg().add(1)
        param.add_(grad * value.to(param.dtype) / denom)
        value_next = -lr * mu_next / mu_product_next.neg().add(1)
        param.add_(exp_avg * value_next.to(param.dtype) / denom)


def _radam_update(record, params, grads, exp_avgs, exp_avg_sqs, state_steps, *_, beta1, beta2, lr, weight_decay, eps,
                  decoupled_weight_decay=False, maximize=False, **_ignored):
    rho_inf = 2 / (1 - beta2) - 1
    for i, param in enumerate(params):
        record(param)
        grad = grads[i] if not maximize else _neg(grads[i])
        exp_avg, exp_avg_sq, step_t = exp_avgs[i], exp_avg_sqs[i], state_steps[i]
        step_t.add_(1)
        step = step_t.to(torch.float64)  # eager: Python floats from .item()
        grad = _decay(param, grad, lr, weight_decay, decoupled_weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = _bias_correction(beta1, step)
        bias_correction2 = _bias_correction(beta2, step)
        bias_corrected_exp_avg = exp_avg / bias_correction1.to(param.dtype)
        rho_t = rho_inf - 2 * step * torch.pow(beta2, step) / bias_correction2
        # Eager branches on rho_t > 5 in Python; here both are computed and one is taken (the
        # other's square root of a negative number is never used).
        rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)).sqrt()
        adaptive_lr = bias_correction2.sqrt().to(param.dtype) / exp_avg_sq.sqrt().add_(eps)
        lr_p = _lr_as(lr, param)
        rectified = bias_corrected_exp_avg * lr_p * adaptive_lr * rect.to(param.dtype)
        param.sub_(torch.where(rho_t > 5.0, rectified, bias_corrected_exp_avg * lr_p))


def _rmsprop_update(record, params, grads, square_avgs, grad_avgs, momentum_buffer_list, state_steps, *_, lr, alpha,
                    eps, weight_decay, momentum, centered, maximize=False, **_ignored):
    for i, param in enumerate(params):
        record(param)
        state_steps[i].add_(1)  # a count the update never reads
        grad = grads[i] if not maximize else _neg(grads[i])
        square_avg = square_avgs[i]
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if centered:
            grad_avg = grad_avgs[i]
            grad_avg.lerp_(grad, 1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        else:
            avg = square_avg.sqrt()
        avg = avg.add_(eps)
        if momentum > 0:
            buf = momentum_buffer_list[i]
            buf.mul_(momentum).addcdiv_(grad, avg)
            # param -= lr * buf, the product rounded to the parameter's dtype as eager's alpha is.
            param.add_(buf * _lr_as(_neg(lr), param))
        else:
            # param += (-lr * grad) / avg, in the order of eager's addcdiv.
            param.add_(grad * _lr_as(_neg(lr), param) / avg)


def _adadelta_update(record, params, grads, square_avgs, acc_deltas, state_steps, *_, lr, rho, eps, weight_decay,
                     maximize=False, **_ignored):
    for param, grad, square_avg, acc_delta, step_t in zip(params, grads, square_avgs, acc_deltas, state_steps):
        record(param)
        step_t.add_(1)  # a count the update never reads
        grad = grad if not maximize else _neg(grad)
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = square_avg.add(eps).sqrt_()
        delta = acc_delta.add(eps).sqrt_()
        delta.div_(std).mul_(grad)
        acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        # param -= lr * delta, the product rounded to the parameter's dtype as eager's alpha is.
        param.add_(delta * _lr_as(_neg(lr), param))


def _asgd_update(record, params, grads, axs, mus, etas, state_steps, *_, lambd, lr, t0, alpha, weight_decay,
                 maximize=False, **_ignored):
    for i, param in enumerate(params):
        record(param)
        grad = grads[i] if not maximize else _neg(grads[i])
        mu, ax, eta, step_t = mus[i], axs[i], etas[i], state_steps[i]
        step_t.add_(1)
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        eta_value = eta.to(torch.float64)  # eager: a Python float from .item()
        param.mul_((1 - lambd * eta_value).to(param.dtype))
        # param -= eta * grad, the product rounded to the parameter's dtype as eager's alpha is.
        param.add_(grad * _neg(eta_value).to(param.dtype))
        # Eager copies the parameter when mu is 1 and averages otherwise (a branch on .item()).
        ax.copy_(torch.where(mu == 1, param, ax + (param - ax) * mu))
        # The next eta and mu, in double as eager's Python floats, rounded into the state.
        step = step_t.to(torch.float64)
        rate = lr.to(torch.float64) if isinstance(lr, torch.Tensor) else lr
        eta.copy_(rate / (1 + lambd * rate * step) ** alpha)
        mu.copy_(1 / torch.clamp(step - t0, min=1))


# class -> (module whose update function step() calls, that function's name, our replacement)
# (torch.optim deletes the submodule names from its namespace: import them by name.)
_UPDATES = {
    torch.optim.SGD: (importlib.import_module("torch.optim.sgd"), "sgd", _sgd_update),
    torch.optim.Adam: (importlib.import_module("torch.optim.adam"), "adam", _adam_update),
    torch.optim.AdamW: (importlib.import_module("torch.optim.adam"), "adam", _adam_update),
    torch.optim.Adagrad: (importlib.import_module("torch.optim.adagrad"), "adagrad", _adagrad_update),
    torch.optim.Adamax: (importlib.import_module("torch.optim.adamax"), "adamax", _adamax_update),
    torch.optim.NAdam: (importlib.import_module("torch.optim.nadam"), "nadam", _nadam_update),
    torch.optim.RAdam: (importlib.import_module("torch.optim.radam"), "radam", _radam_update),
    torch.optim.RMSprop: (importlib.import_module("torch.optim.rmsprop"), "rmsprop", _rmsprop_update),
    torch.optim.Adadelta: (importlib.import_module("torch.optim.adadelta"), "adadelta", _adadelta_update),
    torch.optim.ASGD: (importlib.import_module("torch.optim.asgd"), "asgd", _asgd_update),
}

# Group options none of the replacements handles: such an optimizer runs its own code.
_UNSUPPORTED_OPTIONS = ("differentiable",)
# Group options that choose how eager computes the update, not what: captures compute it with
# the replacement whatever they say.
IMPLEMENTATION_OPTIONS = ("foreach", "fused", "capturable")

# Group keys that do not change what a step computes (the learning rate is an input of the graph;
# initial_lr is the schedulers' note of where they started).
NOT_HYPERPARAMETERS = ("params", "lr", "initial_lr")


def lr_is_input(optimizer):
    """Whether captures of `optimizer` read its learning rates as graph inputs (the optimizers of
    `_UPDATES`, with their update functions replaced); otherwise the rates are constants of the
    graph."""
    if type(optimizer) not in _UPDATES:
        return False
    return all(not group.get(opt, False) for group in optimizer.param_groups for opt in _UNSUPPORTED_OPTIONS)


def initial_state(optimizer, group, param, device=None):
    """The state `optimizer`'s first step on `param` creates (fresh tensors, on `device` if given:
    'meta' for just their shapes), or None where the graph of later steps cannot stand in for
    the first step (then the first step is captured as it is)."""
    if not lr_is_input(optimizer):
        return None
    kind = type(optimizer)
    if kind is torch.optim.SGD:
        if group["momentum"] == 0 or group["dampening"] != 0:
            # Without momentum SGD keeps no state; with dampening the first step sets the buffer
            # to the gradient and later steps add (1 - dampening) of it: no stand-in either way.
            return None
        # With dampening 0, momentum * 0 + gradient is the gradient exactly.
        return {"momentum_buffer": torch.zeros_like(param, memory_format=torch.preserve_format, device=device)}
    zeros = lambda: torch.zeros_like(param, memory_format=torch.preserve_format, device=device)  # noqa: E731
    if kind is torch.optim.Adagrad:  # made by the constructor; again here for parameters added since
        return {"step": torch.tensor(0.0, device=device),
                "sum": torch.full_like(param, group["initial_accumulator_value"],
                                       memory_format=torch.preserve_format, device=device)}
    if kind is torch.optim.Adamax:
        return {"step": torch.tensor(0.0, device=device), "exp_avg": zeros(), "exp_inf": zeros()}
    if kind is torch.optim.NAdam:
        return {"step": torch.tensor(0.0, device=device), "mu_product": torch.tensor(1.0, device=device),
                "exp_avg": zeros(), "exp_avg_sq": zeros()}
    if kind is torch.optim.RAdam:
        return {"step": torch.tensor(0.0, device=device), "exp_avg": zeros(), "exp_avg_sq": zeros()}
    if kind is torch.optim.RMSprop:
        state = {"step": torch.tensor(0.0, device=device), "square_avg": zeros()}
        if group["momentum"] > 0:
            state["momentum_buffer"] = zeros()
        if group["centered"]:
            state["grad_avg"] = zeros()
        return state
    if kind is torch.optim.Adadelta:
        return {"step": torch.tensor(0.0, device=device), "square_avg": zeros(), "acc_delta": zeros()}
    if kind is torch.optim.ASGD:
        return {"step": torch.tensor(0.0, device=device), "eta": torch.tensor(float(group["lr"]), device=device),
                "mu": torch.tensor(1.0, device=device), "ax": zeros()}
    state = {"step": torch.tensor(0.0, device=device), "exp_avg": zeros(), "exp_avg_sq": zeros()}
    if group["amsgrad"]:
        state["max_exp_avg_sq"] = zeros()
    return state


def _refuse_lbfgs_step(self, closure=None):
    """LBFGS's step() while a step is captured: stops the capture before it runs (see
    patched_updates); the step runs in eager instead."""
    from lazyrt.torch._capture import EagerOnly
    raise EagerOnly(
        f"lazyrt.torch: {type(self).__name__}'s step() cannot be captured: it reads the loss, the gradient's size "
        "and its convergence tests as Python numbers (float(), .item()) to decide how many evaluations and line "
        "search steps to run, which one captured graph cannot decide anew on each call; the step runs in PyTorch "
        "eager (torch.compile(step, backend=\"lazyrt\") compiles it, breaking the graph at those reads)")


@contextlib.contextmanager
def patched_updates(optimizers, record, foreach=frozenset()):
    """Within: the update functions of the given optimizers' classes are ours; `record(param)` is
    called for every parameter an update touches (the parameters the step really updated).
    ``torch.optim.LBFGS.step`` raises EagerOnly: its first act reads the closure's loss with
    ``float()``, and what it does next depends on values, so no capture can replay it."""
    patched = set()
    with contextlib.ExitStack() as stack:
        def patch(o):
            entry = _UPDATES.get(type(o))
            if entry is None or not lr_is_input(o) or entry in patched:
                return
            module, name, update = entry
            patched.add(entry)

            def replaced(*a, _u=update, **k):
                # `foreach`: what the group asked for (the capture turns the option off in the
                # group, see IMPLEMENTATION_OPTIONS): eager's for-each steps have side effects.
                k["foreach"] = bool(k.get("foreach")) or bool(a and a[0] and id(a[0][0]) in foreach)
                return _u(record, *a, **k)
            stack.enter_context(_patch.patch(module, name, replaced))

        init = torch.optim.Optimizer.__dict__["__init__"]

        def made_in_step(self, *args, **kwargs):
            # An optimizer the step makes (its state fresh every call): the capture's own, its
            # update ours too.
            init(self, *args, **kwargs)
            _discover.own(self)
            patch(self)
        for o in optimizers:
            patch(o)
        stack.enter_context(_patch.patch(torch.optim.LBFGS, "step", _refuse_lbfgs_step))
        stack.enter_context(_patch.patch(torch.optim.Optimizer, "__init__", made_in_step))
        yield
