// Cached-graph replay from Python: the low-level calls of PyTorch/XLA's dynamo bridge
// (graph_hash, warm_up_cache, graph_inputs, run_cached_graph, tensor_id) and compile_step.
//
// Every call that compiles or runs a graph releases the GIL. A compiled step's call may retrace
// (a guard failed): the step function is Python, so the tracing callback takes the GIL back.
// The step's own lock is only ever taken without the GIL, so the two cannot deadlock.
#include "bindings.h"
#include "compiled_step.h"
#include "reads.h"

namespace lazyrt::python {

namespace {

std::string hash_repr(const GraphHash& h) { return "GraphHash('" + h.to_string() + "')"; }

// A count or byte setting from Python: a negative value is a lazyrt.Error, not a TypeError.
uint64_t non_negative(int64_t value, const char* call, const char* what) {
  check(value >= 0, call, ": ", what, " must be >= 0, got ", value);
  return static_cast<uint64_t>(value);
}

// The Python values a step function reads (lazyrt._reads), checked with the GIL before a
// variant traced with them is replayed.
class PyReadsGuard final : public HostGuard {
 public:
  explicit PyReadsGuard(reads::Reads<reads::NoTensors> reads)
      : reads_(std::make_unique<reads::Reads<reads::NoTensors>>(std::move(reads))) {}
  ~PyReadsGuard() override {
    if (!Py_IsInitialized()) {  // the interpreter is gone, and its objects with it
      (void)reads_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    reads_.reset();
  }
  bool holds() const override {
    py::gil_scoped_acquire gil;
    return reads_->hold();
  }

 private:
  std::unique_ptr<reads::Reads<reads::NoTensors>> reads_;
};

PyCompiledStep compile_step_py(py::function fn, py::handle example_args, bool retrace, int64_t max_variants,
                               int64_t max_variant_bytes, bool guard_reads) {
  CompileStepOptions options{retrace, non_negative(max_variants, "compile_step", "max_variants"),
                             non_negative(max_variant_bytes, "compile_step", "max_variant_bytes"), {}};
  auto state = std::make_shared<StepFunction>();
  state->fn = fn;
  std::vector<Tensor> example = tensors_from(example_args, "compile_step");
  // Holds the state weakly: the Python step object owns it, and the C++ step owns this.
  std::weak_ptr<StepFunction> weak = state;
  if (guard_reads) options.host_guard = [weak]() -> std::shared_ptr<const HostGuard> {
    py::gil_scoped_acquire gil;
    std::shared_ptr<StepFunction> st = weak.lock();
    if (!st) return nullptr;
    py::module_ r = py::module_::import("lazyrt._reads");
    py::object spec = r.attr("guard_spec")(r.attr("python_reads")(st->fn));
    if (py::len(spec) == 0) return nullptr;
    return std::make_shared<PyReadsGuard>(reads::Reads<reads::NoTensors>(
        spec, {r.attr("DEPTH").cast<int>(), r.attr("MAX_ITEMS").cast<Py_ssize_t>()}));
  };
  auto traced = [weak](const std::vector<Tensor>& args) {
    py::gil_scoped_acquire gil;
    std::shared_ptr<StepFunction> st = weak.lock();
    if (!st) throw Error("compile_step: the step function is gone");
    py::object r = st->fn(*to_tuple(args));
    st->single = py::isinstance<Tensor>(r);
    if (st->single) return std::vector<Tensor>{r.cast<Tensor>()};
    if (!py::isinstance<py::tuple>(r) && !py::isinstance<py::list>(r))
      throw Error("compile_step: the step function must return a lazyrt tensor or a tuple of them, got " +
                  std::string(py::str(py::type::handle_of(r).attr("__name__"))));
    return tensors_from(r, "compile_step");
  };
  CompiledStep step = compile_step(traced, example, options);
  return PyCompiledStep(std::move(state), std::move(step));
}

// GraphInputMatcher's call (lazyrt._replay subclasses this): per graph input, the call's
// argument at its position, or the value captured for it.
struct InputMatch {
  std::vector<int64_t> arg_of;  // per graph input, the argument position, or -1
  std::vector<py::object> values;
};

py::list match_inputs(const InputMatch& m, py::handle args) {
  PyObject* seq = PySequence_Fast(args.ptr(), "GraphInputMatcher: expected a list or tuple of arguments");
  if (seq == nullptr) throw py::error_already_set();
  const auto held = py::reinterpret_steal<py::object>(seq);
  const Py_ssize_t n_args = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  py::list out(m.arg_of.size());
  for (size_t i = 0; i < m.arg_of.size(); ++i) {
    const int64_t a = m.arg_of[i];
    if (a < 0) {
      PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), m.values[i].inc_ref().ptr());
      continue;
    }
    if (a >= n_args)
      throw py::index_error("GraphInputMatcher: graph input " + std::to_string(i) + " is argument " +
                            std::to_string(a) + ", the call has " + std::to_string(n_args));
    Py_INCREF(items[a]);
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), items[a]);
  }
  return out;
}

}  // namespace

void bind_replay(py::module_& m) {
  py::class_<InputMatch>(m, "_InputMatch", "The call of lazyrt.GraphInputMatcher.")
      .def(py::init([](const std::vector<std::optional<int64_t>>& arg_of, const std::vector<py::object>& values) {
        check(arg_of.size() == values.size(), "GraphInputMatcher: ", arg_of.size(), " positions for ", values.size(),
              " values");
        InputMatch im;
        for (const auto& a : arg_of) im.arg_of.push_back(a.value_or(-1));
        im.values = values;
        return im;
      }), py::arg("arg_of_input"), py::arg("values"))
      .def("__call__", &match_inputs, py::arg("args"), "The graph's inputs for a call with these arguments, in graph order.");

  py::class_<GraphHash>(m, "GraphHash", "The 128-bit structural hash of a traced graph.")
      .def(py::init([](uint64_t hi, uint64_t lo) { return GraphHash{hi, lo}; }), py::arg("hi"), py::arg("lo"))
      .def_readonly("hi", &GraphHash::hi)
      .def_readonly("lo", &GraphHash::lo)
      .def("__eq__", [](const GraphHash& a, const GraphHash& b) { return a == b; }, py::is_operator())
      .def("__ne__", [](const GraphHash& a, const GraphHash& b) { return a != b; }, py::is_operator())
      .def("__hash__", [](const GraphHash& h) { return py::hash(py::make_tuple(h.hi, h.lo)); })
      .def("__bool__", [](const GraphHash& h) { return h.hi != 0 || h.lo != 0; })
      .def("__str__", &GraphHash::to_string)
      .def("__repr__", &hash_repr)
      .def("hex", &GraphHash::to_string, "32 lowercase hex digits.");

  m.def("invalidate_compiled_steps", &invalidate_compiled_steps,
        "Makes every compiled step retrace on its next call (after changing a value a step reads "
        "that is not a tensor's value; modules and optimizers call it themselves).");
  m.def("tensor_id", &tensor_id, py::arg("tensor"),
        "A process-unique id of the tensor, kept by in-place ops.");
  m.def("graph_hash", [](py::handle tensors) {
    std::vector<Tensor> ts = tensors_from(tensors, "graph_hash");
    py::gil_scoped_release release;
    return graph_hash(ts);
  }, py::arg("tensors"), "The hash the pending graph of these tensors compiles under; runs nothing.");
  m.def("warm_up_cache", [](py::handle tensors) {
    std::vector<Tensor> ts = tensors_from(tensors, "warm_up_cache");
    py::gil_scoped_release release;
    warm_up_cache(ts);
  }, py::arg("tensors"), "Compiles and caches the graph of these tensors; runs nothing.");
  m.def("graph_inputs", [](py::handle tensors) {
    std::vector<Tensor> ts = tensors_from(tensors, "graph_inputs");
    GraphInputs in;
    {
      py::gil_scoped_release release;
      in = graph_inputs(ts);
    }
    return py::make_tuple(py::cast(in.tensor_ids), to_list(in.values));
  }, py::arg("tensors"),
        "(tensor_ids, values): the graph's inputs in order. A tensor the traced code updated in "
        "place is returned as itself, holding its value from before the trace.");
  m.def("run_cached_graph", [](const GraphHash& h, py::handle inputs) {
    std::vector<Tensor> in = tensors_from(inputs, "run_cached_graph");
    std::vector<Tensor> out;
    {
      py::gil_scoped_release release;
      out = run_cached_graph(h, in);
    }
    // An output that is an input (updated in place) is returned as the caller's own object.
    std::vector<int64_t> in_ids(in.size());
    for (size_t i = 0; i < in.size(); ++i) in_ids[i] = tensor_id(in[i]);
    const auto given = py::reinterpret_borrow<py::sequence>(inputs);
    py::list result(out.size());
    for (size_t k = 0; k < out.size(); ++k) {
      const auto at = std::find(in_ids.begin(), in_ids.end(), tensor_id(out[k]));
      result[k] = at == in_ids.end() ? py::cast(out[k]) : given[static_cast<size_t>(at - in_ids.begin())];
    }
    return result;
  }, py::arg("graph_hash"), py::arg("inputs"),
        "Runs the warmed-up graph once on the inputs (in graph_inputs order), writing back every "
        "input the traced code updated in place. Returns every output of the graph (an updated "
        "input as the object given).");

  py::class_<PyCompiledStep>(m, "CompiledStep", "A step function traced once and replayed.")
      .def("__call__", [](PyCompiledStep& s, const py::args& args) -> py::object {
        std::vector<Tensor> out = s.run(tensors_from(args, "compiled step"));
        if (s.single()) return py::cast(out[0]);
        return to_tuple(out);
      })
      .def_property_readonly("traces", &PyCompiledStep::traces,
                             "How many times the step was traced (1 unless guards forced retraces).")
      // The step's lock is taken without the GIL (a call in another thread may be tracing).
      .def_property_readonly("variants", [](PyCompiledStep& s) {
        py::gil_scoped_release release;
        return s.step().variants();
      }, "Compiled variants held now (one per argument signature met, up to max_variants).")
      .def_property_readonly("variant_bytes", [](PyCompiledStep& s) {
        py::gil_scoped_release release;
        return s.step().variant_bytes();
      }, "Bytes the held variants are estimated to hold (arenas, constants, output buffers).")
      .def_property("max_variants", [](PyCompiledStep& s) {
        py::gil_scoped_release release;
        return s.step().max_variants();
      }, [](PyCompiledStep& s, int64_t n) {
        const uint64_t v = non_negative(n, "CompiledStep.max_variants", "the value");
        py::gil_scoped_release release;
        s.step().set_max_variants(v);
      }, "Most variants kept; beyond it the least recently used is evicted (at least 1).")
      .def_property("max_variant_bytes", [](PyCompiledStep& s) {
        py::gil_scoped_release release;
        return s.step().max_variant_bytes();
      }, [](PyCompiledStep& s, int64_t n) {
        const uint64_t v = non_negative(n, "CompiledStep.max_variant_bytes", "the value");
        py::gil_scoped_release release;
        s.step().set_max_variant_bytes(v);
      }, "Byte cap of the variants together (0: none); the least recently used are evicted first.");
  m.def("compile_step", &compile_step_py, py::arg("fn"), py::arg("example_args"), py::arg("retrace") = true,
        py::arg("max_variants") = static_cast<int64_t>(kDefaultMaxVariants),
        py::arg("max_variant_bytes") = static_cast<int64_t>(kDefaultMaxVariantBytes), py::arg("guard_reads") = true,
        "Traces fn(*example_args) once, without running it and leaving every tensor as it was. "
        "Each call of the result runs one step on new arguments without tracing; a call whose "
        "arguments do not match the trace retraces (retrace=True) or raises lazyrt.Error, and so "
        "does a call after a Python value fn reads changed (a global number, a closure's value, "
        "a function it calls, an item of a dict it reads: lazyrt._reads). One compiled variant is "
        "kept per argument signature and values met, at most max_variants of them and "
        "max_variant_bytes together (0: no byte cap), the least recently used evicted first. "
        "guard_reads=False: fn reads no Python value that changes (lazyrt.torch's own steps, "
        "whose captures guard the user's).");
}

}  // namespace lazyrt::python
