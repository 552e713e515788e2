"""lazyrt.metrics: counters and timings in the style of PyTorch/XLA's metrics.

Counters: UncachedCompile, CachedCompile, ExecuteGraph, ReplayGraph, MemoryCacheEvictions,
CompiledStepVariantEvictions, GraphBreak (ops a lazyrt.torch step ran in PyTorch eager),
DynamoGraph and DynamoCall (the lazyrt graphs torch.compile's backend="lazyrt" compiled, and
their calls) (more arrive with later features). Timings: TraceTime, CompileTime, ExecuteTime, and with set_kernel_timings(True) (or
LAZYRT_KERNEL_TIMINGS=1) one per op its kernels ran for, ``Kernel:<op>``, and per step of each
executable (step_timings()).
"""

from lazyrt._C._metrics import (  # noqa: F401
    counter, timing_count, timing_total_ns, report, reset, set_kernel_timings, kernel_timings, step_timings,
)
