"""Randomized differential test of the PyTorch frontend: PyTorch eager is the oracle,
``lazyrt.torch.compile`` (and, with --dynamo, ``torch.compile(step, backend="lazyrt")``) must
agree with it. Where Dynamo's own semantics differ from eager's (torch.compile(backend="eager")
differs too), the Dynamo path is held to torch.compile(backend="eager") instead, and counted as
"dynamo_differs" when it agrees with it.

A seed makes a random PyTorch training program, built as data so that it can be shrunk and
printed:
  * a model: a stem (dense input; Conv2d + BatchNorm2d + pooling + flatten; Embedding of integer
    input; LSTM / GRU, batch_first; nn.MultiheadAttention; scaled_dot_product_attention) and a
    list of layers over a (batch, features) tensor — Linear, residual Linear, BatchNorm1d,
    LayerNorm, Dropout, activations, aten ops (some without a lowering in lazyrt, so that graph
    breaks land at random places of forward and backward: i0e, det of 2x2 blocks, bessel_j0,
    cummax, erfinv, sin, log1p, ...), views (reshape/transpose, slicing, narrow, flip) and
    in-place edits of intermediate tensors (add_, mul_, relu_, masked_fill_, an in-place edit of
    a slice), a statistic computed under torch.no_grad(); then a head and a loss (MSE, L1, smooth
    L1, Huber, cross entropy with or without label smoothing, BCE with logits);
  * an optimizer (every torch.optim one but LBFGS and SparseAdam, with its options, foreach and
    fused where they exist, one or two param groups of different lr) or a hand-written update
    (``with torch.no_grad(): p.add_(p.grad, alpha=-lr)``, lr a global or closure value that the
    program changes between calls), a learning-rate scheduler stepped between calls, gradient
    clipping, zero_grad first, last or never (set_to_none True/False, or ``p.grad = None``),
    autocast to bf16, a metric under torch.no_grad(), a loss weight that changes between calls,
    a global weight of no module applied to the output and trained by hand (``fw -= 0.1 *
    fw.grad``), a tensor and a function the step reads from a global, a dict or a namespace
    (``out + 0.5 * obj_cfg['act'](out) * obj_cfg['scale']``), the tensor there changed in place
    by the step (``obj_cfg['scale'].mul_(0.9)``), extra results that pass a value on
    (``x.clone()``, ``x * 1``, ``x + 0``, one value returned twice);
  * a list of calls: data seed, batch size (it changes between calls), train() or eval(), a new
    tensor (of the same shape, or of shape (1,)) and another function put where the step reads
    them.

The step is Python source (printed as is with a failure) executed twice: once in eager, once
through lazyrt.torch.compile, on deep copies of one model (copied before the optimizers are
made) and the same inputs. After every call the returned values, every parameter, every .grad
(None-ness too), every buffer and optimizer.state_dict() are compared (float32: rtol 1e-4,
atol 1e-5; float64: rtol 1e-7, atol 1e-9; autocast bf16: 5e-2). Off the device, a returned
tensor must not overlap in memory an input, a parameter, a gradient, a buffer, optimizer state
or an earlier result where eager's does not (class "memory").

Outcomes: "match"; "refused" (the compiled step raised lazyrt.torch.CaptureError,
UnsupportedOperatorError or lazyrt.Error with a message: counted and listed by message; the
state must then still be the eager state before that call); "invalid" (eager itself raised: the
generator made a program PyTorch rejects; counted); "noisy" (float32 differences float64 does
not show: the program matches in float64, and in float32 it matches at ten times the tolerance
or is as accurate as eager against the float64 run, or differs from eager no more than eager
does from itself when every parameter moves by some units in the last place; in a float64
program, that last rule, or a match leaving out the gradient elements that float32 shows to be
rounding noise: see _within_conditioning and _noise_of_float32; under bf16 autocast, a program
whose inputs moved by four bf16 units match, twice: a tie at a kink, see AUTOCAST_NUDGE; a
program with attention that matches
eager run with PyTorch's math attention kernel, whose formula lazyrt computes, where eager's
default CPU flash kernel rounds otherwise); "failed" (a difference, or any other
exception). A failure is shrunk — layers, calls and features dropped one at a time while a
failure of the same class persists — and printed with its seed.

Dropout cannot match eager bit for bit: a program whose model has dropout with p > 0 compares
values in eval() mode only, and runs a statistical probe through the compiled path in train
mode: the mask changes between calls, keeps its rate, kept values are scaled by 1/(1-p), and
backward uses the same mask (the gradient of dropout's input is zero exactly where its output
is).

    PYTHONPATH=build/python .venv/bin/python tests/python/frontend_fuzz.py --programs 200 --seed 0
    PYTHONPATH=build/python .venv/bin/python tests/python/frontend_fuzz.py --seed 17 --only 0,2
"""

import argparse
import copy
import gc
import math
import os
import sys
import textwrap
import types
import time
import traceback
import warnings

import numpy as np

try:
    import lazyrt  # noqa: F401
except ImportError:  # run by hand from the repository root
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build", "python"))
    import lazyrt  # noqa: F401

import torch
from torch import nn
from torch.nn import functional as F

import lazyrt.torch
from lazyrt.torch import CaptureError, GraphBreakWarning, UnsupportedOperatorError

TOL = {"float32": (1e-4, 1e-5), "float64": (1e-7, 1e-9), "autocast": (5e-2, 5e-2)}
# The modes that serve as the oracle: PyTorch eager, and torch.compile(backend="eager") where
# Dynamo's own semantics differ from eager's.
ORACLES = ("eager", "dynamo-eager", "eager-math")
# The lazyrt device's modes: its tensors traced and synced every call ("device"), or the step of
# device tensors through lazyrt.torch.compile ("device-compile").
DEVICE_MODES = ("device", "device-compile")
REFUSALS = (CaptureError, UnsupportedOperatorError, lazyrt.Error)
# Rounding-noise gradients: an element whose gradient is zero in exact arithmetic (a bias in front
# of a batch norm, attention's key bias, anything in front of a centering) gets whatever rounding
# leaves, which differs with the order of summation; Rprop takes its sign, Adam-like optimizers
# divide it by its own size, so the parameter moves by up to lr either way. Eager's gradients
# are recorded before each optimizer step; an element whose gradient was ever below this
# fraction of the largest gradient of that backward is left out of the comparison of its
# parameter and its optimizer state from then on (its gradient is still compared).
NOISE_REL = {"float32": 1e-4, "float64": 1e-11, "autocast": 5e-2}

# Every feature the generator draws; --disable turns some off after drawing (a seed keeps its
# other draws), so a feature that exposes a library bug can be left out and re-enabled later.
FEATURES = ("conv", "embed", "rnn", "attn", "bn", "ln", "dropout", "breaks", "views", "inplace",
            "nograd_stat", "autocast", "float64", "sched", "clip", "groups", "manual", "modes",
            "batch_change", "scalar_change", "metric", "foreach", "fused", "zero_grad_first", "free_weight",
            "object_reads", "echo")

# The extra results of a step with echo (see generate): values a compiled step may compute as
# nothing but an input, or as one output twice.
ECHOES = {"x_clone": ["x.clone()"], "x_times_one": ["x * 1"], "x_plus_zero": ["x + 0"],
          "twice": ["loss.detach().clone()", "loss.detach().clone()"]}

# The functions a step with object_reads applies (a library function or one of the program's),
# and where it reads the function and the tensor it scales by (see step_source).
OBJECT_ACTS = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "softsign": lambda v: v / (1 + v.abs())}
OBJECT_PLACES = {"global": ("obj_act", "obj_scale"), "dict": ("obj_cfg['act']", "obj_cfg['scale']"),
                 "attribute": ("obj_ns.act", "obj_ns.scale")}

# Ops applied to the (batch, features) tensor. "break": no lowering in lazyrt (graph break).
LOWERED_OPS = ["tanh", "sigmoid", "exp_clamped", "abs_sqrt", "softmax", "log_softmax", "cumsum",
               "clamp", "where", "center", "square", "normalize", "erf", "rsqrt", "sort", "topk_pad",
               "sin", "log1p", "expm1", "atan2", "cumprod", "frac_round", "index_cols", "index_put_acc",
               "repeat_fold", "diagonal"]
# Every plain elementwise row of lazyrt's op table, by its torch name (its lowering is generated
# from the row): see _op.
PLAIN_ROWS = {r["name"]: r["operands"] for r in lazyrt._C._debug.op_table()
              if r["api"] in ("Unary", "UnaryFloat", "Arith", "ArithFloat")}
LOWERED_OPS += ["row_" + name for name in PLAIN_ROWS]
BREAK_OPS = ["i0e", "det2x2", "bessel_j0", "cummax", "erfinv", "logit", "sinh"]
ACTS = ["relu", "gelu", "tanh", "sigmoid", "silu", "elu", "leaky_relu", "softplus", "hardswish",
        "mish", "celu", "hardtanh", "prelu"]
VIEWS = ["reshape_t", "slice_step", "narrow", "flip", "unsqueeze_sum", "cat_slice", "expand_mean"]
INPLACE = ["add_", "mul_", "relu_", "masked_fill_", "slice_mul_", "clamp_", "sub_tensor_"]
OPTIMIZERS = ["sgd", "adam", "adamw", "adagrad", "rmsprop", "adadelta", "adamax", "nadam", "radam",
              "asgd", "rprop", "manual"]
LOSSES = ["mse", "l1", "smooth_l1", "huber", "ce", "ce_smooth", "bce_logits"]
STEMS = ["dense", "conv", "embed", "lstm", "gru", "mha", "sdpa"]


# ---------------------------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------------------------


class Program:
    """A random program as data: seed, configuration (dict), layers, calls."""

    def __init__(self, seed, config, layers, calls):
        self.seed = seed
        self.config = dict(config)
        self.layers = [tuple(x) for x in layers]
        self.calls = [dict(c) for c in calls]

    def replace(self, layers=None, calls=None, **config):
        c = dict(self.config)
        c.update(config)
        return Program(self.seed, c, self.layers if layers is None else layers,
                       self.calls if calls is None else calls)

    def describe(self):
        c = self.config
        out = [f"program seed={self.seed} dtype={c['dtype']}"]
        stem = c["stem"] + "(" + ", ".join(f"{k}={v}" for k, v in c["stem_args"].items()) + ")"
        out.append(f"  model: stem={stem} features={c['width']}")
        for kind, arg, i in self.layers:
            out.append(f"    layer {i}: {kind}({arg})")
        out.append(f"    head: Linear(-> {c['out_dim']}), loss={c['loss']}")
        opt = c["opt"]
        out.append(f"  optimizer: {opt['name']}({', '.join(f'{k}={v}' for k, v in opt['kwargs'].items())})"
                   + (f", two param groups (second lr x{opt['group_lr']})" if opt.get("groups") else ""))
        if c["sched"]:
            out.append(f"  scheduler (stepped after each call): {c['sched'][0]}({c['sched'][1]})")
        out.append("  step source:")
        out.extend("    " + line for line in step_source(self).splitlines())
        for i, call in enumerate(self.calls):
            out.append(f"  call {call['index']}: " + ", ".join(f"{k}={v}" for k, v in call.items() if k != "index"))
        return "\n".join(out)

    __str__ = describe


def generate(seed, disable=()):
    """A random program from a seed (reproducible)."""
    rng = np.random.default_rng([0xF0F0, seed])
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    coin = lambda p=0.5: bool(rng.random() < p)  # noqa: E731

    c = {}
    c["dtype"] = "float64" if coin(0.35) else "float32"
    stem = pick(STEMS)
    sa = {}
    if stem == "dense":
        sa = dict(inp=int(rng.integers(3, 9)))
    elif stem == "conv":
        sa = dict(ch=int(rng.integers(1, 4)), out_ch=int(rng.integers(2, 5)), k=pick([1, 3]),
                  stride=pick([1, 2]), bn=coin(), pool=pick(["none", "max", "avg", "adaptive"]),
                  act=pick(["relu", "gelu", "tanh"]))
    elif stem == "embed":
        sa = dict(vocab=int(rng.integers(5, 12)), dim=int(rng.integers(2, 6)), seq=int(rng.integers(2, 6)),
                  padding_idx=pick([None, 0]), reduce=pick(["flatten", "mean"]))
    elif stem in ("lstm", "gru"):
        sa = dict(dim=int(rng.integers(2, 5)), hidden=int(rng.integers(2, 6)), seq=int(rng.integers(2, 5)),
                  layers=pick([1, 1, 2]), bidirectional=coin(0.3), take=pick(["last", "flatten", "h_n"]))
    elif stem == "mha":
        sa = dict(heads=pick([1, 2]), head_dim=pick([2, 3]), seq=int(rng.integers(2, 5)),
                  need_weights=coin(), bias=coin(0.8))
    elif stem == "sdpa":
        sa = dict(heads=pick([1, 2]), head_dim=pick([2, 4]), seq=int(rng.integers(2, 5)), causal=coin())
    c["stem"], c["stem_args"] = stem, sa

    layers = []
    for _ in range(int(rng.integers(1, 8))):
        kind = pick(["linear", "linear", "residual", "bn", "ln", "act", "act", "op", "op", "break", "break",
                     "view", "inplace", "dropout", "nograd_stat"])
        if kind in ("linear",):
            layers.append(("linear", int(rng.integers(3, 13))))
        elif kind == "residual":
            layers.append(("residual", pick(["relu", "tanh", "none"])))
        elif kind == "bn":
            layers.append(("bn", pick(["affine", "no_affine", "momentum_none"])))
        elif kind == "ln":
            layers.append(("ln", pick(["affine", "no_affine"])))
        elif kind == "act":
            layers.append(("act", pick(ACTS)))
        elif kind == "op":
            layers.append(("op", pick(LOWERED_OPS)))
        elif kind == "break":
            layers.append(("op", pick(BREAK_OPS)))
        elif kind == "view":
            layers.append(("view", pick(VIEWS)))
        elif kind == "inplace":
            layers.append(("inplace", pick(INPLACE)))
        elif kind == "dropout":
            layers.append(("dropout", pick([0.0, 0.0, 0.25, 0.5])))
        elif kind == "nograd_stat":
            layers.append(("nograd_stat", pick(["mean_abs", "max"])))

    layers = [(k, a, i) for i, (k, a) in enumerate(layers)]
    loss = pick(LOSSES)
    c["loss"] = loss
    c["out_dim"] = 3 if loss in ("ce", "ce_smooth") else int(rng.integers(1, 4))
    c["width"] = int(rng.integers(4, 10))  # features after the stem's projection

    name = pick(OPTIMIZERS)
    lr = float(pick([0.01, 0.05, 0.1]))
    kw = {"lr": lr}
    eps32 = c["dtype"] == "float32"
    if name == "sgd":
        kw.update(momentum=pick([0.0, 0.9]), weight_decay=pick([0.0, 1e-2]), maximize=coin(0.15))
        if kw["momentum"] and coin():
            kw["nesterov"] = True
        elif kw["momentum"] and coin(0.3):
            kw["dampening"] = 0.1
    elif name in ("adam", "adamw"):
        kw.update(lr=lr / 10, amsgrad=coin(0.3), weight_decay=pick([0.0, 0.01, 0.1]), maximize=coin(0.1),
                  betas=pick([(0.9, 0.999), (0.8, 0.99)]))
        if eps32:
            kw["eps"] = 1e-5  # see test_torch_programs.py: rounding-noise gradients and eps
    elif name == "adagrad":
        kw.update(lr_decay=pick([0.0, 0.01]), weight_decay=pick([0.0, 0.01]),
                  initial_accumulator_value=pick([0.0, 0.1]))
        if eps32:
            kw["eps"] = 1e-5
    elif name == "rmsprop":
        kw.update(lr=lr / 10, alpha=pick([0.99, 0.9]), centered=coin(), momentum=pick([0.0, 0.5]),
                  weight_decay=pick([0.0, 0.01]))
        if eps32:
            kw["eps"] = 1e-5
    elif name == "adadelta":
        kw.update(lr=1.0, rho=pick([0.9, 0.95]), weight_decay=pick([0.0, 0.01]))
        if eps32:
            kw["eps"] = 1e-4
    elif name == "adamax":
        kw.update(lr=lr / 5, weight_decay=pick([0.0, 0.01]))
        if eps32:
            kw["eps"] = 1e-5
    elif name == "nadam":
        kw.update(lr=lr / 5, momentum_decay=pick([4e-3, 1e-2]), decoupled_weight_decay=coin(),
                  weight_decay=pick([0.0, 0.01]))
        if eps32:
            kw["eps"] = 1e-5
    elif name == "radam":
        kw.update(lr=lr / 5, decoupled_weight_decay=coin(), weight_decay=pick([0.0, 0.01]))
        if eps32:
            kw["eps"] = 1e-5
    elif name == "asgd":
        kw.update(lambd=pick([1e-4, 1e-3]), t0=pick([1.0, 1e6]), weight_decay=pick([0.0, 0.01]))
    elif name == "rprop":
        kw.update(etas=pick([(0.5, 1.2), (0.4, 1.5)]), step_sizes=(1e-6, 1.0))
    opt = {"name": name, "kwargs": kw, "groups": coin(0.3), "group_lr": pick([0.5, 2.0])}
    if name != "manual" and name not in ("asgd", "rprop") and coin(0.35):
        kw["foreach"] = True
    if name in ("sgd", "adam", "adamw", "adagrad") and "foreach" not in kw and coin(0.25):
        kw["fused"] = True
    c["opt"] = opt

    n_calls = int(rng.integers(3, 7))
    c["sched"] = None
    if name != "manual" and coin(0.4):
        s = pick(["step", "exp", "cosine", "onecycle", "lambda"])
        c["sched"] = {"step": ("StepLR", dict(step_size=2, gamma=0.5)),
                      "exp": ("ExponentialLR", dict(gamma=0.8)),
                      "cosine": ("CosineAnnealingLR", dict(T_max=4)),
                      "onecycle": ("OneCycleLR", dict(max_lr=kw["lr"] * 2, total_steps=n_calls + 2,
                                                      cycle_momentum=coin() and name in ("sgd", "adam", "adamw", "rmsprop")
                                                      and (name != "sgd" or kw.get("momentum", 0) > 0)
                                                      and (name != "rmsprop" or kw.get("momentum", 0) > 0))),
                      "lambda": ("LambdaLR", dict(lr_lambda="lambda e: 1.0 / (1 + e)"))}[s]
    order = pick(["zg_last", "zg_last", "zg_first", "none"])
    c["step"] = {
        "order": order,
        "set_to_none": coin(0.7),
        "clip": pick([None, None, ("norm", pick([0.1, 1.0, 10.0])), ("value", pick([0.01, 0.1]))]),
        "autocast": coin(0.12),
        "metric": coin(0.3),
        "loss_weight": coin(0.4),
        "holder": pick(["global", "closure"]),
        "manual_zero": pick(["none", "zero_"]),
        "ret": pick(["loss", "detached", "tuple"]),
    }

    batch = int(rng.integers(3, 7))
    other_batch = int(rng.integers(2, 8))
    calls = []
    mode_switch = coin(0.3)
    change_batch = coin(0.3)
    change_scalar = coin(0.5)
    for i in range(n_calls):
        call = {"index": i, "data": int(rng.integers(1 << 30)), "batch": batch, "mode": "train"}
        if change_batch and coin(0.4):
            call["batch"] = other_batch
        if mode_switch and coin(0.4):
            call["mode"] = "eval"
        if change_scalar and i > 0 and coin(0.5):
            call["loss_w"] = float(pick([0.5, 2.0, 1.5]))
            call["lr"] = float(pick([0.02, 0.05, 0.2]))
        calls.append(call)
    # A weight of no module, a global trained by hand in the step (w -= lr * w.grad); drawn last,
    # so that the draws before it are those of programs made without it.
    c["step"]["free_weight"] = coin(0.2)
    # A tensor and a function the step reads from a place (a global, a dict item, an attribute
    # of a namespace), each put anew between calls: a new tensor of the same shape (read anew,
    # no capture), of another shape that broadcasts, another function. Drawn after the rest.
    if coin(0.3):
        c["step"]["object_reads"] = pick(["global", "dict", "attribute"])
        for call in calls[1:]:
            if coin(0.5):
                call["scale"] = int(rng.integers(1 << 30)) if coin(0.8) else -1  # -1: a (1,) tensor
            if coin(0.2):
                call["act"] = pick(list(OBJECT_ACTS))
    # Results that pass a value on (an input unchanged, one value returned twice): eager returns
    # each as a tensor of its own, which no later write of the input or of the other changes.
    # Drawn last.
    if coin(0.25):
        c["step"]["echo"] = pick(list(ECHOES))
    # The step changes the tensor it reads from a place in place (a decay kept outside any
    # module): each call reads what the last left there. Drawn last.
    if c["step"].get("object_reads") and coin(0.3):
        c["step"]["object_write"] = True
    p = Program(seed, c, layers, calls)
    return apply_disabled(p, disable)


def apply_disabled(p, disable):
    """Turns the features in `disable` off (the rest of the program stays as drawn)."""
    if not disable:
        return p
    d = set(disable)
    c = copy.deepcopy(p.config)
    layers = list(p.layers)
    if ("conv" in d and c["stem"] == "conv") or ("embed" in d and c["stem"] == "embed") or \
            ("rnn" in d and c["stem"] in ("lstm", "gru")) or ("attn" in d and c["stem"] in ("mha", "sdpa")):
        c["stem"], c["stem_args"] = "dense", dict(inp=5)
    if "bn" in d:
        layers = [x for x in layers if x[0] != "bn"]
        if c["stem"] == "conv":
            c["stem_args"]["bn"] = False
    drop_kinds = {"ln": "ln", "dropout": "dropout", "views": "view", "inplace": "inplace", "nograd_stat": "nograd_stat"}
    for f, k in drop_kinds.items():
        if f in d:
            layers = [x for x in layers if x[0] != k]
    if "breaks" in d:
        layers = [x for x in layers if not (x[0] == "op" and x[1] in BREAK_OPS)]
    if "float64" in d:
        c["dtype"] = "float32"
        if c["opt"]["name"] in ("adam", "adamw", "adagrad", "rmsprop", "adamax", "nadam", "radam"):
            c["opt"]["kwargs"].setdefault("eps", 1e-5)
    if "autocast" in d:
        c["step"]["autocast"] = False
    if "sched" in d:
        c["sched"] = None
    if "clip" in d:
        c["step"]["clip"] = None
    if "groups" in d:
        c["opt"]["groups"] = False
    if "manual" in d and c["opt"]["name"] == "manual":
        c["opt"] = {"name": "sgd", "kwargs": {"lr": 0.05}, "groups": False, "group_lr": 1.0}
    if "metric" in d:
        c["step"]["metric"] = False
    if "foreach" in d:
        c["opt"]["kwargs"].pop("foreach", None)
    if "fused" in d:
        c["opt"]["kwargs"].pop("fused", None)
    if "zero_grad_first" in d and c["step"]["order"] == "zg_first":
        c["step"]["order"] = "zg_last"
    if "free_weight" in d:
        c["step"]["free_weight"] = False
    if "object_reads" in d:
        c["step"].pop("object_reads", None)
        c["step"].pop("object_write", None)
    if "echo" in d:
        c["step"].pop("echo", None)
    calls = [dict(x) for x in p.calls]
    for call in calls:
        if "object_reads" in d:
            call.pop("scale", None)
            call.pop("act", None)
        if "modes" in d:
            call["mode"] = "train"
        if "batch_change" in d:
            call["batch"] = calls[0]["batch"]
        if "scalar_change" in d:
            call.pop("loss_w", None)
            call.pop("lr", None)
    return Program(p.seed, c, layers, calls)


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


class Stem(nn.Module):
    """The model's input stage: (batch, ...) input -> (batch, features)."""

    def __init__(self, kind, a):
        super().__init__()
        self.kind = kind
        if kind == "dense":
            self.features = a["inp"]
        elif kind == "conv":
            self.conv = nn.Conv2d(a["ch"], a["out_ch"], a["k"], stride=a["stride"], padding=a["k"] // 2)
            self.bn = nn.BatchNorm2d(a["out_ch"]) if a["bn"] else nn.Identity()
            self.act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "tanh": nn.Tanh()}[a["act"]]
            self.pool = {"none": nn.Identity(), "max": nn.MaxPool2d(2), "avg": nn.AvgPool2d(2),
                         "adaptive": nn.AdaptiveAvgPool2d(2)}[a["pool"]]
            side = (6 + 2 * (a["k"] // 2) - a["k"]) // a["stride"] + 1
            side = {"none": side, "max": side // 2, "avg": side // 2, "adaptive": 2}[a["pool"]]
            self.features = a["out_ch"] * side * side
        elif kind == "embed":
            self.emb = nn.Embedding(a["vocab"], a["dim"], padding_idx=a["padding_idx"])
            self.reduce = a["reduce"]
            self.features = a["dim"] * (a["seq"] if a["reduce"] == "flatten" else 1)
        elif kind in ("lstm", "gru"):
            cls = nn.LSTM if kind == "lstm" else nn.GRU
            self.rnn = cls(a["dim"], a["hidden"], num_layers=a["layers"], batch_first=True,
                           bidirectional=a["bidirectional"])
            dirs = 2 if a["bidirectional"] else 1
            self.take = a["take"]
            self.features = {"last": a["hidden"] * dirs, "flatten": a["hidden"] * dirs * a["seq"],
                             "h_n": a["hidden"]}[a["take"]]
        elif kind == "mha":
            e = a["heads"] * a["head_dim"]
            self.attn = nn.MultiheadAttention(e, a["heads"], batch_first=True, bias=a["bias"])
            self.need_weights = a["need_weights"]
            self.features = e * a["seq"]
        elif kind == "sdpa":
            e = a["heads"] * a["head_dim"]
            self.proj = nn.Linear(e, 3 * e)
            self.heads, self.causal = a["heads"], a["causal"]
            self.features = e * a["seq"]

    def forward(self, x):
        if self.kind == "dense":
            return x
        if self.kind == "conv":
            return self.pool(self.act(self.bn(self.conv(x)))).flatten(1)
        if self.kind == "embed":
            e = self.emb(x)
            return e.flatten(1) if self.reduce == "flatten" else e.mean(1)
        if self.kind in ("lstm", "gru"):
            out, h = self.rnn(x)
            if self.take == "last":
                return out[:, -1]
            if self.take == "flatten":
                return out.reshape(out.shape[0], -1)
            h_n = h[0] if isinstance(h, tuple) else h
            return h_n[-1]
        if self.kind == "mha":
            out, _ = self.attn(x, x, x, need_weights=self.need_weights)
            return out.reshape(out.shape[0], -1)
        b, t, e = x.shape
        q, k, v = self.proj(x).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return o.transpose(1, 2).reshape(b, t * e)


class Layer(nn.Module):
    """One layer over (batch, features); `self.features` is its output width."""

    def __init__(self, kind, arg, f):
        super().__init__()
        self.kind, self.arg = kind, arg
        self.features = f
        if kind == "linear":
            self.lin = nn.Linear(f, arg)
            self.features = arg
        elif kind == "residual":
            self.lin = nn.Linear(f, f)
        elif kind == "bn":
            self.bn = nn.BatchNorm1d(f, affine=arg != "no_affine", momentum=None if arg == "momentum_none" else 0.1)
        elif kind == "ln":
            self.ln = nn.LayerNorm(f, elementwise_affine=arg == "affine")
        elif kind == "act":
            self.act = {"relu": nn.ReLU(), "gelu": nn.GELU(approximate="tanh") if f % 2 else nn.GELU(),
                        "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid(), "silu": nn.SiLU(), "elu": nn.ELU(0.7),
                        "leaky_relu": nn.LeakyReLU(0.1), "softplus": nn.Softplus(beta=2.0),
                        "hardswish": nn.Hardswish(), "mish": nn.Mish(), "celu": nn.CELU(1.3),
                        "hardtanh": nn.Hardtanh(-0.5, 0.5), "prelu": nn.PReLU()}[arg]
        elif kind == "dropout":
            self.drop = nn.Dropout(arg)
        elif kind == "op" and arg == "det2x2":
            self.features = f + f // 4
        elif kind == "view" and arg == "slice_step":
            self.features = (f + 1) // 2
        elif kind == "view" and arg == "narrow":
            self.features = max(f - 1, 1)
        elif kind == "view" and arg == "cat_slice":
            self.features = f + f // 2
        elif kind == "op" and arg == "topk_pad":
            self.features = min(f, 2)

    def forward(self, h):
        k, a = self.kind, self.arg
        if k in ("linear",):
            return self.lin(h)
        if k == "residual":
            r = self.lin(h)
            return h + (torch.relu(r) if a == "relu" else torch.tanh(r) if a == "tanh" else r)
        if k == "bn":
            return self.bn(h)
        if k == "ln":
            return self.ln(h)
        if k == "act":
            return self.act(h)
        if k == "dropout":
            return self.drop(h)
        if k == "nograd_stat":
            with torch.no_grad():
                s = h.abs().mean() if a == "mean_abs" else h.abs().amax()
            return h / (s + 1)
        if k == "op":
            return _op(a, h)
        if k == "view":
            return _view(a, h)
        if k == "inplace":
            h = h + 0.25  # a fresh intermediate: nothing saved it for backward
            if a == "add_":
                h.add_(0.5)
            elif a == "mul_":
                h.mul_(-1.5)
            elif a == "relu_":
                h.relu_()
                h = h * 1.0
            elif a == "masked_fill_":
                h.masked_fill_(h > 0.6, 0.3)
            elif a == "slice_mul_":
                h[:, : max(h.shape[1] // 2, 1)].mul_(2.0)
            elif a == "clamp_":
                h.clamp_(-1.0, 1.0)
            elif a == "sub_tensor_":
                h.sub_(h.detach().mean(0, keepdim=True))
            return h
        raise AssertionError(k)


def _untied(h):
    """h with exact ties along dim 1 broken by a small ramp: among equal values (a cummax before,
    a constant column), which positions sort or topk pick, and so where the gradient goes, is
    the kernel's choice, which PyTorch leaves unspecified."""
    return h + torch.arange(h.shape[1], dtype=h.dtype, device=h.device) * 1e-3


def _op(a, h):
    if a == "tanh":
        return torch.tanh(h)
    if a == "sigmoid":
        return torch.sigmoid(h)
    if a == "exp_clamped":
        return torch.exp(h.clamp(-3, 3))
    if a == "abs_sqrt":
        return torch.sqrt(h.abs() + 0.1)
    if a == "softmax":
        return torch.softmax(h, dim=1)
    if a == "log_softmax":
        return F.log_softmax(h, dim=-1)
    if a == "cumsum":
        return torch.cumsum(h, dim=1) / h.shape[1]
    if a == "clamp":
        return h.clamp(min=-0.5, max=0.8)
    if a == "where":
        return torch.where(h > 0, h, 0.1 * h)
    if a == "center":
        return h - h.mean(dim=0, keepdim=True)
    if a == "square":
        return h * h * 0.5
    if a == "normalize":
        return F.normalize(h, dim=1)
    if a == "erf":
        return torch.erf(h)
    if a == "rsqrt":
        return torch.rsqrt(h * h + 1)
    if a == "sort":
        return torch.sort(_untied(h), dim=1, descending=True).values
    if a == "topk_pad":
        return torch.topk(_untied(h), min(h.shape[1], 2), dim=1).values
    if a == "index_cols":  # advanced indexing: columns gathered, some twice, one from the end
        f = h.shape[1]
        idx = torch.tensor([(3 * j + 1) % f for j in range(f)][:-1] + [-1])
        return h[:, idx]
    if a == "index_put_acc":  # index_put with accumulate: columns added into others, repeats adding up
        f = h.shape[1]
        idx = torch.tensor([j // 2 for j in range(f)])
        return h.t().index_put((idx,), h.t() * 0.5, accumulate=True).t()
    if a == "repeat_fold":  # repeat, then the copies folded back with different weights
        r = h.repeat(1, 3).reshape(h.shape[0], 3, h.shape[1])
        return (r * torch.tensor([0.5, -0.25, 1.0], device=h.device).view(1, 3, 1)).sum(1)
    if a == "diagonal":  # the diagonal of each sample's outer product, and diag_embed's sum
        outer = h.unsqueeze(2) * h.unsqueeze(1)
        return torch.diagonal(outer, 0, 1, 2) * 0.5 + torch.diag_embed(h).sum(2) * 0.5
    if a.startswith("row_"):  # on values in (0.25, 1.25), inside every plain row's domain
        x = torch.sigmoid(h) + 0.25
        fn = getattr(torch, a[4:])
        out = fn(x) if PLAIN_ROWS[a[4:]] == 1 else fn(x, x.flip(1))
        return h + 0.1 * (out if out.is_floating_point() else out.to(h.dtype))
    # BREAK_OPS (no lowering: graph breaks), then more of LOWERED_OPS
    if a == "i0e":
        return torch.special.i0e(h)
    if a == "det2x2":
        n = h.shape[1] // 4
        if n == 0:
            return h
        d = torch.linalg.det(h[:, : 4 * n].reshape(h.shape[0], n, 2, 2))
        return torch.cat([h, d], dim=1)
    if a == "bessel_j0":
        return h + 0.1 * torch.special.bessel_j0(h.detach())  # no derivative in PyTorch
    if a == "cummax":
        return torch.cummax(h, dim=1).values
    if a == "erfinv":
        return torch.erfinv(torch.tanh(h) * 0.9)
    if a == "sin":
        return torch.sin(h)
    if a == "log1p":
        return torch.log1p(h.abs())
    if a == "expm1":
        return torch.expm1(h.clamp(max=2.0))
    if a == "atan2":
        return torch.atan2(h, h.flip(1) + 2.0)
    if a == "logit":
        return torch.logit(torch.sigmoid(h) * 0.8 + 0.1)
    if a == "sinh":
        return torch.sinh(h.clamp(-2, 2))
    if a == "cumprod":
        return torch.cumprod(torch.tanh(h) * 0.5 + 1, dim=1)
    if a == "frac_round":
        return h + 0.1 * torch.round(h.detach() * 3)
    raise AssertionError(a)


def _view(a, h):
    b, f = h.shape
    if a == "reshape_t":
        for r in (2, 3):
            if f % r == 0 and f > r:
                return h.reshape(b, r, f // r).transpose(1, 2).reshape(b, f)
        return h.t().contiguous().t()
    if a == "slice_step":
        return h[:, ::2]
    if a == "narrow":
        return h.narrow(1, 1, f - 1) if f > 1 else h
    if a == "flip":
        return h.flip(1)
    if a == "unsqueeze_sum":
        return (h.unsqueeze(2) * torch.ones(1, 1, 2, dtype=h.dtype, device=h.device)).sum(2) * 0.5
    if a == "cat_slice":
        return torch.cat([h, h[:, : f // 2]], dim=1)
    if a == "expand_mean":
        return h.unsqueeze(0).expand(2, b, f).mean(0)
    raise AssertionError(a)


class FuzzNet(nn.Module):
    def __init__(self, p):
        super().__init__()
        c = p.config
        self.stem = Stem(c["stem"], c["stem_args"])
        f = self.stem.features
        self.proj = nn.Linear(f, c["width"])
        f = c["width"]
        layers = []
        for kind, arg, _ in p.layers:
            lay = Layer(kind, arg, f)
            f = lay.features
            layers.append(lay)
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(f, c["out_dim"])

    def forward(self, x):
        h = self.proj(self.stem(x))
        for lay in self.layers:
            h = lay(h)
        return self.head(h)


def has_dropout(p):
    return any(k == "dropout" and a > 0 for k, a, _ in p.layers)


def make_inputs(p, call, dtype):
    c = p.config
    rng = np.random.default_rng([p.seed, call["data"]])
    b = call["batch"]
    a = c["stem_args"]
    s = c["stem"]
    if s == "dense":
        x = torch.from_numpy(rng.standard_normal((b, a["inp"]))).to(dtype)
    elif s == "conv":
        x = torch.from_numpy(rng.standard_normal((b, a["ch"], 6, 6))).to(dtype)
    elif s == "embed":
        x = torch.from_numpy(rng.integers(0, a["vocab"], (b, a["seq"])))
    elif s in ("lstm", "gru"):
        x = torch.from_numpy(rng.standard_normal((b, a["seq"], a["dim"]))).to(dtype)
    else:
        x = torch.from_numpy(rng.standard_normal((b, a["seq"], a["heads"] * a["head_dim"]))).to(dtype)
    if c.get("nudge") and x.is_floating_point():  # (size, sample): see AUTOCAST_NUDGE
        size, sample = c["nudge"]
        x = x * (1 + size * torch.from_numpy(np.random.default_rng([p.seed, call["data"], 1, sample])
                                             .standard_normal(tuple(x.shape))).to(dtype))
    loss = c["loss"]
    if loss in ("ce", "ce_smooth"):
        y = torch.from_numpy(rng.integers(0, c["out_dim"], (b,)))
    elif loss == "bce_logits":
        y = torch.from_numpy((rng.random((b, c["out_dim"])) < 0.5).astype(np.float64)).to(dtype)
    else:
        y = torch.from_numpy(rng.standard_normal((b, c["out_dim"]))).to(dtype)
    return x, y


# ---------------------------------------------------------------------------------------------
# The step, as source
# ---------------------------------------------------------------------------------------------

LOSS_SRC = {"mse": "F.mse_loss(out, y)", "l1": "F.l1_loss(out, y)",
            "smooth_l1": "F.smooth_l1_loss(out, y, beta=0.5)", "huber": "F.huber_loss(out, y, delta=0.7)",
            "ce": "F.cross_entropy(out, y)", "ce_smooth": "F.cross_entropy(out, y, label_smoothing=0.1)",
            "bce_logits": "F.binary_cross_entropy_with_logits(out, y)"}


def step_source(p):
    c, s = p.config, p.config["step"]
    manual = c["opt"]["name"] == "manual"
    zg = f"opt.zero_grad(set_to_none={s['set_to_none']})"
    if manual:
        zg = ("for p in model.parameters():\n    p.grad = None" if s["set_to_none"] else
              "for p in model.parameters():\n    if p.grad is not None:\n        p.grad.zero_()")
    body = []
    if s["order"] == "zg_first":
        body.append(zg)
    fwd = ["out = model(x)", "loss = " + LOSS_SRC[c["loss"]]]
    if s.get("free_weight"):
        fwd.insert(1, "out = out + 0.5 * torch.tanh(out @ fw)")
    if s.get("object_reads"):
        fwd.insert(1, "out = out + 0.5 * {0}(out) * {1}".format(*OBJECT_PLACES[s["object_reads"]]))
        if s.get("object_write"):
            fwd.insert(0, "{1}.mul_(0.9)".format(*OBJECT_PLACES[s["object_reads"]]))
    if s["loss_weight"]:
        fwd[-1] += " * loss_w"
    if s["autocast"]:
        body.append("with torch.autocast('cpu', dtype=torch.bfloat16):")
        body.extend("    " + line for line in fwd)
        body.append("out = out.float()" if c["dtype"] == "float32" else "out = out.double()")
    else:
        body.extend(fwd)
    body.append("loss.backward()")
    clip = s["clip"]
    if clip and clip[0] == "norm":
        body.append(f"torch.nn.utils.clip_grad_norm_(model.parameters(), {clip[1]})")
    elif clip:
        body.append(f"torch.nn.utils.clip_grad_value_(model.parameters(), {clip[1]})")
    if manual:
        body.append("with torch.no_grad():\n    for p in model.parameters():\n"
                    "        if p.grad is not None:\n            p.add_(p.grad, alpha=-lr)")
    else:
        body.append("opt.step()")
    if s.get("free_weight"):
        body.append("with torch.no_grad():\n    fw -= 0.1 * fw.grad\nfw.grad = None")
    if s["order"] == "zg_last":
        body.append(zg)
    rets = ["loss" if s["ret"] == "loss" else "loss.detach()"]
    if s["metric"]:
        if c["loss"] in ("ce", "ce_smooth"):
            body.append("with torch.no_grad():\n    metric = (out.argmax(1) == y).float().mean()")
        else:
            body.append("with torch.no_grad():\n    metric = (out - y).abs().mean()")
        rets.append("metric")
    if s["ret"] == "tuple":
        rets.append("out.detach()")
    rets.extend(ECHOES.get(s.get("echo"), ()))
    body.append("return " + ", ".join(rets))
    if s.get("free_weight"):
        body.insert(0, "global fw")
    step = "def step(x, y):\n" + textwrap.indent("\n".join(body), "    ")
    if s["holder"] == "closure":
        return ("def make_step(model, opt, loss_w, lr):\n" + textwrap.indent(step, "    ") +
                "\n    def set_values(new_w, new_lr):\n        nonlocal loss_w, lr\n"
                "        loss_w, lr = new_w, new_lr\n    return step, set_values\n")
    return step + "\n"


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


def make_optimizer(p, model):
    o = p.config["opt"]
    if o["name"] == "manual":
        return None
    kw = dict(o["kwargs"])
    params = list(model.parameters())
    if o["groups"] and len(params) > 1:
        half = len(params) // 2
        groups = [{"params": params[:half], "lr": kw["lr"] * o["group_lr"]}, {"params": params[half:]}]
    else:
        groups = params
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
           "adagrad": torch.optim.Adagrad, "rmsprop": torch.optim.RMSprop, "adadelta": torch.optim.Adadelta,
           "adamax": torch.optim.Adamax, "nadam": torch.optim.NAdam, "radam": torch.optim.RAdam,
           "asgd": torch.optim.ASGD, "rprop": torch.optim.Rprop}[o["name"]]
    return cls(groups, **kw)


def make_scheduler(p, opt):
    if not p.config["sched"] or opt is None:
        return None
    name, kw = p.config["sched"]
    kw = dict(kw)
    if name == "LambdaLR":
        kw["lr_lambda"] = eval(kw["lr_lambda"])  # noqa: S307  (a fixed lambda of this file)
    return getattr(torch.optim.lr_scheduler, name)(opt, **kw)


class World:
    """One run of a program: eager, lazyrt.torch.compile ("lazyrt") or torch.compile ("dynamo")."""

    def __init__(self, p, model, mode):
        self.p, self.mode = p, mode
        if mode in DEVICE_MODES:  # PyTorch/XLA's way: the model on the device before its optimizer is made
            model.to(lazyrt.torch.device())
        self.model = model
        self.opt = make_optimizer(p, model)
        self.sched = make_scheduler(p, self.opt)
        s = p.config["step"]
        self.loss_w, self.lr = 1.0, 0.05
        self.g = {"torch": torch, "F": F, "model": model, "opt": self.opt, "loss_w": self.loss_w, "lr": self.lr}
        if s.get("free_weight"):  # the same values in every world of the program
            n, dtype = p.config["out_dim"], getattr(torch, p.config["dtype"])
            w = torch.randn(n, n, generator=torch.Generator().manual_seed(p.seed + 7), dtype=torch.float64) * 0.3
            w = w.to(dtype)
            if mode in DEVICE_MODES:
                w = w.to(lazyrt.torch.device())
            self.g["fw"] = w.requires_grad_()
        if s.get("object_reads"):
            self.g["obj_cfg"], self.g["obj_ns"] = {}, types.SimpleNamespace()
            self.put_objects({"scale": p.seed + 11, "act": "tanh"})
        src = step_source(p)
        exec(compile(src, f"<fuzz step seed={p.seed}>", "exec"), self.g)  # noqa: S102
        if s["holder"] == "closure":
            self.fn, self.set_values = self.g["make_step"](model, self.opt, self.loss_w, self.lr)
        else:
            self.fn, self.set_values = self.g["step"], None
        self.noise = {}  # parameter name -> elements whose eager gradient was rounding noise
        self._grads = {}
        if mode in ORACLES:
            for n, t in model.named_parameters():
                t.register_post_accumulate_grad_hook(lambda t, n=n: self._grads.__setitem__(n, t.grad.detach().clone()))
        if mode in ("lazyrt", "device-compile"):
            self.fn = lazyrt.torch.compile(self.fn)
        elif mode == "dynamo":
            self.fn = torch.compile(self.fn, backend="lazyrt")
        elif mode == "dynamo-eager":  # Dynamo alone (diagnosis: is a difference Dynamo's or lazyrt's?)
            self.fn = torch.compile(self.fn, backend=os.environ.get("FRONTEND_FUZZ_DIAG_BACKEND", "eager"))

    def put_objects(self, call):
        """Puts the tensor and the function a step with object_reads reads where it reads them:
        the same values in every world of the program (a new tensor object each time)."""
        where = self.p.config["step"].get("object_reads")
        if not where:
            return
        put = {}
        if "scale" in call:
            dtype = getattr(torch, self.p.config["dtype"])
            if call["scale"] < 0:
                t = torch.full((1,), 0.75, dtype=dtype)
            else:
                g = torch.Generator().manual_seed(call["scale"])
                t = (0.5 + torch.rand(self.p.config["out_dim"], generator=g, dtype=torch.float64)).to(dtype)
            put["scale"] = t.to(lazyrt.torch.device()) if self.mode in DEVICE_MODES else t
        if "act" in call:
            put["act"] = OBJECT_ACTS[call["act"]]
        for name, v in put.items():
            if where == "global":
                self.g["obj_" + name] = v
            elif where == "dict":
                self.g["obj_cfg"][name] = v
            else:
                setattr(self.g["obj_ns"], name, v)

    def before_call(self, call):
        self.put_objects(call)
        if "loss_w" in call:
            self.loss_w, self.lr = call["loss_w"], call["lr"]
            if self.set_values is not None:
                self.set_values(self.loss_w, self.lr)
            else:
                self.g["loss_w"], self.g["lr"] = self.loss_w, self.lr
        self.model.train(call["mode"] == "train" and not has_dropout(self.p))

    def call(self, x, y):
        self._grads = {}
        if self.mode in DEVICE_MODES:
            dev = lazyrt.torch.device()
            res = self.fn(x.to(dev), y.to(dev))
            lazyrt.torch.sync()
            return res
        if self.mode == "eager-math":  # PyTorch's math attention kernel, the formula lazyrt computes
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.MATH):
                res = self.fn(x, y)
        else:
            res = self.fn(x, y)
        if self._grads:
            top = max(float(g.abs().max()) for g in self._grads.values() if g.numel())
            thr = NOISE_REL["autocast" if self.p.config["step"]["autocast"] else self.p.config["dtype"]] * top
            for n, g in self._grads.items():
                m = g.abs() <= thr
                self.noise[n] = m | self.noise[n] if n in self.noise else m
        return res

    def after_call(self):
        if self.sched is not None:
            self.sched.step()

    def resync(self, ref):
        """Sets the elements of parameters and optimizer state that rounding-noise gradients moved
        (see NOISE_REL) to eager's values, as a user editing weights between calls would, so
        that their difference does not reach the rest of the model (a batch norm's running
        statistics, an eval() call)."""
        noise = ref.get("__noise__", {})
        if not noise:
            return
        params = list(self.model.named_parameters())
        with torch.no_grad():
            for k, (n, t) in enumerate(params):
                m = noise.get(f"param {n}")
                if m is None:
                    continue
                t[m.to(t.device)] = ref[f"param {n}"][m].to(t.device)
                st = self.opt.state.get(t, {}) if self.opt is not None else {}
                for name, v in st.items():
                    src = ref.get(f"opt state[{k}][{name}]")
                    if isinstance(v, torch.Tensor) and isinstance(src, torch.Tensor) and v.shape == m.shape:
                        v[m.to(v.device)] = src[m].to(v.device)

    def shares(self, x, y, result):
        """The pairs (returned[i], other) where the call's i-th result overlaps in memory with
        another tensor the caller holds: the inputs, the parameters, their gradients, the
        buffers, the optimizer state, an earlier result."""
        res = result if isinstance(result, tuple) else (result,)
        held = [("x", x), ("y", y)]
        for n, t in self.model.named_parameters():
            held += [(f"param {n}", t), (f"grad {n}", t.grad)]
        held += [(f"buffer {n}", t) for n, t in self.model.named_buffers()]
        if self.opt is not None:
            for k, st in self.opt.state_dict()["state"].items():  # (the tensors themselves)
                held += [(f"opt state[{k}][{name}]", v) for name, v in st.items()]
        pairs = set()
        for i, r in enumerate(res):
            if isinstance(r, torch.Tensor):
                pairs.update((f"returned[{i}]", n) for n, t in held if _overlap(r, t))
                held.append((f"returned[{i}]", r))
        return pairs

    def snapshot(self, result):
        snap = {}
        res = result if isinstance(result, tuple) else (result,)
        for i, r in enumerate(res):
            snap[f"returned[{i}]"] = r.detach().clone() if isinstance(r, torch.Tensor) else r
        for n, t in self.model.named_parameters():
            snap[f"param {n}"] = t.detach().clone()
            snap[f"grad {n}"] = None if t.grad is None else t.grad.detach().clone()
        if "fw" in self.g:  # the global weight trained by hand
            fw = self.g["fw"]
            snap["param fw (global)"] = fw.detach().clone()
            snap["grad fw (global)"] = None if fw.grad is None else fw.grad.detach().clone()
        for n, t in self.model.named_buffers():
            snap[f"buffer {n}"] = t.detach().clone()
        names = [n for n, _ in self.model.named_parameters()]
        snap["__grads__"] = dict(self._grads)  # the oracle's gradients before its optimizer step
        snap["__noise__"] = {}
        for k, n in enumerate(names):
            if n in self.noise and bool(self.noise[n].any()):
                snap["__noise__"][f"param {n}"] = self.noise[n].clone()
                snap["__noise__"][f"opt state[{k}]"] = self.noise[n].clone()
        if self.opt is not None:
            sd = self.opt.state_dict()
            for k, st in sd["state"].items():
                for name, v in st.items():
                    snap[f"opt state[{k}][{name}]"] = v.detach().clone() if isinstance(v, torch.Tensor) else v
            for gi, g in enumerate(sd["param_groups"]):
                for name, v in g.items():
                    if name != "params":
                        snap[f"opt group[{gi}][{name}]"] = v
        if self.mode in DEVICE_MODES:  # compared on the CPU
            snap = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in snap.items()}
        return snap


def _span(t):
    """The bytes a tensor's elements lie in: [first, last + 1) of its storage's addresses."""
    if t.numel() == 0:
        return None
    first = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
    extent = sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1
    return first, first + extent * t.element_size()


def _overlap(a, b):
    if not isinstance(b, torch.Tensor):
        return False
    sa, sb = _span(a), _span(b)
    return sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]


def compare(a, b, rtol, atol, floor=None):
    """None or a text naming the first difference between two snapshots (a: tested, b: eager).
    floor: for autocast, the snapshot of the same program in eager without autocast: twice the
    distance of eager's bf16 result from it is allowed on top of the tolerance."""
    noise = b.get("__noise__", {})
    a = {k: v for k, v in a.items() if not k.startswith("__")}
    b = {k: v for k, v in b.items() if not k.startswith("__")}
    if a.keys() != b.keys():
        return f"keys differ: only tested {sorted(set(a) - set(b))[:5]}, only eager {sorted(set(b) - set(a))[:5]}"
    for k in b:
        va, vb = a[k], b[k]
        if isinstance(vb, torch.Tensor) or isinstance(va, torch.Tensor):
            if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)):
                return f"{k}: tested {_short(va)} vs eager {_short(vb)}"
            if va.shape != vb.shape or va.dtype != vb.dtype:
                return f"{k}: tested {tuple(va.shape)} {va.dtype} vs eager {tuple(vb.shape)} {vb.dtype}"
            if va.dtype.is_floating_point:
                na, nb = va.double().numpy(), vb.double().numpy()
                bad = ~np.isclose(na, nb, rtol=rtol, atol=atol, equal_nan=True)
                if rtol >= 1e-2 and na.size:
                    # bf16 autocast: one rounding of bf16 (2^-8) moves single elements far, so the
                    # whole tensor is compared: |a - b| <= rtol |b| + atol sqrt(n) + 2 |b - fp32|.
                    allow = rtol * np.linalg.norm(nb.ravel()) + atol * math.sqrt(na.size)
                    fv = floor.get(k) if floor is not None else None
                    if isinstance(fv, torch.Tensor) and tuple(fv.shape) == nb.shape:
                        allow += 2 * np.linalg.norm((nb - fv.double().numpy()).ravel())
                    ok = np.linalg.norm((na - nb).ravel()) <= allow
                    bad = np.zeros_like(bad) if ok else bad | (np.abs(na - nb) == np.abs(na - nb).max())
            else:
                na, nb = va.numpy(), vb.numpy()
                bad = na != nb
            mask = noise.get(k) if k.startswith(("param", "grad")) else noise.get(k.split("][")[0] + "]")
            if mask is not None and tuple(mask.shape) == bad.shape:
                bad &= ~mask.numpy()
            if np.any(bad):
                i = np.unravel_index(np.argmax(bad), bad.shape) if na.ndim else ()
                return (f"{k} differs at {int(bad.sum())}/{max(na.size, 1)} elements, e.g. "
                        f"{tuple(int(j) for j in i)}: tested {na[i]!r} vs eager {nb[i]!r}")
        elif isinstance(vb, float) and isinstance(va, float):
            if not math.isclose(va, vb, rel_tol=rtol, abs_tol=atol):
                return f"{k}: tested {va!r} vs eager {vb!r}"
        elif va != vb:
            return f"{k}: tested {_short(va)} vs eager {_short(vb)}"
    return None


def _short(v):
    return "None" if v is None else (f"tensor{tuple(v.shape)}" if isinstance(v, torch.Tensor) else repr(v))


class Outcome:
    def __init__(self, p, kind, text="", breaks=0, warns=(), captures=0):
        self.program, self.kind, self.text = p, kind, text  # kind: match, noisy, refused, invalid, failed
        self.breaks, self.warns = breaks, list(warns)

    @property
    def failed(self):
        return self.kind == "failed"

    def klass(self):
        """The class of a failure, kept while shrinking."""
        return self.text.split(":")[0] if self.failed else self.kind


def _run_world(p, mode, model, tol, eager_snaps=None, floor=None):
    """Runs every call; returns (snapshots, error text or None, error kind)."""
    dtype = getattr(torch, p.config["dtype"])
    w = World(p, model, mode)
    snaps = []
    for i, call in enumerate(p.calls):
        x, y = make_inputs(p, call, dtype)
        w.before_call(call)
        try:
            res = w.call(x, y)
        except REFUSALS as e:
            if eager_snaps is None and mode in ORACLES:
                return snaps, f"eager raised {type(e).__name__}: {e}", "invalid"
            msg = f"call {call['index']}: {type(e).__name__}: {_first_line(str(e))}"
            if eager_snaps is not None and mode in ("lazyrt", "device-compile"):
                before = w.snapshot(())
                ref = eager_snaps[i - 1][1] if i else None
                if ref is not None:
                    ref = {k: v for k, v in ref.items() if not k.startswith("returned")}
                    d = compare(before, ref, *tol)
                    if d:
                        return snaps, f"refusal changed state: {msg}; then {d}", "failed"
            return snaps, msg, "refused"
        except Exception as e:  # noqa: BLE001
            if eager_snaps is None and mode in ORACLES:
                return snaps, f"eager raised {type(e).__name__}: {_first_line(str(e))}", "invalid"
            return snaps, (f"crash: call {call['index']}: {type(e).__name__}: {_first_line(str(e))}\n"
                           + "".join(traceback.format_exception(e)[-6:])), "failed"
        snap = w.snapshot(res)
        if mode not in DEVICE_MODES:
            snap["__shares__"] = w.shares(x, y, res)
        snaps.append((call["index"], snap))
        if eager_snaps is not None:
            d = compare(snap, eager_snaps[i][1], *tol, floor=floor[i][1] if floor and i < len(floor) else None)
            extra = sorted(snap.get("__shares__", set()) - eager_snaps[i][1].get("__shares__", set()))
            if not d and extra:
                return snaps, (f"memory: after call {call['index']}: " +
                               "; ".join(f"{a} shares memory with {b} (eager's does not)" for a, b in extra[:3])), \
                    "failed"
            if d:
                cat = "grad" if d.startswith("grad") else "state" if d.startswith(("opt", "buffer")) else "value"
                return snaps, f"{cat}: after call {call['index']}: {d}", "failed"
            w.resync(eager_snaps[i][1])
        w.after_call()
    return snaps, None, "match"


def tolerance(p):
    if p.config["step"]["autocast"]:
        return TOL["autocast"]
    return TOL[p.config["dtype"]]


def _snapshots(p, mode, perturb=None):
    """The program's snapshots after every call, run alone through `mode` (no comparison), or
    the text of what went wrong. perturb(model) edits the model before the run."""
    torch.manual_seed(p.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = FuzzNet(p).to(getattr(torch, p.config["dtype"]))
            if perturb is not None:
                perturb(model)
            snaps, err, _ = _run_world(p, mode, model, tolerance(p))
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {_first_line(str(e))}"
    return err or snaps


def _noise_of_float64(p, oracle="eager"):
    """Per call, the elements whose gradient in the float64 run of the program was ever rounding
    noise (NOISE_REL['float64']: a value zero in exact arithmetic, such as a bias right before a
    batch norm): in float32 such an element's gradient has no correct digit, and an optimizer
    that divides by its size (RMSprop, Adam) moves it by its sign, in eager as much as in
    lazyrt. None where the float64 run fails."""
    snaps = _snapshots(p.replace(dtype="float64"), oracle)
    return None if isinstance(snaps, str) else [snap["__noise__"] for _, snap in snaps]


# bf16 keeps 8 bits: under autocast, values tie exactly far more often than in float32 (three
# samples whose mean is one of them, so that a batch norm's output is 0 in exact arithmetic), and
# at a tie a kink decides (i0e's derivative jumps from 1 to -1 at 0): lazyrt's exact 0 and
# eager's 7e-7 (seed 54446) are both roundings of it, and the gradient jumps with their sign. The
# program is run again with its inputs moved by this fraction (four bf16 units; random, seeded;
# one unit often rounds back to the tie), which undoes such coincidences, AUTOCAST_NUDGE_SAMPLES
# times: a difference gone in every one of them was the tie's.
AUTOCAST_NUDGE = 2.0 ** -6
AUTOCAST_NUDGE_SAMPLES = 2

# How much larger than float32's own error of a gradient element, scaled by the ratio of the two
# dtypes' units in the last place (2^-29), float64's error of it is taken to be at most: two
# orders of summation, each with its own rounding (seed 53316: lazyrt's distance from eager up
# to 5.7x that estimate, eager's and lazyrt's each within it).
FLOAT64_FROM_FLOAT32 = 16.0


def _noise_of_float32(p, oracle="eager"):
    """For a float64 program, per call, the gradient elements whose float64 value has no digit
    that the float64 tolerance checks: a gradient zero in exact arithmetic (the parameters in
    front of a batch norm whose weight's gradient is zero) is, in float64, whatever the order of
    summation leaves, and that can exceed the absolute tolerance where the terms summed are
    large. The same program in float32 measures each element's rounding independently of any
    order of summation (the same cancellation, 2^29 times coarser): float64's error of an
    element is estimated as FLOAT64_FROM_FLOAT32 * |g32 - g64| * 2^-29, and where that exceeds
    the tolerance at the element, its gradient, its parameter and its optimizer state are left
    out from that call on (the parameter resynced to the oracle's, as NOISE_REL's elements are).
    None where either run fails."""
    rtol, atol = TOL["float64"]
    s64 = _snapshots(p, oracle)
    s32 = _snapshots(p.replace(dtype="float32"), oracle)
    if isinstance(s64, str) or isinstance(s32, str) or len(s64) != len(s32):
        return None
    out, seen = [], {}
    for (_, a), (_, b) in zip(s64, s32):
        names = [k[len("param "):] for k in a if k.startswith("param ")]
        for n, g64 in a["__grads__"].items():
            g32 = b["__grads__"].get(n)
            if g32 is None or g32.shape != g64.shape:
                continue
            est = FLOAT64_FROM_FLOAT32 * (g32.double() - g64.double()).abs() * 2.0 ** -29
            m = est > atol + rtol * g64.double().abs()
            seen[n] = m | seen[n] if n in seen else m
        masks = {}
        for n, m in seen.items():
            if bool(m.any()) and n in names:
                masks[f"param {n}"] = masks[f"grad {n}"] = m.clone()
                masks[f"opt state[{names.index(n)}]"] = m.clone()
        out.append(masks)
    return out


def _as_accurate_as_eager(p, mode, oracle="eager"):
    """None, or why the program run through `mode` in float32 is less accurate than eager float32
    against the program in float64 eager (conftest.accuracy_against_float64, after every call,
    over every floating tensor of the snapshots), each run on its own."""
    snaps = _snapshots
    return _accuracy_after_each_call(snaps(p, mode), snaps(p, oracle), snaps(p.replace(dtype="float64"), oracle))


def _accuracy_after_each_call(tested, compared, ref, floors=None, noise=False):
    """None, or the first call after which the `tested` snapshots are less accurate against
    `ref` than the `compared` ones (conftest.accuracy_against_float64 over every floating tensor;
    `floors` as there; with `noise`, elements `ref` found rounding noise take its values first).
    A run given as a text (it failed) is returned as is."""
    import conftest

    for run in (tested, compared, ref):
        if isinstance(run, str):
            return run
    for (index, t), (_, c), (_, r) in zip(tested, compared, ref):
        names = [k for k, v in r.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
                 and isinstance(t.get(k), torch.Tensor) and isinstance(c.get(k), torch.Tensor)]
        if noise:
            t, c = _noise_as_reference(t, r), _noise_as_reference(c, r)
        bad = conftest.accuracy_against_float64({k: t[k] for k in names}, {k: c[k] for k in names},
                                                {k: r[k] for k in names}, f"after call {index}: ",
                                                **({"floors": floors} if floors else {}))
        if bad:
            return bad
    return None


# The relative size of the perturbation of every parameter by which _within_conditioning measures
# how far rounding alone moves a program's results, and the accuracy rule's floors there, by
# dtype: 64 units in the last place, the rounding a different order of a reduction over some
# hundred terms leaves; far below each dtype's tolerance, so that a real error still shows.
CONDITIONING = {"float64": (2.0 ** -46, (1e-13, 1e-11)), "float32": (2.0 ** -17, (1e-7, 1e-5))}
# How many perturbed runs sample that spread: one draw of rounding noise is one sample of a
# distribution (seed 51030: lazyrt's distance 2.09x one perturbed run's, each gradient element
# as far from float64 as eager's taken together); the tested run must be within the rule
# against one of these (in effect, the farthest).
CONDITIONING_SAMPLES = 3


def _within_conditioning(p, mode, oracle="eager", perturb=None):
    """None, or why a program's difference between `mode` and the oracle is more than rounding
    explains. A float64 program has no more precise run to be held to, and a float32 program
    that amplifies rounding (batch norm of three samples, a determinant, Adam dividing a
    cancelled gradient by its size) meets the float64 run no better in eager than by chance, so
    the program's own conditioning is measured: the oracle runs again from parameters each moved
    by some units in the last place (CONDITIONING, random signs, seeded), as a different order
    of summation moves every intermediate value, CONDITIONING_SAMPLES times; `mode` must be as
    close to the oracle as one of the perturbed runs is (conftest.accuracy_against_float64 with
    the oracle as the reference).
    perturb(model) edits the tested run's model (the harness's self-test)."""
    size, floors = CONDITIONING[p.config["dtype"]]

    def nudge(sample):
        def edit(model):
            gen = torch.Generator().manual_seed(p.seed + 7919 * sample)
            with torch.no_grad():
                for t in model.parameters():
                    t.mul_(1 + size * torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype))
        return edit

    tested, ref = _snapshots(p, mode, perturb), _snapshots(p, oracle)
    why = None
    for sample in range(CONDITIONING_SAMPLES):  # within the rule of the farthest sample: of any
        why = _accuracy_after_each_call(tested, _snapshots(p, oracle, nudge(sample)), ref, floors=floors, noise=True)
        if why is None:
            return None
    return why


def _as_on_a_device(p, mode="device"):
    """The program as the device runs it, for the oracle too: torch.autocast("cpu") in the step
    does not reach device tensors (the device's torch.autocast("lazyrt") follows PyTorch's
    device policy, not the CPU's), so it is left out; and an optimizer left to choose runs its
    foreach implementation, as PyTorch picks on a device (on the CPU it picks the per-tensor
    one, and the two differ: SGD's foreach nesterov step adds the momentum into .grad itself).
    A fused one stays fused: the device runs PyTorch's fused CPU kernel (a graph break).
    Under lazyrt.torch.compile ("device-compile"), which captures foreach groups with the
    per-tensor arithmetic, ASGD and Rprop run per-tensor (foreach=False) in both: their foreach
    implementations round differently from their own per-tensor ones (6e-5 relative apart in
    float64 eager), which is why the generator never makes them foreach."""
    o = p.config["opt"]
    if o["name"] != "manual" and "foreach" not in o["kwargs"] and not o["kwargs"].get("fused"):
        per_tensor = mode == "device-compile" and o["name"] in ("asgd", "rprop")
        p = p.replace(opt=dict(o, kwargs=dict(o["kwargs"], foreach=not per_tensor)))
    if p.config["step"]["autocast"]:
        p = p.replace(step=dict(p.config["step"], autocast=False))
    return p


def _noise_as_reference(snap, ref):
    """snap with the elements the reference run found rounding noise (NOISE_REL: their gradient,
    their parameter and optimizer state) set to the reference's: zero in exact arithmetic, they
    are whatever the order of summation leaves, which moving the parameters does not reproduce."""
    noise = ref.get("__noise__", {})
    out = dict(snap)
    for k, v in snap.items():
        if not isinstance(v, torch.Tensor):
            continue
        if k.startswith(("param ", "grad ")):
            mask = noise.get("param " + k.split(" ", 1)[1])
        elif k.startswith("opt state["):
            mask = noise.get(k.split("][")[0] + "]")
        else:
            mask = None
        if mask is not None and mask.shape == v.shape and isinstance(ref.get(k), torch.Tensor):
            v = v.clone()
            v[mask] = ref[k][mask].to(v.dtype)
            out[k] = v
    return out


def run_program(p, mode="lazyrt", perturb=None, recheck=True, tol_scale=1.0, noise=None, oracle="eager"):
    """Runs the program in `oracle` (PyTorch eager; or torch.compile(backend="eager"), where
    Dynamo's own semantics differ from eager's) and through `mode`, compares after every call.
    noise: per call, more elements to leave out as rounding noise (see _noise_of_float64)."""
    if mode in DEVICE_MODES:
        p = _as_on_a_device(p, mode)
    dtype = getattr(torch, p.config["dtype"])
    torch.manual_seed(p.seed)
    try:
        base = FuzzNet(p).to(dtype)
    except Exception as e:  # noqa: BLE001
        return Outcome(p, "invalid", f"model construction raised {type(e).__name__}: {e}")
    m_eager, m_test = copy.deepcopy(base), copy.deepcopy(base)
    tol = tuple(t * tol_scale for t in tolerance(p))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if oracle.startswith("dynamo"):
                torch._dynamo.reset()
            eager, err, kind = _run_world(p, oracle, m_eager, tol)
        except Exception as e:  # noqa: BLE001
            return Outcome(p, "invalid", f"eager setup raised {type(e).__name__}: {_first_line(str(e))}")
    if err:
        return Outcome(p, "invalid", err)
    for (_, snap), extra in zip(eager, noise or ()):
        for k, m in extra.items():
            have = snap["__noise__"].get(k)
            snap["__noise__"][k] = m if have is None else have | m
    floor = None
    if p.config["step"]["autocast"]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            floor, _, _ = _run_world(p.replace(step=dict(p.config["step"], autocast=False)), oracle,
                                     copy.deepcopy(base), tol)
    if perturb is not None:
        perturb(m_test)
    breaks0 = lazyrt.metrics.counter("GraphBreak")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if mode.startswith("dynamo"):
            torch._dynamo.reset()
        try:
            _, err, kind = _run_world(p, mode, m_test, tol, eager_snaps=eager, floor=floor)
        except Exception as e:  # noqa: BLE001  (setting the world up)
            err, kind = f"crash: setup: {type(e).__name__}: {_first_line(str(e))}", "failed"
    breaks = lazyrt.metrics.counter("GraphBreak") - breaks0
    warns = sorted({f"{w.category.__name__}: {_first_line(str(w.message))[:90]}" for w in caught
                    if not issubclass(w.category, GraphBreakWarning)})
    out = Outcome(p, kind, err or "", breaks, warns)
    if (recheck and out.failed and p.config["dtype"] == "float32" and not p.config["step"]["autocast"]
            and out.klass() in ("value", "grad", "state")):
        # float32 rounding amplified (cancellation in a gradient, a learning rate divided by a
        # small second moment): the same program in float64 matches, and float32 matches at ten
        # times the tolerance (leaving out the elements whose float64 gradient is rounding noise)
        # or is as accurate as eager float32 against the float64 run (the accuracy rule).
        # Counted as "noisy", not a failure.
        # Where float64's gradient of an element is itself rounding noise, float32's sign of it
        # is a coin toss on both sides: such elements are left out too.
        p64 = p.replace(dtype="float64")
        o64 = run_program(p64, mode, perturb, recheck=False, oracle=oracle)
        if o64.kind == "match" or (perturb is None and o64.klass() in ("value", "grad", "state")
                                   and _within_conditioning(p64, mode, oracle) is None):
            loose = run_program(p, mode, perturb, recheck=False, tol_scale=10.0, noise=_noise_of_float64(p, oracle),
                                oracle=oracle)
            if loose.kind == "match" or (perturb is None and (_as_accurate_as_eager(p, mode, oracle) is None
                                                              or _within_conditioning(p, mode, oracle) is None)):
                return Outcome(p, "noisy", out.text, breaks, warns)
    if (recheck and out.failed and perturb is None and p.config["dtype"] == "float64"
            and out.klass() in ("value", "grad", "state")):
        # float64 rounding amplified by the program itself (see _within_conditioning), or
        # gradients that are rounding noise in float64 (see _noise_of_float32).
        if _within_conditioning(p, mode, oracle) is None:
            return Outcome(p, "noisy", out.text, breaks, warns)
        noise32 = _noise_of_float32(p, oracle)
        if noise32 is not None and run_program(p, mode, perturb, recheck=False, noise=noise32,
                                               oracle=oracle).kind == "match":
            return Outcome(p, "noisy", "float64 gradients that are rounding noise (float32 has no digit of them): "
                           + out.text, breaks, warns)
    if (recheck and out.failed and perturb is None and p.config["step"]["autocast"]
            and out.klass() in ("value", "grad", "state") and not p.config.get("nudge")):
        # A tie of bf16 values at a kink (see AUTOCAST_NUDGE).
        if all(run_program(p.replace(nudge=(AUTOCAST_NUDGE, k)), mode, recheck=False, oracle=oracle).kind == "match"
               for k in range(AUTOCAST_NUDGE_SAMPLES)):
            return Outcome(p, "noisy", "a tie of bf16 values at a kink (the inputs moved by 2^-6 match): " + out.text,
                           breaks, warns)
    if (recheck and out.failed and oracle == "eager" and p.config["stem"] in ("mha", "sdpa")
            and out.klass() in ("value", "grad", "state")):
        # PyTorch eager runs attention with its CPU flash kernel, whose rounding (bf16 above all)
        # differs from its math kernel's; lazyrt computes the math kernel's formula. Where eager
        # with the math kernel matches, the difference is PyTorch's choice of kernel, which the
        # program amplifies: counted as "noisy".
        if run_program(p, mode, perturb, recheck=False, oracle="eager-math").kind == "match":
            return Outcome(p, "noisy", "eager's attention kernel (eager with its math kernel matches): " + out.text,
                           breaks, warns)
    if kind == "match" and has_dropout(p) and mode == "lazyrt":
        d = dropout_probe(p)
        if d:
            out = Outcome(p, "failed", "dropout: " + d, breaks, warns)
    return out


def dropout_probe(p):
    """Statistical check of dropout through the compiled path, in train mode. None or a text."""
    rates = [a for k, a, _ in p.layers if k == "dropout" and a > 0]
    rate = rates[0]
    dtype = getattr(torch, p.config["dtype"])
    torch.manual_seed(p.seed)

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.rand(64, 32, dtype=dtype) + 0.5)
            self.drop = nn.Dropout(rate)

    probe = Probe()
    opt = torch.optim.SGD(probe.parameters(), lr=0.0)
    scale = torch.linspace(1.0, 2.0, 32, dtype=dtype)

    def step():
        opt.zero_grad(set_to_none=True)
        out = probe.drop(probe.w * 1.0)
        loss = (out * scale).sum()
        loss.backward()
        opt.step()
        return out.detach()

    compiled = lazyrt.torch.compile(step)
    masks = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(4):
            try:
                out = compiled()
            except REFUSALS:
                return None
            keep = out != 0
            n = keep.numel()
            kept = keep.double().mean().item()
            sd = math.sqrt(rate * (1 - rate) / n)
            if abs((1 - kept) - rate) > 6 * sd + 1e-9:
                return f"probe call {i}: drop rate {1 - kept:.3f}, expected {rate} (p={rate})"
            expect = probe.w.detach() / (1 - rate)
            if not torch.allclose(out[keep], expect[keep], rtol=1e-5, atol=1e-6):
                return f"probe call {i}: kept values are not w/(1-p)"
            g = probe.w.grad
            if g is None:
                return f"probe call {i}: w.grad is None after backward"
            if not torch.equal(g != 0, keep):
                return (f"probe call {i}: backward used another mask than forward: grad zero at "
                        f"{int((g == 0).sum())} places, output zero at {int((~keep).sum())}, "
                        f"{int(((g == 0) != (~keep)).sum())} disagree")
            gexp = (scale / (1 - rate)).expand_as(g)
            if not torch.allclose(g[keep], gexp[keep], rtol=1e-5, atol=1e-6):
                return f"probe call {i}: gradient of kept elements is not scale/(1-p)"
            masks.append(keep.clone())
    for i in range(1, len(masks)):
        if torch.equal(masks[i], masks[i - 1]):
            return f"probe: the mask of call {i} is the mask of call {i - 1}"
    return None


def _first_line(s):
    s = str(s).strip()
    return s.splitlines()[0] if s else s


# ---------------------------------------------------------------------------------------------
# Shrinking
# ---------------------------------------------------------------------------------------------


def simplifications(p):
    """Candidate simpler programs, one change each."""
    c = p.config
    s = c["step"]
    out = []
    for i in range(len(p.layers)):
        out.append(p.replace(layers=p.layers[:i] + p.layers[i + 1:]))
    for i in range(1, len(p.calls)):
        out.append(p.replace(calls=p.calls[:i] + p.calls[i + 1:]))
    if len(p.calls) > 1:
        out.append(p.replace(calls=p.calls[1:]))

    def step_with(**kw):
        st = dict(s)
        st.update(kw)
        return p.replace(step=st)

    if c["stem"] != "dense":
        out.append(p.replace(stem="dense", stem_args=dict(inp=5)))
    if c["sched"]:
        out.append(p.replace(sched=None))
    for k, v in (("clip", None), ("autocast", False), ("metric", False), ("loss_weight", False),
                 ("order", "zg_last"), ("set_to_none", True), ("ret", "loss"), ("holder", "global")):
        if s[k] != v:
            out.append(step_with(**{k: v}))
    o = c["opt"]
    if o["groups"]:
        out.append(p.replace(opt=dict(o, groups=False)))
    for k in list(o["kwargs"]):
        if k != "lr":
            kw = dict(o["kwargs"])
            del kw[k]
            out.append(p.replace(opt=dict(o, kwargs=kw)))
    if o["name"] != "sgd":
        out.append(p.replace(opt={"name": "sgd", "kwargs": {"lr": 0.05}, "groups": False, "group_lr": 1.0}, sched=None))
    if c["loss"] != "mse":
        out.append(p.replace(loss="mse", out_dim=2))
    if c["dtype"] != "float64":
        out.append(p.replace(dtype="float64"))
    calls = [dict(x, mode="train") for x in p.calls]
    if calls != p.calls:
        out.append(p.replace(calls=calls))
    calls = [dict(x, batch=p.calls[0]["batch"]) for x in p.calls]
    if calls != p.calls:
        out.append(p.replace(calls=calls))
    calls = [{k: v for k, v in x.items() if k not in ("loss_w", "lr")} for x in p.calls]
    if calls != p.calls:
        out.append(p.replace(calls=calls))
    return out


def shrink(p, outcome, mode="lazyrt", budget_s=180.0, perturb=None):
    """Greedy: apply one simplification at a time while a failure of the same class persists."""
    klass = outcome.klass()
    deadline = time.time() + budget_s
    best, best_out = p, outcome
    changed = True
    while changed and time.time() < deadline:
        changed = False
        for cand in simplifications(best):
            if time.time() >= deadline:
                break
            o = run_program(cand, mode, perturb)
            gc.collect()
            if o.failed and o.klass() == klass:
                best, best_out, changed = cand, o, True
                break
    return best, best_out


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def refusal_hint(p):
    """The features of a refused program that PyTorch's own code reads values for."""
    hints = []
    if any(k == "bn" and a == "momentum_none" for k, a, _ in p.layers):
        hints.append("BatchNorm momentum=None: float(num_batches_tracked)")
    if p.config["opt"]["name"] in ("asgd", "rprop"):
        hints.append(f"optimizer {p.config['opt']['name']}")
    return "; ".join(hints) or "other"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="seed of the first program (then seed+1, ...)")
    ap.add_argument("--only", default=None,
                    help="one program (--seed): comma-separated layer indices to keep, then ';' and "
                         "call indices, as printed by a shrunk failure")
    ap.add_argument("--disable", default="", help=f"features to turn off, comma-separated, of: {','.join(FEATURES)}")
    ap.add_argument("--dynamo", type=float, default=0.0,
                    help="fraction of programs also run through torch.compile(step, backend='lazyrt')")
    ap.add_argument("--mode", default="lazyrt", choices=("lazyrt",) + DEVICE_MODES,
                    help="the tested path: lazyrt.torch.compile, the lazyrt device (synced every call), "
                         "or lazyrt.torch.compile of the step on the lazyrt device")
    ap.add_argument("--device", type=float, default=0.0,
                    help="fraction of programs also run on the lazyrt device (sync() after every call)")
    ap.add_argument("--shrink-limit", type=int, default=8)
    ap.add_argument("--shrink-seconds", type=float, default=180.0)
    ap.add_argument("--print", action="store_true", help="print every program")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    disable = [x for x in args.disable.split(",") if x]
    bad = set(disable) - set(FEATURES)
    if bad:
        ap.error(f"unknown features {sorted(bad)}")

    t0 = time.time()
    counts = {"match": 0, "noisy": 0, "refused": 0, "invalid": 0, "failed": 0}
    noisy = []
    refusals, invalid, warns, failures = {}, {}, {}, []
    dyn_counts = dict.fromkeys(counts, 0)
    dev_counts = dict.fromkeys(counts, 0)
    with_breaks = 0
    seeds = [args.seed] if args.only is not None else range(args.seed, args.seed + args.programs)

    def tally(d, mode, label, mode_counts):  # a second path's outcome for the same program
        mode_counts[d.kind] = mode_counts.get(d.kind, 0) + 1
        if d.failed:
            failures.append((d, mode))
            print(f"FAIL ({label}) seed={d.program.seed}: {_first_line(d.text)}", flush=True)
        elif d.kind == "refused":
            refusals.setdefault(f"[{mode}] " + d.text.split(": ", 1)[1][:140], []).append(d.program.seed)
    for s in seeds:
        p = generate(s, disable)
        if args.only is not None:
            lay, _, cal = args.only.partition(";")
            keep_l = {int(i) for i in lay.split(",") if i.strip()}
            keep_c = {int(i) for i in cal.split(",") if i.strip()} if cal else None
            p = p.replace(layers=[x for x in p.layers if x[2] in keep_l],
                          calls=[x for x in p.calls if keep_c is None or x["index"] in keep_c])
        if args.print:
            print(p.describe())
        o = run_program(p, args.mode)
        gc.collect()
        counts[o.kind] += 1
        with_breaks += o.breaks > 0
        for w in o.warns:
            warns[w] = warns.get(w, 0) + 1
        if o.kind == "refused":
            key = o.text.split(": ", 1)[1][:110] + f" [{refusal_hint(p)}]"
            refusals.setdefault(key, []).append(s)
        elif o.kind == "noisy":
            noisy.append(f"seed {s}: {_first_line(o.text)}")
        elif o.kind == "invalid":
            invalid.setdefault(o.text[:120], []).append(s)
        elif o.failed:
            failures.append((o, args.mode))
            print(f"FAIL seed={s}{'' if args.mode == 'lazyrt' else f' ({args.mode})'}: {_first_line(o.text)}",
                  flush=True)
        if args.dynamo and (s * 0.6180339887) % 1.0 < args.dynamo and o.kind != "invalid":
            d = run_program(p, "dynamo")
            gc.collect()
            if d.failed:
                # Where Dynamo's own semantics differ from eager's (ASGD's float32 eta read with
                # .item() in eager, a tensor under Dynamo; NAdam's float32 step count in a float64
                # program), torch.compile(backend="eager") is the oracle: lazyrt's backend must
                # agree with it ("dynamo_differs"), else the failure stands.
                own = run_program(p, "dynamo", oracle="dynamo-eager")
                if not own.failed and own.kind != "invalid":
                    d = Outcome(p, "dynamo_differs", d.text)
            tally(d, "dynamo", "torch.compile backend=lazyrt", dyn_counts)
        if args.device and (s * 0.7548776662) % 1.0 < args.device and o.kind != "invalid":
            d = run_program(p, "device")
            gc.collect()
            tally(d, "device", "lazyrt device", dev_counts)
        if not args.quiet and (s - args.seed) % 50 == 49:
            print(f"... {s - args.seed + 1} programs: {counts}, {time.time() - t0:.0f} s", flush=True)

    if failures:
        print("\n==== shrunk failures ====")
    seen = set()
    order = []
    for o, mode in failures:
        k = (mode, o.klass())
        if k not in seen:
            seen.add(k)
            order.insert(len(seen) - 1, (o, mode))
        else:
            order.append((o, mode))
    for o, mode in order[:args.shrink_limit]:
        sp, so = shrink(o.program, o, mode, args.shrink_seconds)
        print(f"FAIL seed={o.program.seed} ({mode}): {_first_line(o.text)}")
        delta = {k: v for k, v in sp.config.items() if o.program.config.get(k) != v}
        print(f"  shrunk ({len(sp.layers)} layers, {len(sp.calls)} calls; rerun with --seed {sp.seed} --only "
              f"'{','.join(str(x[2]) for x in sp.layers)};{','.join(str(x['index']) for x in sp.calls)}'"
              + (f"; configuration changed by shrinking: {delta}" if delta else "") + "):")
        print(textwrap.indent(sp.describe(), "    "))
        print(textwrap.indent("-> " + so.text, "    "), flush=True)
    print(f"\nfrontend_fuzz: {len(seeds)} programs: {counts['match']} match, {counts['noisy']} noisy (rounding "
          f"the program amplifies: match in float64, and at 10x tolerance, as accurate as eager against it or "
          f"within the program's conditioning), {counts['refused']} refused, "
          f"{counts['invalid']} invalid, {counts['failed']} failed; {with_breaks} with graph breaks; "
          f"{time.time() - t0:.1f} s")
    if args.dynamo:
        print(f"torch.compile(backend='lazyrt'): {dyn_counts}")
    if args.device:
        print(f"lazyrt device: {dev_counts}")
    if refusals:
        print("refused (message: seeds):")
        for k, v in sorted(refusals.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(v):5d}  {k}  seeds {v[:8]}")
    if noisy and not args.quiet:
        print("noisy (float32 differences that float64 does not show):")
        for line in noisy[:20]:
            print("  " + line)
    if invalid and not args.quiet:
        print("invalid (eager raised):")
        for k, v in sorted(invalid.items(), key=lambda kv: -len(kv[1]))[:10]:
            print(f"  {len(v):5d}  {k}  seeds {v[:5]}")
    if warns and not args.quiet:
        print("warnings of the compiled path (not GraphBreakWarning):")
        for k, v in sorted(warns.items(), key=lambda kv: -kv[1])[:10]:
            print(f"  {v:5d}  {k}")
    if failures:
        print("failing seeds: " + " ".join(f"{o.program.seed}{'' if m == 'lazyrt' else f'({m})'}"
                                           for o, m in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
