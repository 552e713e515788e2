"""Run by run_install_test.cmake: the installed lazyrt package imports from the install prefix,
loads the installed library, and works, generated kernels included (compiled by the installed
compiler process). Arguments: the prefix and its library directory."""

import os
import sys

os.environ["LAZYRT_JIT"] = "sync"  # read when the first graph is lowered
os.environ["LAZYRT_BACKEND"] = "cpu"  # generated kernels are the cpu backend's

prefix, libdir = (os.path.realpath(p) for p in sys.argv[1:3])

import lazyrt as lr  # noqa: E402

package = os.path.realpath(lr.__file__)
assert package.startswith(prefix + os.sep), f"lazyrt imported from {package}, not from {prefix}"
with open("/proc/self/maps") as maps:
    libraries = {line.split()[-1] for line in maps if "liblazyrt.so" in line}
assert libraries, "liblazyrt.so is not loaded"
assert all(os.path.realpath(p).startswith(libdir + os.sep) for p in libraries), libraries

step = lr.compile_step(lambda x: (x * 2).sum(), (lr.ones(3),))
assert step(lr.tensor([1.0, 2.0, 3.0])).item() == 12.0
assert lr.nn.Linear(2, 2)(lr.ones(1, 2)).shape == (1, 2)
x = lr.tensor([0.25 * i for i in range(1000)])
y = ((x * 0.5 + 1.0).tanh() * x).sum().item()
assert lr.metrics.counter("JitModules") >= 1 and lr.metrics.counter("JitFailures") == 0, "no generated kernels"
compilers = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        if "(lazyrt-jitc)" in stat and int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            compilers.append(os.path.realpath(f"/proc/{pid}/exe"))
    except (OSError, ValueError):
        pass
assert compilers and all(c.startswith(libdir + os.sep) for c in compilers), compilers
import math  # noqa: E402
expected = sum(math.tanh(0.125 * i + 1.0) * 0.25 * i for i in range(1000))
assert abs(y - expected) <= 1e-4 * abs(expected), (y, expected)

# The package's metadata, and the entry point through which Dynamo finds the torch.compile
# backend: torch.compile(backend="lazyrt") without importing lazyrt.torch first.
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402

dist = importlib.metadata.distribution("lazyrt")
assert dist.version == lr.__version__, (dist.version, lr.__version__)
assert os.path.realpath(dist.locate_file("lazyrt")).startswith(prefix + os.sep), dist.locate_file("lazyrt")
backend = importlib.metadata.entry_points(group="torch_dynamo_backends")["lazyrt"]
assert backend.value == "lazyrt.torch._dynamo:lazyrt_backend", backend.value
if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("lazyrt._torch_C") is not None:
    import torch  # noqa: E402

    assert "lazyrt.torch" not in sys.modules
    f = torch.compile(lambda t: torch.tanh(t) * 2, backend="lazyrt")
    t = torch.linspace(-2, 2, 9)
    assert torch.allclose(f(t), torch.tanh(t) * 2, rtol=1e-6, atol=1e-6)
    assert lr.metrics.counter("DynamoCall") == 1, "the torch.compile backend did not run"
print("installed package OK:", package)
