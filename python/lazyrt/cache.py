"""lazyrt.cache: settings of the caches of compiled graphs (in memory, and on disk)."""

from lazyrt._C._cache import (  # noqa: F401
    clear_memory,
    memory_bytes,
    memory_capacity,
    memory_max_bytes,
    memory_size,
    persistent_dir,
    persistent_max_bytes,
    persistent_readonly,
    set_memory_capacity,
    set_memory_max_bytes,
    set_persistent_dir,
    set_persistent_max_bytes,
)
