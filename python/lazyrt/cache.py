"""lazyrt.cache: settings of the cache of compiled graphs."""

from lazyrt._C._cache import set_memory_capacity, memory_capacity, memory_size, clear_memory  # noqa: F401
