"""lazyrt.debug: the op table, the pending graph as text (and its bucket graph where it reads dynamic dims), its size, memory use, and dumps of compiled graphs."""

from lazyrt._C._debug import (  # noqa: F401
    graph_text, polymorphic_graph_text, last_polymorphic_refusal, graph_node_count, live_memory_bytes, peak_memory_bytes, reset_peak_memory, release_free_heap,
    set_dump_graph_dir, dump_graph_dir, op_table,
)
