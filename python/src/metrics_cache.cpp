// lazyrt._C._metrics, _cache, _jit and _debug: counters and timings, the compile cache's
// settings, generated kernels' compiler thread, and looking at pending graphs and memory; the
// backend choice (backend.h). All thread-safe in C++; nothing here syncs.
#include "bindings.h"

namespace lazyrt::python {

void bind_metrics_cache(py::module_& m) {
  py::module_ mt = m.def_submodule("_metrics", "Counters and timings (metrics.h).");
  mt.def("counter", [](const std::string& name) { return metrics::counter(name); }, py::arg("name"),
         "The value of a counter; 0 when it was never touched.");
  mt.def("timing_count", [](const std::string& name) { return metrics::timing_count(name); }, py::arg("name"));
  mt.def("timing_total_ns", [](const std::string& name) { return metrics::timing_total_ns(name); },
         py::arg("name"));
  mt.def("report", &metrics::report, "Every counter and timing, one per line.");
  mt.def("reset", &metrics::reset, "Sets every counter and timing back to zero.");
  mt.def("set_kernel_timings", &metrics::set_kernel_timings, py::arg("on"), py::arg("alone") = false,
         "While on, every kernel run records a timing named 'Kernel:<op>'. alone: each step that writes "
         "no byte it reads also runs 3 more times on its operands, now in cache, timed into step_timings' "
         "alone_runs and alone_ns.");
  mt.def("kernel_timings", &metrics::kernel_timings);
  mt.def(
      "step_timings",
      [] {
        py::list out;
        for (const metrics::StepTiming& t : metrics::step_timings()) {
          py::dict d;
          d["executable"] = t.executable;
          d["step"] = t.step;
          d["op"] = t.op;
          d["bytes"] = t.bytes;
          d["runs"] = t.runs;
          d["total_ns"] = t.total_ns;
          d["alone_runs"] = t.alone_runs;
          d["alone_ns"] = t.alone_ns;
          out.append(d);
        }
        return out;
      },
      "Every step of the live executables timed while kernel timings were on (since the last reset): "
      "dicts of executable, step, op, bytes (its operands' and results'), runs and total_ns, alone_runs and "
      "alone_ns.");
  // Recording is the package's own business (its Python layers count what they do), not the API's.
  mt.def("_increment", [](const std::string& name, int64_t by) { metrics::increment(name, by); }, py::arg("name"),
         py::arg("by") = 1);

  py::module_ j = m.def_submodule("_jit", "Generated kernels' compiler thread (backend.h).");
  j.def("wait_idle", &wait_for_generated_code, py::call_guard<py::gil_scoped_release>(),
        "Waits until every module handed to the compiler thread so far is compiled.");
  j.def("shutdown", &stop_generating_code, py::call_guard<py::gil_scoped_release>(),
        "Generation off for the rest of the process; ends the compile in flight (its module stays interpreted).");

  py::module_ c = m.def_submodule("_cache", "The compile cache's settings (cache.h).");
  // Counts and bytes from Python: a negative value is a lazyrt.Error, not a TypeError.
  auto non_negative = [](int64_t value, const char* call) {
    check(value >= 0, call, ": the value must be >= 0, got ", value);
    return static_cast<uint64_t>(value);
  };
  c.def("set_memory_capacity", [non_negative](int64_t entries) {
    cache::set_memory_capacity(non_negative(entries, "set_memory_capacity"));
  }, py::arg("entries"), "Capacity of the in-memory cache of compiled graphs; 0 disables it.");
  c.def("memory_capacity", &cache::memory_capacity);
  c.def("set_memory_max_bytes", [non_negative](int64_t bytes) {
    cache::set_memory_max_bytes(non_negative(bytes, "set_memory_max_bytes"));
  }, py::arg("bytes"),
        "Byte cap of the in-memory cache (0: none); the least recently used entries are evicted, "
        "the most recent one always kept.");
  c.def("memory_max_bytes", &cache::memory_max_bytes);
  c.def("memory_size", &cache::memory_size, "Compiled graphs held in memory now.");
  c.def("memory_bytes", &cache::memory_bytes, "Bytes the compiled graphs held in memory hold.");
  c.def("clear_memory", &cache::clear_memory, "Drops every in-memory entry.");
  c.def("set_persistent_dir", &cache::set_persistent_dir, py::arg("dir"), py::arg("readonly") = false,
        "Uses dir as the persistent compile cache (an empty dir turns it off); read-only writes nothing.");
  c.def("persistent_dir", &cache::persistent_dir);
  c.def("persistent_readonly", &cache::persistent_readonly);
  c.def("set_persistent_max_bytes", &cache::set_persistent_max_bytes, py::arg("bytes"),
        "Size cap of the persistent cache directory; least recently used entries are evicted.");
  c.def("persistent_max_bytes", &cache::persistent_max_bytes);

  m.def("set_backend", &set_backend, py::arg("name"),
        "Makes `name` ('cpu' or 'reference') the backend of every graph compiled from now on.");
  m.def("current_backend", &current_backend);
  m.def("available_backends", &available_backends);
  m.def("set_flush_denormal", &set_flush_denormal, py::arg("mode"),
        "Whether lazyrt's kernels treat denormal floats as zero (on by default, as XLA's CPU backend; "
        "torch.set_flush_denormal's signature). Returns False where the CPU has no such mode.");
  m.def("flush_denormal", &flush_denormal);

  py::module_ d = m.def_submodule("_debug", "Pending graphs and memory (debug.h).");
  d.def("op_table", [] {
    py::list rows;
    for (const debug::OpRow& r : debug::op_table()) {
      py::dict row;
      row["name"] = r.name;
      row["aten"] = r.aten;
      row["api"] = r.api;
      row["operands"] = r.operands;
      row["elementwise"] = r.elementwise;
      row["differentiable"] = r.differentiable;
      rows.append(row);
    }
    return rows;
  }, "The rows of the op table (lazyrt/ops.def), as dicts: name, aten (the ATen overloads lazyrt.torch "
     "lowers to it, space separated), api (its public function: Unary, UnaryFloat, Arith, ArithFloat, "
     "Public or Internal), operands (-1: any number), elementwise, differentiable.");
  d.def("graph_text", [](py::handle ts) { return debug::graph_text(tensors_from(ts, "graph_text")); },
        py::arg("tensors"), "The graph a sync of these tensors would compile, as text.");
  d.def("polymorphic_graph_text",
        [](py::handle ts) { return debug::polymorphic_graph_text(tensors_from(ts, "polymorphic_graph_text")); },
        py::arg("tensors"),
        "The bucket graph a sync of these tensors compiles where they read dims marked dynamic, as text; "
        "else 'not polymorphic: ' and why.");
  d.def("last_polymorphic_refusal", &debug::last_polymorphic_refusal,
        "Why the last graph that read dims marked dynamic was compiled as traced; '' when none was.");
  d.def("graph_node_count", [](py::handle ts) { return debug::graph_node_count(tensors_from(ts, "graph_node_count")); },
        py::arg("tensors"));
  d.def("live_memory_bytes", &debug::live_memory_bytes);
  d.def("peak_memory_bytes", &debug::peak_memory_bytes);
  d.def("reset_peak_memory", &debug::reset_peak_memory);
  d.def("release_free_heap", &debug::release_free_heap,
        "Hands the C heap's free pages back to the system (after a step's first call).");
  d.def("set_dump_graph_dir", &debug::set_dump_graph_dir, py::arg("dir"),
        "Writes each graph that gets an executable to DIR/<key>.txt and .dot ('' turns it off).");
  d.def("dump_graph_dir", &debug::dump_graph_dir);
}

}  // namespace lazyrt::python
