"""Seed program: PyTorch/XLA's cached-graph replay of a training step, on the lazyrt device.

Linear(5, 3) trained with torch.optim.AdamW on device tensors, written as for PyTorch/XLA's
device with only the device changed: one step is traced (nothing runs), and the graph of the
loss and the parameters is hashed, compiled without running and replayed three times with
the low-level calls PyTorch/XLA's dynamo bridge makes (torch_xla._XLAC's `_get_graph_hash`,
`_xla_warm_up_cache`, `_get_tensors_xla_device_data_node`, `_run_cached_graph` and a
`GraphInputMatcher`, here lazyrt.torch's of the same names). On PyTorch/XLA every replay returns
the first step's loss again and the parameters never change; here each replay is the next
step: the weights and AdamW's moments and step count (which the outputs do not list) are
updated on the device every time, and the losses equal three plain PyTorch steps on the CPU.

AdamW is made with capturable=True, which keeps its step count on the device: by default
PyTorch keeps it on the CPU and computes the bias corrections there, as numbers a replay could
not update, and lazyrt.torch refuses to replay such a step rather than repeat them.

    PYTHONPATH=build/python .venv/bin/python examples/seed/device_cached_step.py
"""

import copy

import torch

import lazyrt.torch

device = lazyrt.torch.device()  # PyTorch/XLA: xm.xla_device()
torch.manual_seed(0)
cpu_model = torch.nn.Linear(5, 3)
model = copy.deepcopy(cpu_model).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
x = torch.randn(10, 5).to(device)


def train_step(x):
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


lazyrt.torch.sync()  # the model, optimizer and input are made: the step starts here
loss = train_step(x)  # traced, not run
outputs = [loss] + list(model.parameters())
graph_hash = lazyrt.torch._get_graph_hash(outputs)
lazyrt.torch._xla_warm_up_cache(outputs, [])
graph_input_tensor_ids, graph_input_values = lazyrt.torch._get_tensors_xla_device_data_node(outputs)
x_id = lazyrt.torch._xla_get_tensor_id(x)
matcher = lazyrt.torch.GraphInputMatcher({x_id: 0}, graph_input_tensor_ids, graph_input_values, {x_id})
print(f"graph hash: {graph_hash}")

lazyrt.metrics.reset()
replayed = []
for i in range(3):
    result = lazyrt.torch._run_cached_graph(graph_hash, matcher([x]))
    replayed.append(result[0].item())
    print(f"replay {i + 1}: loss {replayed[-1]:.6f}")
print(f"compiles during the replays: {lazyrt.metrics.counter('UncachedCompile')}")
step_count = optimizer.state[model.weight]["step"].item()

# The same three steps in plain PyTorch on the CPU, from the same start.
cpu_optimizer = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
cpu_x = x.cpu()
plain = []
for i in range(3):
    loss = cpu_model(cpu_x).sum()
    loss.backward()
    cpu_optimizer.step()
    cpu_optimizer.zero_grad()
    plain.append(loss.item())
    print(f"plain {i + 1}: loss {plain[-1]:.6f}")

# float32 with a different order of rounding than PyTorch's kernels: equal to rtol 1e-5.
print(f"losses change: {len(set(replayed)) == 3}")
print(f"replayed losses equal PyTorch's: {torch.allclose(torch.tensor(replayed), torch.tensor(plain), rtol=1e-5)}")
print(f"weights equal PyTorch's: {torch.allclose(model.weight.cpu(), cpu_model.weight, rtol=1e-5, atol=1e-6)}")
state, cpu_state = optimizer.state[model.weight], cpu_optimizer.state[cpu_model.weight]
print(f"AdamW step count: {step_count:g} (PyTorch: {cpu_state['step'].item():g}); moments equal PyTorch's: "
      f"{torch.allclose(state['exp_avg'].cpu(), cpu_state['exp_avg'], rtol=1e-5, atol=1e-7)}")
