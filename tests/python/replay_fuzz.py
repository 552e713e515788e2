"""Randomized differential test of cached-graph replay against the plain traced program.

A seed makes a random user program: a model from a small zoo, a loss, an optimizer, a step
function (forward, loss, backward, optimizer step, zero_grad somewhere or nowhere, optionally a
fori_loop / while_loop over detached values), and a list of actions a user might take: trace the
step (compile_step, or the low-level graph_hash / warm_up_cache / graph_inputs sequence), call
it (replayed, or directly), mark_step, read values, edit parameters in place, load_state_dict,
change the learning rate or another hyperparameter, train()/eval(), replace a parameter, zero or
set gradients, rebuild the optimizer or the whole model, change a Python number the step reads
(its loss weight, an attribute of the program's object), call with another batch size or with
arguments that require grad (leaf or non-leaf).

The program runs twice in this process, one world after the other:
  "replay": trace actions trace, call actions go through compile_step or run_cached_graph;
  "plain":  the same actions call the step function directly (ops stay lazy; values are
            computed at mark_step or when read), trace actions do nothing.
Both worlds seed lazyrt's generator the same way and take all other data from NumPy, so they
must agree. Each world takes snapshots (parameters, buffers, .grad, optimizer state and step
count, the values the step returned, gradients of argument leaves, the generator's state) only
at "read" actions and at the end, so that pending state is never perturbed otherwise.

A call "via compiled" (or "via lowlevel") before any such trace, or after a trace that raised,
calls the step function directly in both worlds; "via plain" always does.

The contract lets a replay raise lazyrt.Error (and change nothing): such a call is counted and
the world then calls the step function directly. Any other exception in a replay call, or a
difference in snapshots (rtol 1e-5, atol 1e-6; 1e-4 for the gradient of an argument leaf, see
ARG_GRAD_RTOL; exact None-ness of gradients), or a different
outcome of a plain action (raising in one world only), is a failure. A failure is shrunk by
delta debugging (drop chunks of actions, then single actions, then simplify the configuration)
while it persists, and printed as readable lines.

    PYTHONPATH=build/python python3 tests/python/replay_fuzz.py --programs 200 --seed 0
    PYTHONPATH=build/python python3 tests/python/replay_fuzz.py --seed 17 --only 0,3,5,9
"""

import argparse
import gc
import math
import os
import sys
import time

import numpy as np

try:
    import lazyrt as lr  # noqa: F401
except ImportError:  # run by hand from the repository root
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build", "python"))
    import lazyrt as lr  # noqa: F401

import lazyrt.nn as nn
import lazyrt.nn.functional as F

RTOL, ATOL = 1e-5, 1e-6
# A compiled step adds an argument leaf's gradient to its .grad as one sum after the replay;
# plain backward adds each contribution (one per use of the argument in the step) in turn. The
# two orders round differently, and where the contributions cancel (a residual next to a
# LayerNorm of the same input) the difference reaches ~1e-5 relative: seed 2072 of
# `make fuzz-replay` gave -0.8401907 vs -0.84020233, and the same program agrees once the plain
# world accumulates in the replay's order. A stale or lost gradient is off by a whole step's
# contribution, far above this tolerance.
ARG_GRAD_RTOL = 1e-4
BATCH, OTHER_BATCH = 10, 6
CLASSES = 3

# ---------------------------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------------------------


class Action:
    """One user action: a kind and its parameters (data seeds, not data, so that a shrunk
    program keeps each remaining action's data)."""

    __slots__ = ("kind", "args", "index")

    def __init__(self, kind, **args):
        self.kind = kind
        self.args = args
        self.index = -1  # its position in the generated program, kept when shrunk

    def __getattr__(self, name):
        try:
            return self.args[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self):
        inner = ", ".join(f"{k}={v}" for k, v in self.args.items())
        return f"{self.kind}({inner})"


class Program:
    def __init__(self, seed, config, actions):
        self.seed = seed
        self.config = dict(config)
        self.actions = list(actions)

    def with_actions(self, actions):
        return Program(self.seed, self.config, actions)

    def with_config(self, **changes):
        c = dict(self.config)
        c.update(changes)
        return Program(self.seed, c, self.actions)

    def config_line(self):
        c = self.config
        model = c["model"]
        if model == "mlp":
            model += f"(act={c['act']}, dropout={c['dropout']}, running_buffer={c['running']})"
        elif model in ("cnn", "attention"):
            model += f"(dropout={c['dropout']})"
        opt = c["opt"]
        hyper = {"lr": c["lr"], "weight_decay": c["weight_decay"]}
        if opt == "sgd":
            hyper.update(momentum=c["momentum"], nesterov=c["nesterov"])
        opt += "(" + ", ".join(f"{k}={v}" for k, v in hyper.items()) + ")"
        return (f"model={model} loss={c['loss']} opt={opt} zero_grad={c['zero_grad']} "
                f"loop={c['loop']} returns={c['returns']} retrace={c['retrace']} hold_views={c['hold_views']}")

    def lines(self):
        out = [f"program seed={self.seed}: {self.config_line()}"]
        for a in self.actions:
            out.append(f"  [{a.index:2d}] {a!r}")
        return out

    def __str__(self):
        return "\n".join(self.lines())


VIAS = ("compiled", "lowlevel")


def generate(seed, n_actions=12, vias=VIAS):
    """A random program from a seed (reproducible). Action i keeps index i for --only.
    vias: the replay paths the program uses (both, or only compile_step / the low-level calls);
    the choice is made after drawing, so a restriction keeps every other draw of the seed."""
    rng = np.random.default_rng([0x5EED, seed])
    pick = lambda seq, p=None: seq[rng.choice(len(seq), p=p)]  # noqa: E731
    c = {}
    c["model"] = pick(["linear", "mlp", "cnn", "attention"], [0.2, 0.45, 0.15, 0.2])
    c["act"] = pick(["relu", "tanh", "gelu"])
    c["dropout"] = float(pick([0.0, 0.0, 0.3]))
    c["running"] = bool(rng.random() < 0.3) and c["model"] == "mlp"
    c["loss"] = pick(["mse", "cross_entropy"])
    c["opt"] = pick(["sgd", "adam", "adamw"])
    c["lr"] = float(pick([0.01, 0.05, 0.1]))
    c["momentum"] = float(pick([0.0, 0.9])) if c["opt"] == "sgd" else 0.0
    c["nesterov"] = bool(c["momentum"] and rng.random() < 0.5)
    c["weight_decay"] = float(pick([0.0, 0.01]))
    c["zero_grad"] = pick(["end", "end_keep", "start", "none"], [0.4, 0.15, 0.2, 0.25])
    c["loop"] = pick(["none", "fori", "while"], [0.6, 0.2, 0.2])
    c["returns"] = pick(["loss", "loss+pred", "loss+param", "loss+count", "loss+old"], [0.35, 0.15, 0.15, 0.15, 0.2])
    c["hold_views"] = bool(rng.random() < 0.3)
    c["retrace"] = bool(rng.random() < 0.85)

    def ds():
        return int(rng.integers(0, 2**31))

    def batch():
        return OTHER_BATCH if rng.random() < 0.15 else BATCH

    actions = [Action("create", sync=bool(rng.random() < 0.5))]
    kinds = ["call", "trace", "mark_step", "read", "edit", "load_state_dict", "set_lr", "set_hyper",
             "mode", "replace_param", "zero_grad", "set_grad", "new_opt", "recreate", "view_edit", "hold_view"]
    weights = np.array([32, 9, 8, 9, 5, 4, 5, 1.5, 3, 3, 5, 2, 2, 1, 3, 2], dtype=float)
    weights /= weights.sum()
    traced = False
    for _ in range(n_actions):
        k = pick(kinds, weights)
        if not traced and rng.random() < 0.5:
            k = "trace"
        if k == "call":
            via = _restrict(pick(["compiled", "lowlevel", "plain"], [0.6, 0.25, 0.15]), vias)
            arg = pick(["data", "leaf_new", "leaf_keep", "nonleaf"], [0.7, 0.1, 0.1, 0.1])
            if via == "lowlevel":  # run_cached_graph has no argument gradients
                arg = "data"
            b = batch()
            if arg in ("leaf_keep", "nonleaf"):
                b = BATCH
            a = Action("call", via=via, batch=b, arg=arg, data=ds())
            if rng.random() < 0.25 and arg == "data":
                a.args["src"] = "from_numpy"
        elif k == "trace":
            traced = True
            via = _restrict(pick(["compiled", "lowlevel"], [0.65, 0.35]), vias)
            b, d = batch(), ds()
            if via == "compiled":
                a = Action("trace", via=via, batch=b, data=d)
            else:
                # The low-level calls take what was recorded since the last mark_step() as the
                # step (their documented contract, as PyTorch/XLA's bridge uses them): work left
                # pending before the trace would be replayed with it, and they cannot tell it
                # from the step's own. So a low-level trace starts with mark_step().
                a = Action("trace", via=via, batch=BATCH, data=d, mark_step_first=True)
        elif k == "edit":
            a = Action("edit", param=int(rng.integers(0, 8)), op=pick(["mul_", "add_", "copy_"]),
                       scale=float(pick([0.5, -1.0, 2.0])), data=ds())
        elif k == "view_edit":  # an in-place write through a view of a parameter
            a = Action("view_edit", param=int(rng.integers(0, 8)), how=pick(VIEW_KINDS),
                       op=pick(["mul_", "add_", "fill_"]), scale=float(pick([0.5, -1.0, 2.0])), data=ds())
        elif k == "hold_view":  # a view of a parameter or optimizer state, read by every later snapshot
            a = Action("hold_view", who=pick(["param", "state"]), which=int(rng.integers(0, 8)), how=pick(VIEW_KINDS))
        elif k == "load_state_dict":
            a = Action("load_state_dict", data=ds(), src=pick(["tensor", "numpy"]))
        elif k == "set_lr":
            a = Action("set_lr", lr=float(pick([0.0, 0.02, 0.2, 0.5])))
        elif k == "set_hyper":
            a = Action("set_hyper", name="weight_decay", value=float(pick([0.0, 0.05, 0.3])))
        elif k == "mode":
            a = Action("mode", train=bool(rng.random() < 0.5))
        elif k == "replace_param":
            a = Action("replace_param", param=int(rng.integers(0, 8)), data=ds())
        elif k == "zero_grad":
            a = Action("zero_grad", who=pick(["opt", "model"]), set_to_none=bool(rng.random() < 0.5))
        elif k == "set_grad":
            a = Action("set_grad", param=int(rng.integers(0, 8)), data=ds())
        elif k == "new_opt":
            a = Action("new_opt", invalidate=bool(rng.random() < 0.3))
        elif k == "recreate":
            a = Action("recreate", sync=bool(rng.random() < 0.5), invalidate=bool(rng.random() < 0.3))
        else:
            a = Action(k)
        actions.append(a)
    # A Python value the step reads (a loss weight on the program's object, self.loss_w) changed
    # between calls: a replay must trace again. Drawn from a stream of its own, so that a seed's
    # other actions are those it had before this action existed.
    extra = np.random.default_rng([seed, 7])
    with_values = []
    for a in actions:
        if a.kind != "create" and extra.random() < 0.06:
            with_values.append(Action("set_py", value=float(extra.choice([0.5, 1.0, 2.0]))))
        with_values.append(a)
    actions = with_values
    for i, a in enumerate(actions):
        a.index = i
    return Program(seed, c, actions)


def _restrict(via, vias):
    return via if via == "plain" or via in vias else vias[0]


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


class RunningCenter(nn.Module):
    """A buffer updated in place by every training forward (as BatchNorm's running mean)."""

    def __init__(self, features):
        super().__init__()
        self.register_buffer("running", lr.zeros(features))

    def forward(self, h):
        if self.training:
            with lr.no_grad():
                self.running.mul_(0.9)
                self.running.add_(h.detach().mean(0) * 0.1)
        return h - self.running


class Attention(nn.Module):
    """One pre-norm self-attention block from matmul / softmax / layer_norm, then a head."""

    def __init__(self, d=8, dropout=0.0):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d, bias=False)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.head = nn.Linear(d, CLASSES)
        self.scale = 1.0 / math.sqrt(d)

    def forward(self, x):
        h = self.ln(x)
        att = lr.softmax(lr.matmul(self.q(h), self.k(h).transpose(1, 2)) * self.scale, -1)
        h = x + self.drop(lr.matmul(att, self.v(h)))
        return self.head(h.mean(1))


def build_model(c):
    act = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}[c["act"]]
    if c["model"] == "linear":
        return nn.Linear(5, CLASSES)
    if c["model"] == "mlp":
        layers = [nn.Linear(5, 8), act()]
        if c["running"]:
            layers.append(RunningCenter(8))
        if c["dropout"]:
            layers.append(nn.Dropout(c["dropout"]))
        layers.append(nn.Linear(8, CLASSES))
        return nn.Sequential(*layers)
    if c["model"] == "cnn":
        layers = [nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()]
        if c["dropout"]:
            layers.append(nn.Dropout(c["dropout"]))
        layers.append(nn.Linear(27, CLASSES))
        return nn.Sequential(*layers)
    return Attention(8, c["dropout"])


def input_shape(c, b):
    return {"linear": (b, 5), "mlp": (b, 5), "cnn": (b, 1, 6, 6), "attention": (b, 4, 8)}[c["model"]]


def build_opt(c, params):
    if c["opt"] == "sgd":
        return lr.optim.SGD(params, lr=c["lr"], momentum=c["momentum"], nesterov=c["nesterov"],
                            weight_decay=c["weight_decay"])
    cls = lr.optim.Adam if c["opt"] == "adam" else lr.optim.AdamW
    return cls(params, lr=c["lr"], weight_decay=c["weight_decay"])


VIEW_KINDS = ["whole", "row", "transpose", "flat_step", "narrow"]


def view_of(t, how):
    """A view of t (lazyrt's views alias their base, as PyTorch's do)."""
    if how == "row":
        return t[0] if t.dim() >= 1 else t
    if how == "transpose":
        return t.transpose(0, -1) if t.dim() >= 2 else t
    if how == "flat_step":
        return t.reshape(-1)[::2]
    if how == "narrow":
        return t.narrow(0, 0, max(1, t.shape[0] // 2)) if t.dim() >= 1 else t
    return t


def normal(seed, shape, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Executor
# ---------------------------------------------------------------------------------------------


class World:
    """One run of a program in one mode. Records snapshots and the outcome of plain actions."""

    def __init__(self, program, mode, follow=None, perturb=None):
        assert mode in ("replay", "plain")
        self.p = program
        self.c = program.config
        self.mode = mode
        # The replay world's low-level traces that raised: the plain world makes the direct
        # step call that the raising sequence left pending.
        self.follow = follow if follow is not None else set()
        self.perturb = perturb  # for the harness self-test: a callable(world, action)
        self.snapshots = []     # (action index, {key: ndarray | None})
        self.events = []        # (action index, text): raises of plain actions, replay crashes
        self.returns = []       # (call number, [detached tensors]) not read yet
        self.leaves = []        # argument leaves that require grad
        self.loss_w = 1.0       # a Python value the step reads (set_py)
        self.calls = 0
        self.replay_raises = []  # (action index, message)
        self.ll_trace_raised = set()
        self.replays = 0
        self.compiled = None
        self.ll = None
        self.model = None
        self.opt = None
        self.watched = []       # (what, ndarray the program lent to lazyrt, its copy)
        self.views = []         # (what, read-only view from .numpy(), its copy), with hold_views
        self.held = []          # (what, a view of a parameter or optimizer state), see hold_view
        self.violations = []    # (action index, text): memory lazyrt must not write changed

    # ---- the user's step ----------------------------------------------------------------------

    def step(self, x, y):
        c = self.c
        if c["zero_grad"] == "start":
            self.opt.zero_grad()
        out = self.model(x)
        if c["loss"] == "mse":
            loss = F.mse_loss(out, y)
        else:
            loss = F.cross_entropy(out, y)
        obj = loss * self.loss_w
        if c["loop"] == "fori":
            with lr.no_grad():
                s = lr.fori_loop(0, 3, lambda i, v: v * 0.5 + 0.25, loss.detach())
            obj = loss * s
        elif c["loop"] == "while":
            with lr.no_grad():
                _, s = lr.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 0.9 + 0.05),
                                     (lr.tensor(0), loss.detach()))
            obj = loss * s
        if c["returns"] == "loss+old":  # the old value of a parameter the step then updates
            with lr.no_grad():
                old = next(iter(self.model.parameters())) * 1.0
        obj.backward()
        self.opt.step()
        if c["zero_grad"] == "end":
            self.opt.zero_grad()
        elif c["zero_grad"] == "end_keep":
            self.opt.zero_grad(set_to_none=False)
        if c["returns"] == "loss":
            return loss
        if c["returns"] == "loss+param":  # a detached handle on state the step updated
            return loss, next(iter(self.model.parameters())).detach()
        if c["returns"] == "loss+count":  # the optimizer's state tensor itself
            return loss, self.opt.step_count
        if c["returns"] == "loss+old":
            return loss, old
        return loss, out.detach()

    # ---- helpers ------------------------------------------------------------------------------

    def data(self, seed, b):
        x = normal(seed, input_shape(self.c, b))
        if self.c["loss"] == "mse":
            y = lr.tensor(normal(seed + 1, (b, CLASSES)))
        else:
            y = lr.tensor(np.random.default_rng(seed + 1).integers(0, CLASSES, size=b).astype(np.int64))
        return x, y

    def lend(self, what, array):
        """lr.from_numpy(array): lazyrt adopts the memory and must never write into it."""
        self.watched.append((what, array, array.copy()))
        return lr.from_numpy(array)

    def arg(self, kind, xnp, src="tensor"):
        if kind == "data":
            return self.lend(f"argument array of call {self.calls}", xnp) if src == "from_numpy" else lr.tensor(xnp)
        if kind == "leaf_new" or not self.leaves or tuple(self.leaves[-1].shape) != xnp.shape:
            leaf = lr.tensor(xnp, requires_grad=True)
            self.leaves.append(leaf)
            if kind == "leaf_new":
                return leaf
        leaf = self.leaves[-1]
        return leaf if kind == "leaf_keep" else leaf * 2

    def params(self):
        return list(self.model.named_parameters())

    def param(self, i):
        ps = self.params()
        return ps[i % len(ps)]

    def owner(self, name):
        mod = self.model
        parts = name.split(".")
        for part in parts[:-1]:
            mod = getattr(mod, part)
        return mod, parts[-1]

    def keep_returns(self, r):
        outs = list(r) if isinstance(r, (tuple, list)) else [r]
        # Snapshots of the values returned: later in-place updates of state do not reach them,
        # though a returned view of state would see them (lazyrt's views are PyTorch's; the
        # low-level calls return tensors of their own, as PyTorch/XLA's).
        self.returns.append((self.calls, [o.detach().clone() for o in outs]))
        self.calls += 1

    def direct(self, x, y):
        self.keep_returns(self.step(x, y))

    # ---- actions --------------------------------------------------------------------------------

    def create(self, sync):
        lr.manual_seed(1000 + self.p.seed)
        self.model = build_model(self.c)
        self.opt = build_opt(self.c, self.model.parameters())
        if sync:
            lr.mark_step()

    def act(self, a):
        k = a.kind
        if k == "create":
            self.create(a.sync)
        elif k == "recreate":
            self.model = None
            self.opt = None
            gc.collect()
            if a.invalidate:
                lr.invalidate_compiled_steps()
            self.model = build_model(self.c)
            self.opt = build_opt(self.c, self.model.parameters())
            if a.sync:
                lr.mark_step()
        elif k == "mark_step":
            lr.mark_step()
        elif k == "read":
            self.snapshot(a.index)
        elif k == "trace":
            self.trace(a)
        elif k == "call":
            self.call(a)
        elif k == "edit":
            name, p = self.param(a.param)
            with lr.no_grad():
                if a.op == "mul_":
                    p.mul_(a.scale)
                elif a.op == "add_":
                    p.add_(lr.tensor(normal(a.data, tuple(p.shape), 0.1)))
                else:
                    p.copy_(lr.tensor(normal(a.data, tuple(p.shape), 0.5)))
        elif k == "view_edit":
            name, p = self.param(a.param)
            v = view_of(p.data, a.how)
            if a.op == "mul_":
                v.mul_(a.scale)
            elif a.op == "add_":
                v.add_(lr.tensor(normal(a.data, tuple(v.shape), 0.1)))
            else:
                v.fill_(a.scale)
        elif k == "hold_view":
            if a.who == "param":
                name, t = self.param(a.which)
            else:
                states = self.opt.state_tensors()
                if not states:
                    return
                name, t = f"optimizer state {a.which % len(states)}", states[a.which % len(states)]
            self.held.append((f"view {a.how} of {name} held at action {a.index}", view_of(t.detach(), a.how)))
        elif k == "load_state_dict":
            sd = self.model.state_dict()
            new = {n: normal(a.data + i, tuple(v.shape), 0.5) for i, (n, v) in enumerate(sd.items())}
            if a.args.get("src", "tensor") == "numpy":  # shared with the module without a copy
                for n, arr in new.items():
                    self.watched.append((f"state dict array {n} of action {a.index}", arr, arr.copy()))
            else:
                new = {n: lr.tensor(arr) for n, arr in new.items()}
            self.model.load_state_dict(new)
        elif k == "set_lr":
            self.opt.param_groups[0]["lr"] = a.lr
        elif k == "set_hyper":
            self.opt.param_groups[0][a.name] = a.value
        elif k == "set_py":
            self.loss_w = a.value
            # The low-level calls replay the graph the user traced, as PyTorch/XLA's: its user
            # traces again after changing what the step reads.
            self.ll = None
        elif k == "mode":
            self.model.train(a.train)
        elif k == "replace_param":
            name, p = self.param(a.param)
            mod, attr = self.owner(name)
            setattr(mod, attr, nn.Parameter(lr.tensor(normal(a.data, tuple(p.shape), 0.5))))
        elif k == "zero_grad":
            (self.opt if a.who == "opt" else self.model).zero_grad(set_to_none=a.set_to_none)
        elif k == "set_grad":
            name, p = self.param(a.param)
            p.grad = lr.tensor(normal(a.data, tuple(p.shape), 0.1))
        elif k == "new_opt":
            self.opt = None
            gc.collect()
            if a.invalidate:
                lr.invalidate_compiled_steps()
            self.opt = build_opt(self.c, self.model.parameters())
        else:
            raise ValueError(f"unknown action {k}")

    def trace(self, a):
        xnp, y = self.data(a.data, a.batch)
        if a.via == "lowlevel" and a.mark_step_first:
            lr.mark_step()
        if self.mode == "plain":
            if a.index in self.follow:
                self.direct(lr.tensor(xnp), y)
            return
        x = lr.tensor(xnp)
        if a.via == "compiled":
            self.compiled = None
            try:
                self.compiled = lr.compile_step(self.step, (x, y), retrace=self.c["retrace"])
            except lr.Error as e:
                self.replay_raises.append((a.index, f"compile_step: {e}"))
            return
        self.ll = None
        r = self.step(x, y)
        outs = list(r) if isinstance(r, (tuple, list)) else [r]
        try:
            h = lr.graph_hash(outs)
            lr.warm_up_cache(outs)
            ids, values = lr.graph_inputs(outs)
        except lr.Error as e:
            # The step stays pending, as if called directly: the plain world does that call.
            self.replay_raises.append((a.index, f"low-level trace: {e}"))
            self.ll_trace_raised.add(a.index)
            self.keep_returns(r)
            return
        matcher = lr.GraphInputMatcher({lr.tensor_id(x): 0, lr.tensor_id(y): 1}, ids, values)
        self.ll = (h, matcher, len(outs))

    def call(self, a):
        xnp, y = self.data(a.data, a.batch)
        x = self.arg(a.arg, xnp, a.args.get("src", "tensor"))
        if self.mode == "plain" or a.via == "plain":
            return self.direct(x, y)
        if a.via == "compiled":
            if self.compiled is None:
                return self.direct(x, y)
            try:
                r = self.compiled(x, y)
            except lr.Error as e:
                self.replay_raises.append((a.index, f"compiled step: {e}"))
                return self.direct(x, y)
            except Exception as e:  # noqa: BLE001 - not allowed by the contract
                self.events.append((a.index, f"REPLAY CRASH {type(e).__name__}: {e}"))
                return self.direct(x, y)
        else:
            if self.ll is None:
                return self.direct(x, y)
            h, matcher, n = self.ll
            try:
                r = lr.run_cached_graph(h, matcher([x, y]))[:n]
            except lr.Error as e:
                self.replay_raises.append((a.index, f"run_cached_graph: {e}"))
                return self.direct(x, y)
            except Exception as e:  # noqa: BLE001
                self.events.append((a.index, f"REPLAY CRASH {type(e).__name__}: {e}"))
                return self.direct(x, y)
        self.replays += 1
        self.keep_returns(r)

    # ---- observation ----------------------------------------------------------------------------

    def check_memory(self, index):
        for what, arr, copy in self.watched:
            if not np.array_equal(arr, copy):
                self.violations.append((index, f"lazyrt wrote into memory it does not own: {what}"))
        for what, view, copy in self.views:
            if not np.array_equal(view, copy, equal_nan=True):
                self.violations.append((index, f"a NumPy view held by the user changed: {what}"))
        self.views = []

    def snapshot(self, index):
        self.check_memory(index)
        hold = self.c.get("hold_views")

        def val(key, t):
            if t is None:
                return None
            view = t.numpy()
            copy = np.array(view, copy=True)
            if hold:
                self.views.append((f"{key} read at action {index}", view, copy))
            return copy

        s = {}
        items = []
        if self.model is not None:
            for n, p in self.model.named_parameters():
                items += [(f"param {n}", p), (f"grad {n}", p.grad)]
            for n, b in self.model.named_buffers():
                items.append((f"buffer {n}", b))
        if self.opt is not None:
            items += [(f"optimizer state {i}", t) for i, t in enumerate(self.opt.state_tensors())]
            items.append(("optimizer step_count", self.opt.step_count))
        items += [(f"argument leaf {i} grad", leaf.grad) for i, leaf in enumerate(self.leaves)]
        items += self.held
        for n, outs in self.returns:
            items += [(f"call {n} returned[{j}]", o) for j, o in enumerate(outs)]
        self.returns = []
        items += [(f"random_state[{i}]", t) for i, t in enumerate(lr.random_state())]
        for key, t in items:
            s[key] = val(key, t)
        self.snapshots.append((index, s))

    def run(self):
        for a in self.p.actions:
            try:
                self.act(a)
            except lr.Error as e:
                self.events.append((a.index, f"{a.kind} raised lazyrt.Error: {_first_line(e)}"))
            except Exception as e:  # noqa: BLE001 - compared across worlds
                self.events.append((a.index, f"{a.kind} raised {type(e).__name__}: {_first_line(e)}"))
            if self.perturb is not None:
                self.perturb(self, a)
        self.snapshot("end")
        self.check_memory("end")
        # compiled step -> bound method -> world is a cycle through an extension object that
        # Python's collector cannot see: break it, or every world lives forever.
        self.compiled = self.ll = None
        return self


def _first_line(e):
    return str(e).split("\n")[0][:200]


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------


def compare_snapshots(a, b):
    """The first difference between two snapshot lists, as (category, text), or None."""
    if len(a) != len(b):
        return ("count", f"{len(a)} snapshots vs {len(b)}")
    for (ia, sa), (ib, sb) in zip(a, b):
        where = f"snapshot at action {ia}" if ia != "end" else "final snapshot"
        if sa.keys() != sb.keys():
            only_a = sorted(set(sa) - set(sb))
            only_b = sorted(set(sb) - set(sa))
            return ("keys", f"{where}: keys only in replay {only_a}, only in plain {only_b}")
        for k in sa:
            va, vb = sa[k], sb[k]
            cat = k.split(" ")[0]
            if va is None or vb is None:
                if (va is None) != (vb is None):
                    return (cat, f"{where}: {k} is {'None' if va is None else 'a tensor'} after replay, "
                                 f"{'None' if vb is None else 'a tensor'} in the plain program")
                continue
            if va.shape != vb.shape or va.dtype != vb.dtype:
                return (cat, f"{where}: {k} is {va.dtype}{list(va.shape)} after replay, "
                             f"{vb.dtype}{list(vb.shape)} in the plain program")
            if va.dtype.kind in "fc":
                rtol = ARG_GRAD_RTOL if k.startswith("argument leaf") else RTOL
                bad = ~np.isclose(va, vb, rtol=rtol, atol=ATOL, equal_nan=True)
            else:
                bad = va != vb
            if np.any(bad):
                i = np.unravel_index(np.argmax(bad), bad.shape) if va.ndim else ()
                return (cat, f"{where}: {k} differs at {len(np.argwhere(bad))}/{max(va.size, 1)} "
                             f"elements, e.g. {tuple(int(j) for j in i)}: replay {va[i]!r} vs plain {vb[i]!r}")
    return None


class Outcome:
    def __init__(self, program, diff, replay, plain):
        self.program = program
        self.diff = diff  # (category, text) or None
        self.replay_raises = replay.replay_raises if replay else []
        self.replays = replay.replays if replay else 0

    @property
    def failed(self):
        return self.diff is not None


def run_program(program, perturb=None):
    """Runs the program in both worlds and compares them."""
    replay = World(program, "replay", perturb=perturb).run()
    follow = set(replay.ll_trace_raised)
    r_snaps, r_events = replay.snapshots, replay.events
    violations = [("replay world", i, t) for i, t in replay.violations]
    replay_stats = _Stats(replay)
    del replay
    gc.collect()
    plain = World(program, "plain", follow=follow).run()
    p_snaps, p_events = plain.snapshots, plain.events
    violations += [("plain world", i, t) for i, t in plain.violations]
    del plain
    gc.collect()
    diff = None
    if violations:
        w, i, t = violations[0]
        diff = ("memory", f"{w}, at action {i}: {t}")
    elif r_events != p_events:
        ra, pa = dict(r_events), dict(p_events)
        for i in sorted(set(ra) | set(pa), key=str):
            if ra.get(i) != pa.get(i):
                cat = "crash" if "REPLAY CRASH" in str(ra.get(i)) else "event"
                diff = (cat, f"action {i}: replay world: {ra.get(i) or 'ok'}; plain world: {pa.get(i) or 'ok'}")
                break
    if diff is None:
        diff = compare_snapshots(r_snaps, p_snaps)
    return Outcome(program, diff, replay_stats, None)


class _Stats:
    def __init__(self, w):
        self.replay_raises = list(w.replay_raises)
        self.replays = w.replays


# ---------------------------------------------------------------------------------------------
# Shrinking
# ---------------------------------------------------------------------------------------------


CONFIG_SIMPLIFICATIONS = [
    dict(model="linear"), dict(model="mlp"), dict(dropout=0.0), dict(running=False), dict(loop="none"),
    dict(returns="loss"), dict(loss="mse"), dict(opt="sgd", momentum=0.0, nesterov=False),
    dict(momentum=0.0, nesterov=False), dict(nesterov=False), dict(weight_decay=0.0), dict(act="relu"),
    dict(retrace=True), dict(zero_grad="end"), dict(hold_views=False),
]


def shrink(program, outcome=None, budget_s=120.0, perturb=None):
    """Delta debugging: the shortest program (action list, then configuration) that still fails
    with a difference of the same category. The first action (create) is kept."""
    outcome = outcome or run_program(program, perturb)
    if not outcome.failed:
        return program, outcome
    category = outcome.diff[0]
    deadline = time.time() + budget_s
    best, best_out = program, outcome

    def fails(p):
        nonlocal best, best_out
        o = run_program(p, perturb)
        if o.failed and o.diff[0] == category:
            best, best_out = p, o
            return True
        return False

    head, rest = program.actions[:1], program.actions[1:]
    n = 2
    while len(rest) >= 2 and time.time() < deadline:
        chunk = math.ceil(len(rest) / n)
        reduced = False
        for i in range(0, len(rest), chunk):
            complement = rest[:i] + rest[i + chunk:]
            if fails(program.with_actions(head + complement)):
                rest, n, reduced = complement, max(n - 1, 2), True
                break
        if not reduced:
            if n >= len(rest):
                break
            n = min(len(rest), n * 2)
    # Single actions, to a fixed point.
    changed = True
    while changed and time.time() < deadline:
        changed = False
        for i in range(len(rest)):
            if fails(program.with_actions(head + rest[:i] + rest[i + 1:])):
                rest = rest[:i] + rest[i + 1:]
                changed = True
                break
    current = best.with_actions(head + rest) if best.actions != head + rest else best
    for simpler in CONFIG_SIMPLIFICATIONS:
        if time.time() >= deadline:
            break
        if all(current.config.get(k) == v for k, v in simpler.items()):
            continue
        cand = current.with_config(**simpler)
        if fails(cand):
            current = cand
    return best, best_out


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def select(program, only):
    keep = set(only)
    return program.with_actions([a for a in program.actions if a.index in keep])


def report_failure(outcome, shrunk=None, out=sys.stdout):
    p = outcome.program
    print(f"FAIL seed={p.seed}: {outcome.diff[0]}: {outcome.diff[1]}", file=out)
    if shrunk is not None:
        sp, so = shrunk
        delta = _config_delta(p, sp)
        print(f"  shortest failing program ({len(sp.actions)} actions; rerun with "
              f"--seed {sp.seed} --only {','.join(str(a.index) for a in sp.actions)}"
              + (f" --config {delta}" if delta else "") + "):", file=out)
        for line in sp.lines():
            print("    " + line, file=out)
        print(f"    -> {so.diff[0]}: {so.diff[1]}", file=out)
        if so.replay_raises:
            for i, msg in so.replay_raises[:3]:
                print(f"    (replay raised at action {i}: {_first_line(msg)})", file=out)
    out.flush()


def _config_delta(a, b):
    d = {k: v for k, v in b.config.items() if a.config.get(k) != v}
    return ",".join(f"{k}={v}" for k, v in d.items())


def parse_config(text):
    out = {}
    for item in text.split(","):
        if not item.strip():
            continue
        k, v = item.split("=", 1)
        k, v = k.strip(), v.strip()
        if v in ("True", "False"):
            out[k] = v == "True"
        else:
            try:
                out[k] = float(v) if "." in v else int(v)
            except ValueError:
                out[k] = v
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="seed of the first program (then seed+1, ...)")
    ap.add_argument("--actions", type=int, default=12, help="random actions per program (after create)")
    ap.add_argument("--only", default=None, help="comma-separated action indices to keep (one program)")
    ap.add_argument("--config", default=None,
                    help="configuration overrides for --only, as printed: key=value,key=value")
    ap.add_argument("--via", choices=["both", "compiled", "lowlevel"], default="both",
                    help="replay paths the programs use (default both)")
    ap.add_argument("--shrink-limit", type=int, default=12,
                    help="shrink at most this many failures (the first of each kind first)")
    ap.add_argument("--shrink-seconds", type=float, default=60.0, help="time budget per shrink")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    t0 = time.time()
    failures, n_actions, raises, replays = [], 0, 0, 0
    raise_kinds = {}
    seeds = [args.seed] if args.only is not None else range(args.seed, args.seed + args.programs)
    for s in seeds:
        prog = generate(s, args.actions, VIAS if args.via == "both" else (args.via,))
        if args.only is not None:
            prog = select(prog, [int(i) for i in args.only.split(",") if i != ""])
        if args.config:
            prog = prog.with_config(**parse_config(args.config))
        o = run_program(prog)
        n_actions += len(prog.actions)
        raises += len(o.replay_raises)
        replays += o.replays
        for _, msg in o.replay_raises:
            key = msg.split(":")[0] + ": " + " ".join(msg.split(":", 1)[1].split()[:8])
            raise_kinds[key] = raise_kinds.get(key, 0) + 1
        if o.failed:
            failures.append(o)
            print(f"FAIL seed={s}: {o.diff[0]}: {o.diff[1]}", flush=True)
        elif not args.quiet and (s - args.seed) % 500 == 499:
            print(f"... {s - args.seed + 1} programs, {len(failures)} failures, {time.time() - t0:.0f} s", flush=True)

    # Shrink: first one failure of each category, then more, up to the limit.
    by_cat = {}
    for o in failures:
        by_cat.setdefault(o.diff[0], []).append(o)
    order = [v[0] for v in by_cat.values()] + [o for v in by_cat.values() for o in v[1:]]
    if failures:
        print("\n==== shrunk failures ====")
    for o in order[:args.shrink_limit]:
        report_failure(o, shrink(o.program, o, args.shrink_seconds))
    if len(order) > args.shrink_limit:
        print(f"({len(order) - args.shrink_limit} more failures not shrunk: seeds "
              f"{' '.join(str(o.program.seed) for o in order[args.shrink_limit:])})")
    if raise_kinds and not args.quiet:
        print("\nreplay calls that raised lazyrt.Error (allowed by the contract):")
        for k, v in sorted(raise_kinds.items(), key=lambda kv: -kv[1])[:15]:
            print(f"  {v:6d}  {k}")
    print(f"\nreplay_fuzz: {len(seeds)} programs, {n_actions} actions, {replays} replays, "
          f"{raises} replay calls raised lazyrt.Error (allowed), {len(failures)} failures "
          f"({', '.join(f'{k}: {len(v)}' for k, v in by_cat.items()) or 'none'}), "
          f"{time.time() - t0:.1f} s")
    if failures:
        print("failing seeds: " + " ".join(str(o.program.seed) for o in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
