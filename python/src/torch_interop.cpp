// lazyrt._torch_C: what lazyrt.torch needs of PyTorch's C++ side (libtorch and its Python
// bindings). Built when CMake finds Torch; imported by lazyrt.torch only (after torch itself).
//
// bump_versions: a replay writes the new values of parameters, gradients and optimizer state
// into the torch tensors' own memory (lent with from_torch(_lend=True)). PyTorch counts every
// in-place change in the tensor's version counter, and autograd checks that counter before it
// uses a tensor it saved for backward; bumping it keeps that check: a graph recorded before a
// compiled step changed a parameter refuses to backpropagate, as it would in eager.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DefaultDtype.h>
#include <torch/csrc/Dtype.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

// ---- Guard ------------------------------------------------------------------------------------
// The facts lazyrt.torch's quick key (_capture.quick_key) compares between two calls, recorded
// from one call and checked on the next without building the key: what the step function
// reaches (its code, closure cells and the globals its code names, by identity), the
// arguments' shapes, dtypes and requires_grad, every submodule's training flag and parameter,
// buffer and child objects, every parameter's shape, dtype, requires_grad and gradient shape and
// dtype, every buffer's shape and dtype, each optimizer's groups (their parameters by identity,
// every hyperparameter but a learning rate read as an input, by plain value) and state layout
// (tensor shapes and dtypes, plain values), and the grad and autocast modes. Equal facts imply
// an equal quick key (the tests compare the two on changed worlds); any difference sends the
// call to the Python path, which decides. The recorded objects are held, so identities stay
// unique.

struct Meta {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool requires_grad = false;
};

bool is_tensor(py::handle h) { return THPVariable_Check(h.ptr()); }
const at::Tensor& tensor_of(py::handle h) { return THPVariable_Unpack(h.ptr()); }

Meta meta_of(const at::Tensor& t) { return {t.sizes().vec(), t.scalar_type(), t.requires_grad()}; }
bool same_meta(const at::Tensor& t, const Meta& m) { return t.scalar_type() == m.dtype && t.sizes().equals(m.sizes); }
c10::ScalarType dtype_of(py::handle dtype) { return reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type; }

// Python values compared by value (int, float, bool, str, None, tuples of them): same type and
// the same object or ==, as the quick key's tuple comparison does. Other values are not plain.
bool is_plain(py::handle v, bool nested = false) {
  PyObject* o = v.ptr();
  if (o == Py_None || PyBool_Check(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyUnicode_CheckExact(o))
    return true;
  if (!nested && PyTuple_CheckExact(o)) {
    for (py::handle x : py::reinterpret_borrow<py::tuple>(v))
      if (!is_plain(x, true)) return false;
    return true;
  }
  return false;
}
bool same_plain(py::handle v, py::handle expected) {
  if (v.ptr() == expected.ptr()) return true;
  if (Py_TYPE(v.ptr()) != Py_TYPE(expected.ptr()) || !is_plain(v)) return false;
  const int eq = PyObject_RichCompareBool(v.ptr(), expected.ptr(), Py_EQ);
  if (eq < 0) {
    PyErr_Clear();
    return false;
  }
  return eq == 1;
}

// The values of a dict in iteration order are these objects.
bool same_values(py::handle dict, const std::vector<py::object>& expected) {
  if (!dict || !PyDict_Check(dict.ptr()) || PyDict_Size(dict.ptr()) != static_cast<Py_ssize_t>(expected.size())) return false;
  Py_ssize_t pos = 0, i = 0;
  PyObject *k, *v;
  while (PyDict_Next(dict.ptr(), &pos, &k, &v))
    if (v != expected[static_cast<size_t>(i++)].ptr()) return false;
  return true;
}

std::vector<py::object> objects(py::handle seq) {
  std::vector<py::object> out;
  for (py::handle h : seq) out.push_back(py::reinterpret_borrow<py::object>(h));
  return out;
}

class Guard {
 public:
  // spec: function, code, cells [(cell, contents, empty)], globals, names [(name, value,
  // present)], args [tensors], world_tensors [parameters and buffers], submodules [(module,
  // training, parameters, buffers, children)], params [tensors], buffers [tensors], optimizers
  // [(optimizer, lr_input, groups [(params, [(key, value)])], states [(param, None or [(key,
  // value)])])], modes (grad enabled, default dtype, autocast, autocast dtype). Shapes, dtypes,
  // flags and gradients are read from the tensors now.
  explicit Guard(const py::dict& spec) {
    function_ = spec["function"];
    code_ = spec["code"];
    for (py::handle c : spec["cells"]) {
      auto t = c.cast<py::tuple>();
      cells_.push_back({t[0], t[1], t[2].cast<bool>()});
    }
    globals_ = spec["globals"];
    for (py::handle n : spec["names"]) {
      auto t = n.cast<py::tuple>();
      names_.push_back({t[0], t[1], t[2].cast<bool>()});
    }
    for (py::handle a : spec["args"]) args_.push_back(meta_of(tensor_of(a)));
    world_tensor_refs_ = spec["world_tensors"];
    for (py::handle t : world_tensor_refs_) world_tensors_.push_back(t.ptr());
    for (py::handle m : spec["submodules"]) {
      auto t = m.cast<py::tuple>();
      subs_.push_back({py::reinterpret_borrow<py::object>(t[0]), t[1].cast<bool>(), objects(t[2]), objects(t[3]),
                       objects(t[4])});
    }
    for (py::handle p : spec["params"]) {
      const at::Tensor& t = tensor_of(p);
      const at::Tensor& g = t.grad();
      params_.push_back({py::reinterpret_borrow<py::object>(p), meta_of(t), g.defined(), g.defined() ? meta_of(g) : Meta{}});
    }
    for (py::handle b : spec["buffers"]) buffers_.emplace_back(py::reinterpret_borrow<py::object>(b), meta_of(tensor_of(b)));
    for (py::handle o : spec["optimizers"]) {
      auto t = o.cast<py::tuple>();
      Optimizer opt;
      opt.object = py::reinterpret_borrow<py::object>(t[0]);
      opt.type = Py_TYPE(t[0].ptr());
      opt.lr_input = t[1].cast<bool>();
      for (py::handle g : t[2]) {
        auto gt = g.cast<py::tuple>();
        Group group;
        group.params = objects(gt[0]);
        for (py::handle kv : gt[1]) {
          auto pair = kv.cast<py::tuple>();
          group.entries.emplace_back(pair[0], pair[1]);
        }
        opt.groups.push_back(std::move(group));
      }
      for (py::handle st : t[3]) {
        auto stt = st.cast<py::tuple>();
        State state;
        state.param = py::reinterpret_borrow<py::object>(stt[0]);
        state.present = !stt[1].is_none();
        if (state.present)
          for (py::handle e : stt[1]) {
            auto et = e.cast<py::tuple>();
            StateEntry entry{py::reinterpret_borrow<py::object>(et[0]), is_tensor(et[1]), {},
                             py::reinterpret_borrow<py::object>(et[1])};
            if (entry.is_tensor) entry.meta = meta_of(tensor_of(et[1]));
            state.entries.push_back(std::move(entry));
          }
        opt.states.push_back(std::move(state));
      }
      optimizers_.push_back(std::move(opt));
    }
    auto modes = spec["modes"].cast<py::tuple>();
    grad_enabled_ = modes[0].cast<bool>();
    default_dtype_ = dtype_of(modes[1]);
    autocast_ = modes[2].cast<bool>();
    autocast_dtype_ = autocast_ ? dtype_of(modes[3]) : c10::ScalarType::Undefined;
  }

  bool check(const py::tuple& args) const {
    // What the function reaches.
    PyObject* f = function_.ptr();
    if (PyFunction_Check(f)) {
      if (PyFunction_GET_CODE(f) != code_.ptr()) return false;
    }
    for (const Ref& c : cells_)
      if (PyCell_GET(c.where.ptr()) != (c.present ? c.value.ptr() : nullptr)) return false;
    for (const Ref& n : names_) {
      PyObject* now = PyDict_GetItemWithError(globals_.ptr(), n.where.ptr());
      if (!now && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      if (now != (n.present ? n.value.ptr() : nullptr)) return false;
    }
    // Arguments.
    if (static_cast<size_t>(PyTuple_GET_SIZE(args.ptr())) != args_.size()) return false;
    for (size_t i = 0; i < args_.size(); ++i) {
      PyObject* a = PyTuple_GET_ITEM(args.ptr(), static_cast<Py_ssize_t>(i));
      if (!THPVariable_Check(a)) return false;
      const at::Tensor& t = THPVariable_Unpack(a);
      if (!same_meta(t, args_[i]) || t.requires_grad() != args_[i].requires_grad) return false;
      for (PyObject* w : world_tensors_)
        if (w == a) return false;
    }
    // Modules.
    for (const Sub& s : subs_) {
      PyObject* training = PyObject_GetAttrString(s.module.ptr(), "training");
      if (!training) {
        PyErr_Clear();
        return false;
      }
      const bool on = training == Py_True, bool_value = training == Py_True || training == Py_False;
      Py_DECREF(training);
      if (!bool_value || on != s.training) return false;
      if (!same_values(dict_attr(s.module, "_parameters"), s.params) ||
          !same_values(dict_attr(s.module, "_buffers"), s.buffers) ||
          !same_values(dict_attr(s.module, "_modules"), s.children))
        return false;
    }
    for (const Param& p : params_) {
      const at::Tensor& t = tensor_of(p.object);
      if (!same_meta(t, p.meta) || t.requires_grad() != p.meta.requires_grad) return false;
      const at::Tensor& g = t.grad();
      if (g.defined() != p.has_grad || (p.has_grad && !same_meta(g, p.grad))) return false;
    }
    for (const auto& [b, m] : buffers_)
      if (!same_meta(tensor_of(b), m)) return false;
    // Optimizers.
    for (const Optimizer& o : optimizers_) {
      if (Py_TYPE(o.object.ptr()) != o.type) return false;
      py::object groups = attr(o.object, "param_groups");
      if (!groups || !PyList_CheckExact(groups.ptr()) || PyList_GET_SIZE(groups.ptr()) != static_cast<Py_ssize_t>(o.groups.size()))
        return false;
      for (size_t gi = 0; gi < o.groups.size(); ++gi) {
        PyObject* g = PyList_GET_ITEM(groups.ptr(), static_cast<Py_ssize_t>(gi));
        if (!PyDict_Check(g) || !same_group(g, o.groups[gi], o.lr_input)) return false;
      }
      py::object state = attr(o.object, "state");
      if (!state || !PyDict_Check(state.ptr()) || !same_states(state.ptr(), o.states)) return false;
    }
    // Modes.
    const bool autocast = at::autocast::is_cpu_enabled();
    return at::GradMode::is_enabled() == grad_enabled_ &&
           c10::typeMetaToScalarType(c10::get_default_dtype()) == default_dtype_ && autocast == autocast_ &&
           (!autocast || at::autocast::get_autocast_cpu_dtype() == autocast_dtype_);
  }

 private:
  struct Sub {
    py::object module;
    bool training;
    std::vector<py::object> params, buffers, children;
  };
  struct Param {
    py::object object;
    Meta meta;
    bool has_grad;
    Meta grad;
  };
  struct Group {
    std::vector<py::object> params;
    std::vector<std::pair<py::object, py::object>> entries;  // (key, value): every key but params, in order
  };
  struct StateEntry {
    py::object key;
    bool is_tensor;
    Meta meta;
    py::object value;
  };
  struct State {
    py::object param;
    bool present;  // a non-empty state dict
    std::vector<StateEntry> entries;
  };
  struct Optimizer {
    py::object object;
    PyTypeObject* type;
    bool lr_input;
    std::vector<Group> groups;
    std::vector<State> states;
  };

  static py::object attr(const py::object& o, const char* name) {
    PyObject* v = PyObject_GetAttrString(o.ptr(), name);
    if (!v) PyErr_Clear();
    return py::reinterpret_steal<py::object>(v);
  }
  // A module's own dict entry (_parameters, _buffers, _modules live in its __dict__).
  static py::handle dict_attr(const py::object& module, const char* name) {
    PyObject** dict = _PyObject_GetDictPtr(module.ptr());
    if (!dict || !*dict) return py::handle();
    return PyDict_GetItemString(*dict, name);
  }

  static bool same_group(PyObject* g, const Group& group, bool lr_input) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    size_t e = 0;
    bool saw_params = false;
    while (PyDict_Next(g, &pos, &k, &v)) {
      if (PyUnicode_CheckExact(k) && PyUnicode_CompareWithASCIIString(k, "params") == 0) {
        if (!PyList_CheckExact(v) || PyList_GET_SIZE(v) != static_cast<Py_ssize_t>(group.params.size())) return false;
        for (size_t i = 0; i < group.params.size(); ++i)
          if (PyList_GET_ITEM(v, static_cast<Py_ssize_t>(i)) != group.params[i].ptr()) return false;
        saw_params = true;
        continue;
      }
      if (PyUnicode_CheckExact(k) && (PyUnicode_CompareWithASCIIString(k, "initial_lr") == 0 ||
                                      (lr_input && PyUnicode_CompareWithASCIIString(k, "lr") == 0)))
        continue;
      if (e >= group.entries.size() || !same_plain(k, group.entries[e].first) || !same_plain(v, group.entries[e].second))
        return false;
      ++e;
    }
    return saw_params && e == group.entries.size();
  }

  static bool same_states(PyObject* state, const std::vector<State>& states) {
    // The state dict's entries by key identity (parameters hash by id: no Python call).
    thread_local std::unordered_map<PyObject*, PyObject*> now;
    now.clear();
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(state, &pos, &k, &v)) now[k] = v;
    for (const State& s : states) {
      auto it = now.find(s.param.ptr());
      PyObject* d = it == now.end() ? nullptr : it->second;
      const bool present = d && (!PyDict_Check(d) || PyDict_Size(d) > 0);
      if (present != s.present) return false;
      if (!present) continue;
      if (!PyDict_Check(d) || PyDict_Size(d) != static_cast<Py_ssize_t>(s.entries.size())) return false;
      Py_ssize_t p = 0;
      size_t e = 0;
      while (PyDict_Next(d, &p, &k, &v)) {
        const StateEntry& entry = s.entries[e++];
        if (!same_plain(k, entry.key)) return false;
        if (entry.is_tensor) {
          if (!THPVariable_Check(v) || !same_meta(THPVariable_Unpack(v), entry.meta)) return false;
        } else if (THPVariable_Check(v) || !same_plain(v, entry.value)) {
          return false;
        }
      }
    }
    return true;
  }

  // A closure cell (or a global's name) and what it held: `value`, or nothing (!present).
  struct Ref {
    py::object where, value;
    bool present;
  };
  py::object function_, code_, globals_;
  std::vector<Ref> cells_, names_;
  std::vector<Meta> args_;
  std::vector<PyObject*> world_tensors_;  // parameters and buffers: no argument may be one
  py::object world_tensor_refs_;
  std::vector<Sub> subs_;
  std::vector<Param> params_;
  std::vector<std::pair<py::object, Meta>> buffers_;
  std::vector<Optimizer> optimizers_;
  bool grad_enabled_ = true, autocast_ = false;
  c10::ScalarType default_dtype_, autocast_dtype_;
};

}  // namespace

PYBIND11_MODULE(_torch_C, m) {
  m.doc() = "lazyrt.torch's use of PyTorch's C++ API";
  m.def(
      "bump_versions",
      [](const py::list& tensors, const std::vector<int64_t>& slots, const std::vector<int64_t>& skip) {
        size_t next_skip = 0;
        for (size_t j = 0; j < slots.size(); ++j) {
          if (next_skip < skip.size() && skip[next_skip] == static_cast<int64_t>(j)) {
            ++next_skip;
            continue;
          }
          py::handle h = tensors[slots[j]];
          if (!THPVariable_Check(h.ptr()))
            throw py::type_error("bump_versions: item " + std::to_string(slots[j]) + " is a " +
                                 std::string(py::str(py::type::handle_of(h).attr("__name__"))) +
                                 ", not a torch.Tensor");
          torch::autograd::impl::bump_version(THPVariable_Unpack(h.ptr()));
        }
      },
      py::arg("tensors"), py::arg("slots"), py::arg("skip"),
      "Counts one in-place change of tensors[s] for every s in slots, except the positions in "
      "skip (ascending).");
  py::class_<Guard>(m, "Guard", "The facts of a call's quick key, checked on the next call (see the source).")
      .def(py::init<const py::dict&>(), py::arg("spec"))
      .def("check", &Guard::check, py::arg("args"),
           "Whether a call with these positional arguments has the recorded facts.");
}
