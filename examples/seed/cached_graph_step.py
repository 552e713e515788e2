"""Seed program: a training step traced once and replayed from the compile cache.

Linear(5, 3) trained with AdamW (a sync-free step taking found_inf, as for mixed precision).
As the seed's user writes it: the model, the optimizer and the input are made with no
mark_step(), one step is traced, and the outputs handed to the low-level calls are the loss and
the parameters (not the optimizer's moments or step count). The step's
graph is hashed and compiled without running (warm-up), and then run three times with
run_cached_graph, PyTorch/XLA-style: no tracing; the model's making is computed once when the
step is cut, and the weights and the optimizer state (every tensor the step updates in place,
listed or not) are written back on every replay. The replayed losses change from
step to step and equal those of three plain steps from the same start.

    PYTHONPATH=build/python .venv/bin/python examples/seed/cached_graph_step.py
"""

import lazyrt as lr
import lazyrt.nn as nn


def make_model_and_optimizer(state=None):
    lr.manual_seed(0)
    model = nn.Linear(5, 3)
    if state is not None:
        model.load_state_dict(state)
    optimizer = lr.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer


model, optimizer = make_model_and_optimizer()
found_inf = lr.zeros(1)  # non-zero would skip the update
x = lr.randn(10, 5)
start = {k: v.clone() for k, v in model.state_dict().items()}  # copies: state_dict() aliases, as PyTorch's


def train_step(x):
    loss = model(x).sum()
    loss.backward()
    optimizer.step(found_inf=found_inf)
    optimizer.zero_grad()
    return loss


# Trace one step, hash its graph and compile it; nothing runs.
loss = train_step(x)
params = list(model.parameters())
outputs = [loss] + params  # the gradients are None again at the end of the step
graph_hash = lr.graph_hash(outputs)
lr.warm_up_cache(outputs)
graph_input_tensor_ids, graph_input_values = lr.graph_inputs(outputs)
matcher = lr.GraphInputMatcher({lr.tensor_id(x): 0}, graph_input_tensor_ids, graph_input_values)
print(f"graph hash: {graph_hash}")

lr.metrics.reset()
replayed = []
for i in range(3):
    outputs = lr.run_cached_graph(graph_hash, matcher([x]))
    replayed.append(outputs[0].item())
    print(f"replay {i + 1}: loss {replayed[-1]:.6f}")
print(f"replays: {lr.metrics.counter('ReplayGraph')}, compiles: {lr.metrics.counter('UncachedCompile')}")
replayed_weight = model.weight.tolist()

# The same three steps as a plain loop, from the same start.
model, optimizer = make_model_and_optimizer(start)
plain = []
for i in range(3):
    loss = train_step(x)
    lr.mark_step()
    plain.append(loss.item())
    print(f"plain {i + 1}: loss {plain[-1]:.6f}")

print(f"losses change: {len(set(replayed)) == 3}")
print(f"replayed losses equal the plain loop's: {replayed == plain}")
print(f"weights equal: {replayed_weight == model.weight.tolist()}")
