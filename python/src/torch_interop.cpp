// lazyrt._torch_C: what lazyrt.torch needs of PyTorch's C++ side (libtorch and its Python
// bindings) and of lazyrt's. Built when CMake finds Torch; imported by lazyrt.torch only (after
// torch itself and lazyrt._C, whose types it shares).
//
// Guard: the facts of a call checked against the last call's (see below).
// Handover: a capture's inputs handed to its compiled step as lazyrt views of the torch
//   tensors' memory (kept from call to call), the memory of the tensors the step updates in
//   place lent for writing, and after the call the version counters of the written tensors
//   bumped (PyTorch counts every in-place change there, and autograd checks the counter before
//   it uses a tensor it saved for backward: a graph recorded before a compiled step changed a
//   parameter refuses to backpropagate, as in eager).
// Plan, Call: a capture's call plan, made at capture, and its executor, which runs every call
//   of the capture: resolve the inputs, hand them over, run the compiled step, bump, write back
//   what the step changed (gradients, optimizer state, inputs not updated in place), and return
//   the results as torch tensors over lazyrt's result buffers.
// shared_memory: which results of a call share memory with its inputs or each other (the
//   Dynamo backend copies those, so that every result is a tensor of its own).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DefaultDtype.h>
#include <torch/csrc/Dtype.h>

#include <algorithm>
#include <map>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "compiled_step.h"
#include "reads.h"
#include "torch_device.h"

namespace py = pybind11;
namespace lz = lazyrt;
namespace reads = lazyrt::python::reads;

namespace {

// ---- Guard ------------------------------------------------------------------------------------
// The facts two calls of a lazyrt.torch compiled step must share for the second to replay the
// first's capture (the one definition of them; built by _step._guard), recorded from one call
// and checked on the next: what the step function
// reaches (its code, closure cells and the globals its code names, by identity), the Python
// values the step reads (lazyrt._reads: plain values by value, the objects the walk went
// through by identity, where the checks before do not cover them), the arguments' shapes, dtypes and requires_grad, every submodule's training flag and parameter,
// buffer and child objects, every parameter's shape, dtype, requires_grad and gradient shape and
// dtype, every buffer's shape and dtype, each optimizer's groups (their parameters by identity,
// every hyperparameter but a learning rate read as an input, by plain value) and state layout
// (tensor shapes and dtypes, plain values), and the grad and autocast modes. Equal facts imply
// an equal signature and an accepting capture (the tests compare the two on changed worlds);
// any difference sends the call to the signature, which decides. The recorded objects are
// held, so identities stay unique.

struct Meta {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool requires_grad = false;
};

// Attribute and key names as interned Python strings (made once; their hashes are cached, and
// dict keys written as literals in Python are the same objects).
struct Names {
  PyObject *training, *parameters, *buffers, *modules, *param_groups, *state, *lr, *params, *initial_lr;
};
const Names& names() {
  static const Names n{PyUnicode_InternFromString("training"),   PyUnicode_InternFromString("_parameters"),
                       PyUnicode_InternFromString("_buffers"),   PyUnicode_InternFromString("_modules"),
                       PyUnicode_InternFromString("param_groups"), PyUnicode_InternFromString("state"),
                       PyUnicode_InternFromString("lr"),         PyUnicode_InternFromString("params"),
                       PyUnicode_InternFromString("initial_lr")};
  return n;
}
// Whether k is the string `name` (interned: usually the same object).
bool is_name(PyObject* k, PyObject* name) {
  return k == name || (PyUnicode_CheckExact(k) && PyUnicode_Compare(k, name) == 0);
}
// o.name, or null (no error set).
py::object attr(const py::object& o, PyObject* name) {
  PyObject* v = PyObject_GetAttr(o.ptr(), name);
  if (!v) PyErr_Clear();
  return py::reinterpret_steal<py::object>(v);
}

bool is_tensor(py::handle h) { return THPVariable_Check(h.ptr()); }
const at::Tensor& tensor_of(py::handle h) { return THPVariable_Unpack(h.ptr()); }

Meta meta_of(const at::Tensor& t) { return {t.sizes().vec(), t.scalar_type(), t.requires_grad()}; }
// Metas are recorded from strided tensors only: a sparse (or other storage-less) tensor never matches.
bool same_meta(const at::Tensor& t, const Meta& m) {
  return t.layout() == c10::Layout::Strided && t.scalar_type() == m.dtype && t.sizes().equals(m.sizes);
}
c10::ScalarType dtype_of(py::handle dtype) { return reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type; }

// The values of a dict in iteration order are these objects.
bool same_values(py::handle dict, const std::vector<py::object>& expected) {
  if (!dict || !PyDict_Check(dict.ptr()) || PyDict_Size(dict.ptr()) != static_cast<Py_ssize_t>(expected.size())) return false;
  Py_ssize_t pos = 0, i = 0;
  PyObject *k, *v;
  while (PyDict_Next(dict.ptr(), &pos, &k, &v))
    if (v != expected[static_cast<size_t>(i++)].ptr()) return false;
  return true;
}

// A torch tensor read from a place by its metadata (lazyrt.torch._reads.tensor_meta): its
// class, shape, dtype and device, strided.
struct TorchTensors {
  struct Meta {
    ::Meta meta;
    c10::Device device{c10::kCPU};
  };
  static bool is(PyObject* v) { return THPVariable_Check(v); }
  static Meta of(PyObject* v) {
    const at::Tensor& t = THPVariable_Unpack(v);
    return {meta_of(t), t.device()};
  }
  static bool same(PyObject* v, const Meta& m) {
    const at::Tensor& t = THPVariable_Unpack(v);
    return same_meta(t, m.meta) && t.device() == m.device;
  }
};
using ValueMeta = reads::ValueMeta<TorchTensors>;
using reads::is_plain;
using reads::item_of;
using reads::MetaLimits;
using reads::read_place;
using reads::same_plain;

std::vector<py::object> objects(py::handle seq) {
  std::vector<py::object> out;
  for (py::handle h : seq) out.push_back(py::reinterpret_borrow<py::object>(h));
  return out;
}

class Guard {
 public:
  // spec: function, code, cells [(cell, contents, present, by metadata)], globals, names
  // [(name, value, present, by metadata)], reads [(kind: see read_place; holder; key; present;
  // value; how: 0 by value, 1 by identity, 2 by its metadata)], limits (of the metadata: see
  // ValueMeta) (by metadata: the cell or name is compared as reads of how 2 are, not by identity), args [tensors], world_tensors [parameters and buffers], submodules [(module,
  // training, parameters, buffers, children)], params [tensors], buffers [tensors], optimizers
  // [(optimizer, lr_input, groups [(params, [(key, value)])], states [(param, None or [(key,
  // value)])])], modes (grad enabled, default dtype, autocast, autocast dtype). Shapes, dtypes,
  // flags and gradients are read from the tensors now.
  explicit Guard(const py::dict& spec) {
    function_ = spec["function"];
    code_ = spec["code"];
    if (spec.contains("limits")) {
      auto l = spec["limits"].cast<py::tuple>();
      limits_ = {l[0].cast<int>(), l[1].cast<Py_ssize_t>()};
    }
    auto ref = [this](const py::tuple& t) {
      Ref r{t[0], t[1], t[2].cast<bool>(), false, {}};
      if (t.size() > 3 && t[3].cast<bool>()) {
        r.by_meta = true;
        r.meta = ValueMeta::of(t[1].ptr(), limits_);
      }
      return r;
    };
    for (py::handle c : spec["cells"]) cells_.push_back(ref(c.cast<py::tuple>()));
    globals_ = spec["globals"];
    for (py::handle n : spec["names"]) names_.push_back(ref(n.cast<py::tuple>()));
    if (spec.contains("reads")) reads_ = reads::Reads<TorchTensors>(spec["reads"], limits_);
    for (py::handle a : spec["args"]) {
      Arg arg;
      if (THPVariable_Check(a.ptr())) {
        arg.meta = meta_of(tensor_of(a));
      } else {
        arg.tensor = false;
        arg.plain = is_plain(a);
        arg.value = py::reinterpret_borrow<py::object>(a);
      }
      args_.push_back(std::move(arg));
    }
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
    auto holds = [this](const Ref& r, PyObject* now) {
      if (r.by_meta) return r.meta.holds(now, limits_);
      return now == (r.present ? r.value.ptr() : nullptr);
    };
    for (const Ref& c : cells_)
      if (!holds(c, PyCell_GET(c.where.ptr()))) return false;
    for (const Ref& n : names_) {
      PyObject* now = PyDict_GetItemWithError(globals_.ptr(), n.where.ptr());
      if (!now && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      if (!holds(n, now)) return false;
    }
    // The Python values the step reads.
    if (!reads_.hold()) return false;
    // Arguments.
    if (static_cast<size_t>(PyTuple_GET_SIZE(args.ptr())) != args_.size()) return false;
    for (size_t i = 0; i < args_.size(); ++i) {
      PyObject* a = PyTuple_GET_ITEM(args.ptr(), static_cast<Py_ssize_t>(i));
      const Arg& want = args_[i];
      if (!want.tensor) {
        // A module, optimizer or other object: that very object (what discovery and the step
        // read through it is checked apart); a plain value: an equal one.
        if (want.plain ? !same_plain(a, want.value) : a != want.value.ptr()) return false;
        continue;
      }
      if (!THPVariable_Check(a)) return false;
      const at::Tensor& t = THPVariable_Unpack(a);
      if (!same_meta(t, want.meta) || t.requires_grad() != want.meta.requires_grad) return false;
      for (PyObject* w : world_tensors_)
        if (w == a) return false;
    }
    // Modules.
    for (const Sub& s : subs_) {
      PyObject* training = PyObject_GetAttr(s.module.ptr(), names().training);
      if (!training) {
        PyErr_Clear();
        return false;
      }
      const bool on = training == Py_True, bool_value = training == Py_True || training == Py_False;
      Py_DECREF(training);
      if (!bool_value || on != s.training) return false;
      if (!same_values(dict_attr(s.module, names().parameters), s.params) ||
          !same_values(dict_attr(s.module, names().buffers), s.buffers) ||
          !same_values(dict_attr(s.module, names().modules), s.children))
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
      py::object groups = attr(o.object, names().param_groups);
      if (!groups || !PyList_CheckExact(groups.ptr()) || PyList_GET_SIZE(groups.ptr()) != static_cast<Py_ssize_t>(o.groups.size()))
        return false;
      for (size_t gi = 0; gi < o.groups.size(); ++gi) {
        PyObject* g = PyList_GET_ITEM(groups.ptr(), static_cast<Py_ssize_t>(gi));
        if (!PyDict_Check(g) || !same_group(g, o.groups[gi], o.lr_input)) return false;
      }
      py::object state = attr(o.object, names().state);
      if (!state || !PyDict_Check(state.ptr()) || !same_states(state.ptr(), o.states)) return false;
    }
    // Modes.
    const bool autocast = at::autocast::is_autocast_enabled(at::kCPU);
    return at::GradMode::is_enabled() == grad_enabled_ &&
           c10::typeMetaToScalarType(c10::get_default_dtype()) == default_dtype_ && autocast == autocast_ &&
           (!autocast || at::autocast::get_autocast_dtype(at::kCPU) == autocast_dtype_);
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

  // A module's own dict entry (_parameters, _buffers, _modules live in its __dict__).
  static py::handle dict_attr(const py::object& module, PyObject* name) {
    PyObject** dict = _PyObject_GetDictPtr(module.ptr());
    if (!dict || !*dict) return py::handle();
    return PyDict_GetItem(*dict, name);
  }

  static bool same_group(PyObject* g, const Group& group, bool lr_input) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    size_t e = 0;
    bool saw_params = false;
    while (PyDict_Next(g, &pos, &k, &v)) {
      if (is_name(k, names().params)) {
        if (!PyList_CheckExact(v) || PyList_GET_SIZE(v) != static_cast<Py_ssize_t>(group.params.size())) return false;
        for (size_t i = 0; i < group.params.size(); ++i)
          if (PyList_GET_ITEM(v, static_cast<Py_ssize_t>(i)) != group.params[i].ptr()) return false;
        saw_params = true;
        continue;
      }
      if (is_name(k, names().initial_lr) || (lr_input && is_name(k, names().lr)))
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
    bool by_meta = false;  // compared by its metadata
    ValueMeta meta;
  };
  MetaLimits limits_;
  py::object function_, code_, globals_;
  std::vector<Ref> cells_, names_;
  reads::Reads<TorchTensors> reads_;
  // Per positional argument: a tensor's metadata, or a non-tensor compared by identity (or,
  // plain, by value).
  struct Arg {
    bool tensor = true;
    Meta meta;
    bool plain = false;
    py::object value;
  };
  std::vector<Arg> args_;
  std::vector<PyObject*> world_tensors_;  // parameters and buffers: no argument may be one
  py::object world_tensor_refs_;
  std::vector<Sub> subs_;
  std::vector<Param> params_;
  std::vector<std::pair<py::object, Meta>> buffers_;
  std::vector<Optimizer> optimizers_;
  bool grad_enabled_ = true, autocast_ = false;
  c10::ScalarType default_dtype_, autocast_dtype_;
};

// ---- Handover ---------------------------------------------------------------------------------

std::optional<lz::DType> lazyrt_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return lz::DType::f32;
    case c10::ScalarType::Double: return lz::DType::f64;
    case c10::ScalarType::Half: return lz::DType::f16;
    case c10::ScalarType::BFloat16: return lz::DType::bf16;
    case c10::ScalarType::Int: return lz::DType::i32;
    case c10::ScalarType::Long: return lz::DType::i64;
    case c10::ScalarType::Bool: return lz::DType::b8;
    default: return std::nullopt;
  }
}
c10::ScalarType torch_dtype(lz::DType d) {
  switch (d) {
    case lz::DType::f32: return c10::ScalarType::Float;
    case lz::DType::f64: return c10::ScalarType::Double;
    case lz::DType::f16: return c10::ScalarType::Half;
    case lz::DType::bf16: return c10::ScalarType::BFloat16;
    case lz::DType::i32: return c10::ScalarType::Int;
    case lz::DType::i64: return c10::ScalarType::Long;
    case lz::DType::b8: return c10::ScalarType::Bool;
  }
  return c10::ScalarType::Undefined;
}

// A torch tensor over a lazyrt tensor's values (synced), holding its buffer: lazyrt never writes
// into a buffer something else holds, so the tensor keeps the values it has now.
at::Tensor torch_view(const lz::Tensor& t) {
  std::shared_ptr<const void> host = t.host_data();
  void* data = const_cast<void*>(host.get());
  auto* holder = new std::shared_ptr<const void>(std::move(host));
  return at::from_blob(data, t.shape(), [holder](void*) { delete holder; },
                       at::TensorOptions().dtype(torch_dtype(t.dtype())));
}

// dtypes whose memory may be lent (lazyrt._step._PACKABLE).
bool lendable_dtype(c10::ScalarType t) {
  return t == c10::ScalarType::Float || t == c10::ScalarType::Double || t == c10::ScalarType::Half ||
         t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Int || t == c10::ScalarType::Long;
}

// An input of a call: a torch tensor, or a learning rate (a Python number).
struct Input {
  at::Tensor tensor;
  double number = 0;
  bool is_number = false;
};

using Span = std::pair<uintptr_t, uintptr_t>;  // bytes [first, one past the last)

bool contiguous_cpu(const at::Tensor& t) { return t.device().is_cpu() && t.is_contiguous(); }

// A tensor on the lazyrt device (lazyrt.torch._device): its value is a lazyrt tensor already.
bool on_lazyrt_device(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

// The lazyrt tensor of a lazyrt device tensor (its Python object's `_v`): the tensor itself, so
// that a compiled step reads it without a copy and writes its in-place updates into it.
lz::Tensor device_value(const at::Tensor& t) {
  py::gil_scoped_acquire gil;
  py::object obj = py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
  return obj.attr("_v").cast<lz::Tensor>();
}
// The bytes a contiguous CPU tensor occupies; for others, its whole storage (a bound on what
// they occupy), or nothing off the CPU.
Span span_of(const at::Tensor& t) {
  if (contiguous_cpu(t)) {
    const auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
    return {start, start + static_cast<uintptr_t>(t.numel()) * t.element_size()};
  }
  if (!t.device().is_cpu()) return {0, 0};
  const auto start = reinterpret_cast<uintptr_t>(t.storage().data());
  return {start, start + t.storage().nbytes()};
}

// Of the tensors `values` (undefined and empty ones are skipped), the positions whose memory
// overlaps an input's (the defined tensors of `inputs`) or an earlier value's that is kept: the
// caller copies those, as a copy overlaps nothing. Kept spans are disjoint, by start: log time
// each.
std::vector<size_t> shared_memory(const std::vector<at::Tensor>& values, const std::vector<at::Tensor>& inputs) {
  std::map<uintptr_t, uintptr_t> taken;  // start -> end, disjoint
  auto overlaps = [&](const Span& s) {
    auto it = taken.lower_bound(s.second);  // the spans starting before s's end precede it
    return it != taken.begin() && std::prev(it)->second > s.first;
  };
  for (const at::Tensor& t : inputs) {
    if (!t.defined()) continue;
    Span s = span_of(t);
    if (s.first >= s.second) continue;
    // Merged with the spans it overlaps: at most one starts before it.
    if (auto before = taken.lower_bound(s.first); before != taken.begin() && std::prev(before)->second > s.first)
      s.first = std::prev(before)->first;
    for (auto it = taken.lower_bound(s.first); it != taken.end() && it->first < s.second; it = taken.erase(it))
      s.second = std::max(s.second, it->second);
    taken[s.first] = s.second;
  }
  std::vector<size_t> copy;
  for (size_t k = 0; k < values.size(); ++k) {
    if (!values[k].defined()) continue;
    const Span s = span_of(values[k]);
    if (s.first >= s.second) continue;
    if (overlaps(s)) copy.push_back(k);
    else taken[s.first] = s.second;
  }
  return copy;
}
// The same over Python lists (non-tensors skipped).
std::vector<size_t> shared_memory_of(const py::list& values, const py::sequence& inputs) {
  auto tensors = [](py::handle seq) {
    std::vector<at::Tensor> out;
    for (py::handle h : seq) out.push_back(is_tensor(h) ? tensor_of(h) : at::Tensor());
    return out;
  };
  return shared_memory(tensors(values), tensors(inputs));
}

class Handover {
 public:
  // inputs: how many (slots, then the graph's constants); inplace: the slots the compiled step
  // updates in place (their memory is lent), in the order of the step's in-place items;
  // aliased: the exception class raised (with the slot) when a written input's memory overlaps
  // another input's.
  Handover(size_t inputs, std::vector<int64_t> inplace, py::object aliased)
      : held_(inputs), written_(inputs, false), inplace_(std::move(inplace)), aliased_(std::move(aliased)) {
    for (int64_t s : inplace_) {
      if (s < 0 || static_cast<size_t>(s) >= inputs)
        throw lz::Error("Handover: in-place slot " + std::to_string(s) + " out of " + std::to_string(inputs));
      written_[static_cast<size_t>(s)] = true;
    }
  }

  // The tensor standing in for slot s's missing gradient: never lent (lazyrt's writes must not
  // land in it; the call sets the new gradient).
  void standin(size_t s, const at::Tensor& t) {
    if (s >= held_.size()) throw lz::Error("Handover: slot " + std::to_string(s) + " out of " + std::to_string(held_.size()));
    standins_[s] = t;
    standin_impls_.insert(t.unsafeGetTensorImpl());
  }
  // Slot s's stand-in (undefined: none).
  at::Tensor standin_of(size_t s) const {
    auto it = standins_.find(s);
    return it == standins_.end() ? at::Tensor() : it->second;
  }
  bool has_standins() const { return !standins_.empty(); }

  // Lets go of the stand-ins and of the views kept of them (the gradients exist now; a later
  // call that misses one again gets a new stand-in). Waits for a call in flight.
  void forget_standins() {
    if (!turn_.try_lock()) {
      py::gil_scoped_release release;
      turn_.lock();
    }
    std::lock_guard<std::mutex> unlock(turn_, std::adopt_lock);
    for (Held& h : held_) {
      if (h.tensor.defined() && is_standin(h.tensor.unsafeGetTensorImpl())) {
        h = Held{};
        expect_valid_ = false;
      }
    }
    standins_.clear();
    standin_impls_.clear();
  }

  // The lazyrt views of this call's inputs. A slot's view is kept from call to call while the
  // slot holds the same tensor at the same address, contiguous: its memory, hence its values,
  // are then those the view reads (shapes and dtypes are guarded by the signature, and the view
  // keeps that memory alive, so no other tensor can take its address). A learning rate is a 0-d
  // float64 tensor, made anew when the value changes. The memory of each slot the step updates
  // in place is lent for writing, where that is safe: a contiguous CPU tensor of a lendable
  // dtype, not a stand-in, whose memory no other input overlaps (the step reads those while it
  // writes). Other views read their tensor's memory, or a contiguous copy of it. Throws the
  // aliased exception when a written input overlaps another input.
  //
  // A call holds the hand-over from views() to finish() or release(): calls of one step from
  // several threads (the step runs without the GIL) take turns, waiting without the GIL.
  const std::vector<lz::Tensor>& views(std::vector<Input> inputs) {
    if (inputs.size() != held_.size())
      throw lz::Error("lazyrt.torch: the step takes " + std::to_string(held_.size()) + " inputs, got " +
                      std::to_string(inputs.size()));
    if (!turn_.try_lock()) {
      py::gil_scoped_release release;
      turn_.lock();
    }
    held_turn_ = true;
    try {
      return make_views(std::move(inputs));
    } catch (...) {
      release();
      throw;
    }
  }

 private:
  const std::vector<lz::Tensor>& make_views(std::vector<Input> inputs) {
    current_ = std::move(inputs);
    lazy_.resize(current_.size());
    for (size_t s = 0; s < current_.size(); ++s) {
      const Input& in = current_[s];
      Held& h = held_[s];
      if (in.is_number) {
        lazy_[s] = number_view(h, in.number);
      } else if (h.view && h.tensor.unsafeGetTensorImpl() == in.tensor.unsafeGetTensorImpl() &&
                 in.tensor.data_ptr() == h.ptr && in.tensor.is_contiguous()) {
        lazy_[s] = *h.view;
      } else {
        lazy_[s] = new_view(s);
      }
    }
    if (!expect_valid_) lent_changed();
    return lazy_;
  }

 public:

  // After the step ran on views(): per in-place slot, its new value is in the lent memory (its
  // view still holds it): count the change in the tensor's version counter. Else (not lent, or
  // the replay could not write there) the view holds the new value elsewhere: copy it into the
  // tensor (which counts the change) and make the view anew next call; but not into a stand-in
  // for a missing gradient: those items are returned (position, new gradient), the caller sets
  // the gradient. The new gradient is a torch tensor over the view's buffer where nothing else
  // holds that buffer (no output, no other input's value: a first step's gradients cost no
  // copy, and no second copy of them is live at once), else a copy. Where the only holders of
  // a buffer are stand-ins' views (the zeros of a zero_grad() at the step's end, one buffer
  // per shape), the last of them takes the buffer and the others a copy: the copies are then
  // made with no more memory live than the gradients need.
  // keep: the call keeps its turn (it writes back what the step made after the call, and
  // calls release() when done); else finish() releases it.
  std::vector<std::pair<int64_t, at::Tensor>> finish(bool keep = false) {
    struct Done {
      Handover* h;
      bool keep;
      ~Done() {
        if (!keep) h->release();
      }
    } done{this, keep};
    struct Holders {
      long views = 0;  // stand-ins' views of the buffer
      long left = 0;   // of those, not yet handed over
    };
    // By the memory of each lazyrt value (Tensor::storage: null while pending).
    std::unordered_map<const void*, Holders> standin_views;
    for (size_t j = 0; j < inplace_.size(); ++j) {
      const auto s = static_cast<size_t>(inplace_[j]);
      const std::shared_ptr<void> data = lazy_[s].storage();
      if (data && is_standin(current_[s].tensor.unsafeGetTensorImpl())) {
        Holders& h = standin_views[data.get()];
        ++h.views;
        ++h.left;
      }
    }
    std::vector<std::pair<int64_t, at::Tensor>> left;
    for (size_t j = 0; j < inplace_.size(); ++j) {
      const auto s = static_cast<size_t>(inplace_[j]);
      const at::Tensor& t = current_[s].tensor;
      if (on_lazyrt_device(t)) {  // the step wrote the device tensor's own lazyrt tensor
        torch::autograd::impl::bump_version(t);
        continue;
      }
      const std::shared_ptr<void> data = lazy_[s].storage();
      const bool moved = !data || reinterpret_cast<uintptr_t>(data.get()) != expect_[j];
      if (!moved) {
        torch::autograd::impl::bump_version(t);
        continue;
      }
      held_[s] = Held{};
      expect_valid_ = false;
      if (is_standin(t.unsafeGetTensorImpl())) {
        c10::AutoGradMode no_grad(false);
        bool own = false;
        if (data) {
          Holders& h = standin_views.at(data.get());
          own = --h.left == 0 && data.use_count() == h.views + 1;  // + 1: `data` itself
        }
        at::Tensor grad = torch_view(lazy_[s]);
        left.emplace_back(static_cast<int64_t>(j), own ? grad : grad.clone());
        continue;
      }
      c10::AutoGradMode no_grad(false);
      at::Tensor target = t;
      target.copy_(torch_view(lazy_[s]));
    }
    return left;
  }

  // The dims of slot s's views to mark dynamic (bit d for dim d): mark_dynamic's, and
  // maybe_mark_dynamic's.
  void mark(size_t s, uint64_t hard, uint64_t soft) {
    if (s >= held_.size()) throw lz::Error("Handover: slot " + std::to_string(s) + " out of " + std::to_string(held_.size()));
    marks_.resize(held_.size());
    marks_[s] = {hard, soft};
    held_[s] = Held{};  // a kept view is made again, marked
    expect_valid_ = false;
  }

  // Drops this call's inputs (not the kept views).
  void release() {
    current_.clear();
    lazy_.clear();
    if (held_turn_) {
      held_turn_ = false;
      turn_.unlock();
    }
  }

  size_t inputs() const { return held_.size(); }
  /// Whether the step updates input s in place.
  bool written(size_t s) const { return s < written_.size() && written_[s]; }

 private:
  struct Held {
    at::Tensor tensor;  // the tensor the view was made for (keeps its identity unique)
    void* ptr = nullptr;
    std::optional<lz::Tensor> view;
    bool lent = false;
    double number = 0;  // a learning rate's view: its value
  };

  lz::Tensor number_view(Held& h, double v) {
    if (!h.view || std::memcmp(&h.number, &v, sizeof v) != 0) {
      h.view = lz::from_blob(&v, {}, lz::DType::f64);
      h.number = v;
    }
    return *h.view;
  }

  bool is_standin(const at::TensorImpl* impl) const { return standin_impls_.count(impl) != 0; }

  [[noreturn]] void raise_aliased(size_t s) const {
    py::object e = aliased_(s);
    PyErr_SetObject(aliased_.ptr(), e.ptr());
    throw py::error_already_set();
  }

  lz::Tensor new_view(size_t s) {
    lz::Tensor v = unmarked_view(s);
    if (s < marks_.size() && !on_lazyrt_device(current_[s].tensor)) {
      const auto [hard, soft] = marks_[s];
      for (int64_t d = 0; d < 64; ++d) {
        if ((hard >> d) & 1) lz::mark_dynamic(v, d);
        if ((soft >> d) & 1) lz::maybe_mark_dynamic(v, d);
      }
    }
    return v;
  }

  lz::Tensor unmarked_view(size_t s) {
    const at::Tensor& t = current_[s].tensor;
    Held& h = held_[s];
    if (on_lazyrt_device(t)) {  // its own lazyrt tensor: nothing to lend or copy, nothing kept
      if (h.lent || written_[s]) expect_valid_ = false;
      h = Held{};
      return device_value(t);
    }
    const bool contiguous = contiguous_cpu(t);
    const Span span = span_of(t);
    const bool written = written_[s];
    // Stand-ins share one buffer of zeros; they are only read, so their overlap is no aliasing.
    const bool standin = is_standin(t.unsafeGetTensorImpl());
    if (!standin && span.first < span.second && (written ? overlaps_any(span, s) : written_overlapping(span, s)))
      raise_aliased(s);
    const std::optional<lz::DType> dtype = lazyrt_dtype(t.scalar_type());
    if (!dtype)
      throw lz::Error(std::string("lazyrt.torch: torch dtype ") + c10::toString(t.scalar_type()) +
                      " has no lazyrt counterpart");
    if (!contiguous) {
      if (h.lent || written) expect_valid_ = false;
      h = Held{};
      return view_of(t.detach().cpu().contiguous(), *dtype, false);
    }
    const bool lend = written && lendable_dtype(t.scalar_type()) && span.first < span.second && !standin;
    if (written) expect_valid_ = false;
    lz::Tensor v = view_of(t, *dtype, lend);
    h.tensor = t;
    h.ptr = t.data_ptr();
    h.view = v;
    h.lent = lend;
    return v;
  }

  static lz::Tensor view_of(const at::Tensor& t, lz::DType dtype, bool lend) {
    lz::Shape shape(t.sizes().begin(), t.sizes().end());
    if (t.numel() == 0) return lz::from_blob(nullptr, std::move(shape), dtype, nullptr);
    auto* owner = new c10::Storage(t.storage());  // the memory, not the tensor's autograd history
    return lz::from_blob(t.data_ptr(), std::move(shape), dtype, [owner] { delete owner; }, lend);
  }

  bool overlaps_any(const Span& span, size_t s) const {
    for (size_t r = 0; r < current_.size(); ++r) {
      if (r == s || current_[r].is_number || is_standin(current_[r].tensor.unsafeGetTensorImpl())) continue;
      const Span other = span_of(current_[r].tensor);
      if (other.first < span.second && span.first < other.second) return true;
    }
    return false;
  }

  // Whether the memory of a written slot other than s, as last handed over, overlaps span.
  // Written slots' spans are disjoint (else the call ran eagerly) and sorted: only the last one
  // starting before span's end can overlap.
  bool written_overlapping(const Span& span, size_t s) const {
    auto it = std::lower_bound(written_spans_.begin(), written_spans_.end(), span.second,
                               [](const WrittenSpan& w, uintptr_t end) { return w.first < end; });
    while (it != written_spans_.begin()) {
      --it;
      if (it->slot == s) continue;
      return it->second > span.first;
    }
    return false;
  }

  // After a written slot got a new view: the sorted spans of the written slots' memory, and per
  // in-place item the address its view must still hold after a call (0 where not lent).
  void lent_changed() {
    written_spans_.clear();
    for (size_t s = 0; s < written_.size(); ++s) {
      if (!written_[s] || current_[s].is_number || is_standin(current_[s].tensor.unsafeGetTensorImpl())) continue;
      const Span sp = span_of(current_[s].tensor);
      written_spans_.push_back({sp.first, sp.second, s});
    }
    std::sort(written_spans_.begin(), written_spans_.end(),
              [](const WrittenSpan& a, const WrittenSpan& b) { return a.first < b.first; });
    expect_.clear();
    for (int64_t s : inplace_) {
      const Held& h = held_[static_cast<size_t>(s)];
      expect_.push_back(h.lent ? reinterpret_cast<uintptr_t>(h.ptr) : 0);
    }
    expect_valid_ = true;
  }

  struct WrittenSpan {
    uintptr_t first, second;
    size_t slot;
  };

  std::vector<Held> held_;
  std::vector<std::pair<uint64_t, uint64_t>> marks_;  // per slot (see mark)
  std::vector<bool> written_;
  std::vector<int64_t> inplace_;
  py::object aliased_;
  std::unordered_map<size_t, at::Tensor> standins_;  // slot -> its stand-in
  std::unordered_set<const at::TensorImpl*> standin_impls_;  // of standins_
  std::vector<WrittenSpan> written_spans_;
  std::vector<uintptr_t> expect_;
  bool expect_valid_ = false;
  std::vector<Input> current_;  // this call's inputs and views, between views() and finish()
  std::vector<lz::Tensor> lazy_;
  std::mutex turn_;  // held by the call between views() and finish() or release()
  bool held_turn_ = false;
};

// The inputs of a call as Python gives them: torch tensors and numbers.
std::vector<Input> inputs_from(const py::sequence& seq) {
  std::vector<Input> out(static_cast<size_t>(py::len(seq)));
  for (size_t i = 0; i < out.size(); ++i) {
    py::object o = seq[i];
    if (THPVariable_Check(o.ptr())) {
      out[i].tensor = THPVariable_Unpack(o.ptr());
    } else if (PyFloat_CheckExact(o.ptr())) {
      out[i].number = PyFloat_AS_DOUBLE(o.ptr());
      out[i].is_number = true;
    } else {
      throw py::type_error("lazyrt.torch: input " + std::to_string(i) + " is a " +
                           std::string(py::str(py::type::handle_of(o).attr("__name__"))) +
                           ", not a torch.Tensor or a float");
    }
  }
  return out;
}

// ---- Plan and Call ----------------------------------------------------------------------------
// A capture's call plan (made once, at capture, from lazyrt.torch._step's typed items) and its
// executor, bound to the objects of one world: every call of a capture runs here, guarded (the
// Guard holds: the fast call) or not (a call the guard cannot cover: Python found the capture).

// What an input of the step is read from each call.
enum class Source { Arg, Tensor, Grad, State, Lr, Place };
// What a write-back after the step writes: an input slot's tensor, a parameter's gradient, an
// optimizer's state entry.
enum class Target { Slot, Grad, State };
// How: copy into the tensor there (a new tensor where there is none), set a new tensor, clear
// (a gradient set to None), set a constant (a state entry that is a plain value).
enum class How { Update, New, Clear, Const };
// A result leaf: a constant, an input as it is after the call, a root's value (the torch view of
// its output where nothing else reads that output, else a copy), a new lazyrt device tensor of a
// value.
enum class Leaf { Const, Input, Output, Device };

// Where a value comes from after the step: an input slot as it was before the call (output
// false: a copy taken before the step ran), or a root of the lowered graph (output true).
struct Value {
  bool output = false;
  size_t index = 0;
};
Value value_of(py::handle h) {
  auto t = h.cast<py::tuple>();
  return {t[0].cast<bool>(), t[1].cast<size_t>()};
}

class Plan {
 public:
  struct Write {
    Target target = Target::Slot;
    size_t key = 0;       // Slot: the slot; Grad, State: the parameter (its index in the world)
    size_t optimizer = 0;  // State: the optimizer
    py::object state_key, constant;
    How how = How::Update;
    Value value;
    bool take = false;  // the value is an output no other write or result reads: no copy
  };
  struct Result {
    Leaf kind = Leaf::Const;
    Value value;
    py::object constant;
    bool own = false;  // Output: the output is this result's alone (handed out as its view)
  };
  // Where a root of the lowered graph is among the step's outputs: an output of its own
  // (position), or a piece of its dtype's packed output (group, offset, numel, shape).
  struct Where {
    int64_t position = -1, group = -1, offset = 0, numel = 0;
    std::vector<int64_t> shape;
  };

  // spec: writes [Write items: (target, key, how, value, constant)], results [Result items:
  // (kind, value, constant)], roots (how many), direct [roots, in output order], groups
  // [(roots, sizes, shapes)], snapshots [input slots a write reads as before the call],
  // inplace_grads [per in-place item, the parameter whose gradient it is, or -1], spec (the
  // results' pytree spec), single (one result, returned as is), side_attrs [(module, name)
  // set to the tensors the step returns after its results].
  explicit Plan(const py::dict& spec) {
    where.resize(spec["roots"].cast<size_t>());
    size_t position = 0;
    for (py::handle h : spec["direct"]) where.at(h.cast<size_t>()).position = static_cast<int64_t>(position++);
    outputs = position;
    int64_t g = 0;
    for (py::handle h : spec["groups"]) {
      auto t = h.cast<py::tuple>();
      auto roots = t[0].cast<std::vector<size_t>>();
      auto sizes = t[1].cast<std::vector<int64_t>>();
      auto shapes = t[2].cast<std::vector<std::vector<int64_t>>>();
      int64_t offset = 0;
      for (size_t j = 0; j < roots.size(); ++j) {
        Where& w = where.at(roots[j]);
        w.group = g;
        w.offset = offset;
        w.numel = sizes.at(j);
        w.shape = shapes.at(j);
        offset += sizes[j];
      }
      ++g;
    }
    groups = static_cast<size_t>(g);
    std::vector<int> uses(where.size(), 0);
    for (py::handle h : spec["writes"]) {
      auto t = h.cast<py::tuple>();
      Write w;
      w.target = t[0].cast<Target>();
      w.how = t[2].cast<How>();
      if (w.target == Target::State) {
        auto key = t[1].cast<py::tuple>();
        w.optimizer = key[0].cast<size_t>();
        w.key = key[1].cast<size_t>();
        w.state_key = key[2];
      } else {
        w.key = t[1].cast<size_t>();
      }
      if (w.how == How::Update || w.how == How::New) w.value = checked(value_of(t[3]));
      w.constant = t[4];
      if (w.value.output && (w.how == How::Update || w.how == How::New)) ++uses[w.value.index];
      writes.push_back(std::move(w));
    }
    for (py::handle h : spec["results"]) {
      auto t = h.cast<py::tuple>();
      Result r;
      r.kind = t[0].cast<Leaf>();
      if (r.kind == Leaf::Const) r.constant = t[2];
      else r.value = checked(value_of(t[1]));
      if ((r.kind == Leaf::Output || r.kind == Leaf::Device) && !r.value.output)
        throw lz::Error("Plan: a result read from an output is an input");
      if (r.value.output && r.kind != Leaf::Const) ++uses[r.value.index];
      results.push_back(std::move(r));
    }
    for (Write& w : writes) {
      w.take = w.how == How::New && w.value.output && uses[w.value.index] == 1 && where[w.value.index].position >= 0;
      if (w.take) handed.push_back(static_cast<size_t>(where[w.value.index].position));
    }
    for (Result& r : results) {
      r.own = r.kind == Leaf::Output && uses[r.value.index] == 1 && where[r.value.index].position >= 0;
      if (r.own) handed.push_back(static_cast<size_t>(where[r.value.index].position));
    }
    snapshots = spec["snapshots"].cast<std::vector<size_t>>();
    inplace_grads = spec["inplace_grads"].cast<std::vector<int64_t>>();
    result_spec = spec["spec"];
    single = spec["single"].cast<bool>();
    for (py::handle h : spec["side_attrs"]) {
      auto t = h.cast<py::tuple>();
      side_attrs.emplace_back(py::reinterpret_borrow<py::object>(t[0]), py::reinterpret_borrow<py::object>(t[1]));
    }
  }

  std::vector<Write> writes;
  std::vector<Result> results;
  std::vector<Where> where;  // per root
  size_t outputs = 0, groups = 0;  // the step's outputs: `outputs` of their own, then the groups
  std::vector<size_t> snapshots;
  std::vector<int64_t> inplace_grads;
  std::vector<size_t> handed;  // the outputs handed out as views: taken writes' and own results'
  py::object result_spec;
  bool single = false;
  std::vector<std::pair<py::object, py::object>> side_attrs;

 private:
  Value checked(Value v) const {
    if (v.output && (v.index >= where.size() || (where[v.index].position < 0 && where[v.index].group < 0)))
      throw lz::Error("Plan: root " + std::to_string(v.index) + " is read but no output of the step");
    return v;
  }
};

class Call {
 public:
  // spec: plan (a Plan), guard (a Guard, or None: run() only), handover (a Handover), step (the
  // compiled step, or None), runner (runner(views) -> the step's outputs: the first call, which
  // compiles, and steps with graph breaks), inputs [per input: (Source.Arg, index) |
  // (Source.Tensor, t) | (Source.Grad, parameter) | (Source.State, optimizer, parameter, key) |
  // (Source.Lr, optimizer, group index) | (Source.Place, kind, holder, key, path): a tensor
  // read from a place of lazyrt._reads, at a path of keys in its tuples, lists and dicts],
  // params, optimizers (the world's, by index), moved (a torch tensor's values as a new lazyrt
  // device tensor), device_result (a value as a result on the lazyrt device), miss (returned
  // when the guard does not hold), other (returned when an input is not found: nothing ran).
  explicit Call(const py::dict& spec) {
    plan_object_ = spec["plan"];
    plan_ = plan_object_.cast<Plan*>();
    guard_object_ = spec["guard"];
    guard_ = guard_object_.is_none() ? nullptr : guard_object_.cast<Guard*>();
    handover_object_ = spec["handover"];
    handover_ = handover_object_.cast<Handover*>();
    set_step(spec["step"]);
    runner_ = spec["runner"];
    for (py::handle h : spec["inputs"]) {
      auto t = h.cast<py::tuple>();
      Src src;
      src.kind = t[0].cast<Source>();
      switch (src.kind) {
        case Source::Arg: src.index = t[1].cast<Py_ssize_t>(); break;
        case Source::Tensor:
        case Source::Grad:
          src.tensor = THPVariable_Unpack(t[1].ptr());
          src.object = py::reinterpret_borrow<py::object>(t[1]);
          break;
        case Source::State: {
          src.object = py::reinterpret_borrow<py::object>(t[1]);
          src.param = py::reinterpret_borrow<py::object>(t[2]);
          src.key = py::reinterpret_borrow<py::object>(t[3]);
          auto it = std::find_if(states_.begin(), states_.end(),
                                 [&](const OptimizerState& o) { return o.optimizer.ptr() == src.object.ptr(); });
          src.index = it - states_.begin();
          if (it == states_.end()) states_.push_back({src.object, {}});
          break;
        }
        case Source::Lr:
          src.object = py::reinterpret_borrow<py::object>(t[1]);
          src.index = t[2].cast<Py_ssize_t>();
          break;
        case Source::Place:
          src.index = t[1].cast<int>();
          src.object = py::reinterpret_borrow<py::object>(t[2]);
          src.key = py::reinterpret_borrow<py::object>(t[3]);
          src.path = objects(t[4]);
          break;
      }
      inputs_.push_back(std::move(src));
    }
    if (inputs_.size() != handover_->inputs())
      throw lz::Error("Call: " + std::to_string(inputs_.size()) + " inputs for a hand-over of " +
                      std::to_string(handover_->inputs()));
    for (py::handle p : spec["params"]) params_.push_back(py::reinterpret_borrow<py::object>(p));
    for (py::handle o : spec["optimizers"]) optimizers_.push_back(py::reinterpret_borrow<py::object>(o));
    moved_ = spec["moved"];
    device_result_ = spec["device_result"];
    miss_ = spec["miss"];
    other_ = spec["other"];
    unflatten_ = py::module_::import("torch.utils._pytree").attr("tree_unflatten");
  }

  void set_step(const py::object& step) {
    step_object_ = step;
    step_ = step.is_none() ? nullptr : step.cast<lz::python::PyCompiledStep*>();
  }

  // A guarded call: miss where the guard fails, other where an input is not found.
  py::object call(const py::tuple& args) {
    if (!guard_ || !guard_->check(args)) return miss_;
    std::vector<Input> inputs;
    if (!resolve_all(args, inputs, nullptr)) return other_;
    py::object r = execute(args, std::move(inputs));
    static lz::metrics::Counter calls("TorchFastCall");
    calls.add(1);
    return r;
  }

  // A call Python found the capture for (args: the call's argument leaves); raises where an
  // input is not found.
  py::object run(const py::tuple& args) {
    std::vector<Input> inputs;
    std::string missing;
    if (!resolve_all(args, inputs, &missing)) throw lz::Error("lazyrt.torch: the captured step's " + missing);
    return execute(args, std::move(inputs));
  }

 private:
  struct Src {
    Source kind = Source::Arg;
    Py_ssize_t index = 0;  // Arg: position; State: the optimizer in states_; Lr: the group; Place: its kind
    at::Tensor tensor;  // Tensor: the tensor; Grad: the parameter
    py::object object, param, key;  // Tensor, Grad: the tensor; State: optimizer, parameter, key; Lr:
                                    // optimizer; Place: holder, key
    std::vector<py::object> path;   // Place: the keys of its item
  };

  // An optimizer's state dict this call, by parameter identity (a parameter's hash is a Python
  // call: torch.Tensor.__hash__).
  struct OptimizerState {
    py::object optimizer;
    std::unordered_map<PyObject*, PyObject*> by_param;
    bool read() {
      by_param.clear();
      py::object state = attr(optimizer, names().state);
      if (!state || !PyDict_Check(state.ptr())) return false;
      Py_ssize_t pos = 0;
      PyObject *k, *v;
      while (PyDict_Next(state.ptr(), &pos, &k, &v)) by_param[k] = v;  // borrowed: the state dict holds them
      return true;
    }
  };

  bool resolve_all(const py::tuple& args, std::vector<Input>& inputs, std::string* missing) {
    for (OptimizerState& o : states_) {
      if (!o.read()) {
        if (missing) *missing = "optimizer has no state dict";
        return false;
      }
    }
    inputs.resize(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (!resolve(i, args, inputs[i])) {
        static const char* kinds[] = {"argument", "tensor", "gradient", "optimizer state", "learning rate",
                                      "tensor read from a place"};
        if (missing) *missing = "input " + std::to_string(i) + " (a " + kinds[static_cast<int>(inputs_[i].kind)] +
                                ") is not where the capture found it";
        return false;
      }
    }
    return true;
  }

  // Where input i is this call; false where it is not found (a missing gradient without a
  // stand-in, missing state, a learning rate that is no number).
  bool resolve(size_t i, const py::tuple& args, Input& in) const {
    const Src& src = inputs_[i];
    switch (src.kind) {
      case Source::Arg:
        if (src.index >= PyTuple_GET_SIZE(args.ptr())) return false;
        in.tensor = THPVariable_Unpack(PyTuple_GET_ITEM(args.ptr(), src.index));  // its metadata: guarded
        return true;
      case Source::Tensor:
        in.tensor = src.tensor;
        return true;
      case Source::Place: {  // (its metadata: guarded)
        PyObject* v = read_place(static_cast<int>(src.index), src.object, src.key);
        for (const py::object& k : src.path)
          if (v) v = item_of(v, k.ptr());
        if (!v || !THPVariable_Check(v)) return clear();
        in.tensor = THPVariable_Unpack(v);
        return true;
      }
      case Source::Grad:
        in.tensor = src.tensor.grad();
        if (!in.tensor.defined()) in.tensor = handover_->standin_of(i);
        return in.tensor.defined();
      case Source::State: {
        const auto& by_param = states_[static_cast<size_t>(src.index)].by_param;
        auto it = by_param.find(src.param.ptr());
        if (it == by_param.end() || !PyDict_Check(it->second)) return false;
        PyObject* v = PyDict_GetItemWithError(it->second, src.key.ptr());
        if (!v || !THPVariable_Check(v)) return clear();
        in.tensor = THPVariable_Unpack(v);
        return true;
      }
      case Source::Lr: {
        py::object groups = attr(src.object, names().param_groups);
        if (!groups || !PyList_Check(groups.ptr()) || PyList_GET_SIZE(groups.ptr()) <= src.index) return false;
        PyObject* g = PyList_GET_ITEM(groups.ptr(), src.index);
        if (!PyDict_Check(g)) return false;
        PyObject* lr = PyDict_GetItemWithError(g, names().lr);
        if (!lr) return clear();
        if (PyFloat_CheckExact(lr)) {
          in.number = PyFloat_AS_DOUBLE(lr);
        } else {  // an int, a 0-d tensor: float(lr)
          in.number = PyFloat_AsDouble(lr);
          if (in.number == -1.0 && PyErr_Occurred()) return clear();
        }
        in.is_number = true;
        return true;
      }
    }
    return false;
  }
  static bool clear() {
    PyErr_Clear();
    return false;
  }

  bool on_device(size_t param) const { return on_lazyrt_device(THPVariable_Unpack(params_.at(param).ptr())); }
  static py::object wrap(at::Tensor t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))); }

  // One call's values after the step ran.
  struct Values {
    std::vector<lz::Tensor> outs;
    std::vector<at::Tensor> packed;  // torch views of the groups' outputs (made when first read)
    std::vector<at::Tensor> before;  // per input slot read as before the call: that value
    std::vector<at::Tensor> handed;  // per output handed out: the tensor handed out for it
  };
  // The outputs a call hands out as torch views of lazyrt's buffers (results of their own,
  // gradients and state taken without a copy) are tensors of their own, as eager's are. The
  // buffer lazyrt returns for an output may be an input's memory (a clone of an argument is
  // the argument to lazyrt; a parameter written in place) or another output's (two equal
  // results computed once): such a view is copied.
  void hand_out(const std::vector<Input>& inputs, Values& vals) const {
    if (plan_->handed.empty()) return;
    std::vector<at::Tensor> views, in;
    for (size_t pos : plan_->handed) views.push_back(torch_view(vals.outs.at(pos)));
    for (const Input& i : inputs) in.push_back(i.is_number ? at::Tensor() : i.tensor);
    for (size_t k : shared_memory(views, in)) views[k] = views[k].clone();
    for (size_t k = 0; k < views.size(); ++k) vals.handed[plan_->handed[k]] = std::move(views[k]);
  }
  at::Tensor value(const Value& v, Values& vals) const {
    if (!v.output) return vals.before.at(v.index);  // (snapshots: every slot a write reads)
    const Plan::Where& w = plan_->where[v.index];
    if (w.position >= 0) return torch_view(vals.outs.at(static_cast<size_t>(w.position)));
    at::Tensor& group = vals.packed.at(static_cast<size_t>(w.group));
    if (!group.defined()) group = torch_view(vals.outs.at(plan_->outputs + static_cast<size_t>(w.group)));
    return group.narrow(0, w.offset, w.numel).view(w.shape);
  }
  // A tensor of its own with a write's value, on the device of parameter `param` (the lazyrt
  // device's tensors get theirs there): the output's own view where nothing else reads it.
  py::object fresh(const Plan::Write& w, size_t param, Values& vals) const {
    if (w.take && !on_device(param)) return wrap(vals.handed.at(static_cast<size_t>(plan_->where[w.value.index].position)));
    at::Tensor v = value(w.value, vals);
    return on_device(param) ? moved_(wrap(v)) : wrap(v.clone());
  }
  void set_grad(size_t param, py::object grad) const {
    if (on_device(param)) {
      py::setattr(params_[param], "grad", grad);
    } else {
      THPVariable_Unpack(params_[param].ptr()).mutable_grad() =
          grad.is_none() ? at::Tensor() : THPVariable_Unpack(grad.ptr());
    }
  }

  py::object execute(const py::tuple& args, std::vector<Input> inputs) {
    Values vals;
    vals.packed.resize(plan_->groups);
    vals.handed.resize(plan_->outputs);
    if (!plan_->snapshots.empty()) vals.before.resize(inputs.size());
    try {
      const std::vector<lz::Tensor>& views = handover_->views(inputs);
      // Inputs a write-back reads as before the call, read before anything is written (and
      // after views(): no other call of this step writes them while this one holds its turn).
      for (size_t s : plan_->snapshots) {
        const Input& in = inputs.at(s);
        vals.before[s] = in.is_number ? at::scalar_tensor(in.number, at::kDouble) : in.tensor.detach().clone();
      }
      if (step_) {
        vals.outs = step_->run(views);
      } else {
        py::list l(views.size());
        for (size_t i = 0; i < views.size(); ++i) l[i] = py::cast(views[i]);
        for (py::handle h : runner_(l)) vals.outs.push_back(h.cast<lz::Tensor>());
      }
    } catch (...) {
      handover_->release();
      throw;
    }
    if (vals.outs.size() != plan_->outputs + plan_->groups)
      throw lz::Error("lazyrt.torch: the step returned " + std::to_string(vals.outs.size()) + " outputs, expected " +
                      std::to_string(plan_->outputs + plan_->groups));
    // Written in place: the new values are in the torch tensors' memory (the hand-over bumps
    // their version counters), or copied in where they could not land there; a missing
    // gradient written into a stand-in's view is set here. The call keeps its turn until its
    // write-backs are done: no other call of the step reads a tensor this one still writes.
    struct Release {
      Handover* h;
      ~Release() { h->release(); }
    };
    py::object result;
    {
      Release release{handover_};
      for (auto& [j, grad] : handover_->finish(/*keep=*/true)) {
        const int64_t p = plan_->inplace_grads.at(static_cast<size_t>(j));
        if (p < 0) throw lz::Error("lazyrt.torch: a stand-in was written by an item that is no gradient");
        set_grad(static_cast<size_t>(p), on_device(static_cast<size_t>(p)) ? moved_(wrap(grad)) : wrap(grad));
      }
      c10::AutoGradMode no_grad(false);
      hand_out(inputs, vals);
      // The results are taken before the write-backs (a result's copy of an output whose
      // buffer is an input's memory has the values the step returned).
      py::list leaves(plan_->results.size());
      for (size_t i = 0; i < plan_->results.size(); ++i) leaves[i] = leaf(plan_->results[i], args, inputs, vals);
      for (const Plan::Write& w : plan_->writes) write(w, inputs, vals);
      result = plan_->single ? py::object(leaves[0]) : unflatten_(leaves, plan_->result_spec);
    }
    if (handover_->has_standins() && all_grads_present()) {
      // The step made the gradients stood in for (the usual first step): the zeros go, rather
      // than hold a gradient's worth of memory for the capture's life.
      handover_->forget_standins();
    }
    if (!plan_->side_attrs.empty()) {
      // Tensors the step sets on modules: (result, their values).
      auto pair = result.cast<py::tuple>();
      auto values = py::reinterpret_borrow<py::sequence>(pair[1]);
      for (size_t i = 0; i < plan_->side_attrs.size(); ++i)
        py::setattr(plan_->side_attrs[i].first, plan_->side_attrs[i].second, values[i]);
      result = pair[0];
    }
    return result;
  }

  void write(const Plan::Write& w, const std::vector<Input>& inputs, Values& vals) const {
    switch (w.target) {
      case Target::Slot:
        inputs.at(w.key).tensor.copy_(value(w.value, vals));
        return;
      case Target::Grad: {
        const at::Tensor& p = THPVariable_Unpack(params_.at(w.key).ptr());
        if (w.how == How::Clear) set_grad(w.key, py::none());
        else if (w.how == How::Update && p.grad().defined()) p.grad().copy_(value(w.value, vals));
        else set_grad(w.key, fresh(w, w.key, vals));
        return;
      }
      case Target::State: {
        py::object state = attr(optimizers_.at(w.optimizer), names().state);
        if (!state) throw lz::Error("lazyrt.torch: an optimizer of the step has no state dict");
        py::object entry = state[params_.at(w.key)];  // (a defaultdict: made where missing)
        if (w.how == How::Const) {
          entry[w.state_key] = w.constant;
          return;
        }
        if (w.how == How::Update) {
          PyObject* old = PyDict_Check(entry.ptr()) ? PyDict_GetItemWithError(entry.ptr(), w.state_key.ptr()) : nullptr;
          if (!old && PyErr_Occurred()) throw py::error_already_set();
          if (old && THPVariable_Check(old)) {
            THPVariable_Unpack(old).copy_(value(w.value, vals));
            return;
          }
        }
        entry[w.state_key] = fresh(w, w.key, vals);
        return;
      }
    }
  }

  bool all_grads_present() const {
    for (const Src& src : inputs_)
      if (src.kind == Source::Grad && !src.tensor.grad().defined()) return false;
    return true;
  }

  py::object leaf(const Plan::Result& r, const py::tuple& args, const std::vector<Input>& inputs,
                  Values& vals) const {
    switch (r.kind) {
      case Leaf::Const: return r.constant;
      case Leaf::Input: {
        const size_t s = r.value.index;
        const Src& src = inputs_.at(s);
        if (src.kind == Source::Arg) return py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(args.ptr(), src.index));
        if (src.kind == Source::Tensor) return src.object;
        const Input& in = inputs.at(s);
        if (in.is_number) return wrap(at::scalar_tensor(in.number, at::kDouble));  // a new tensor every call
        return wrap(in.tensor);
      }
      case Leaf::Output:
        if (r.own) return wrap(vals.handed.at(static_cast<size_t>(plan_->where[r.value.index].position)));
        return wrap(value(r.value, vals).clone());
      case Leaf::Device: {
        const Plan::Where& w = plan_->where[r.value.index];
        if (w.position >= 0) return device_result_(py::cast(vals.outs.at(static_cast<size_t>(w.position))));
        return device_result_(wrap(value(r.value, vals)));
      }
    }
    return py::none();
  }

  py::object plan_object_, guard_object_, handover_object_, step_object_, runner_;
  Plan* plan_;
  Guard* guard_;
  Handover* handover_;
  lz::python::PyCompiledStep* step_ = nullptr;
  std::vector<Src> inputs_;
  std::vector<py::object> params_, optimizers_;
  std::vector<OptimizerState> states_;  // of the optimizers whose state is an input
  py::object moved_, device_result_, miss_, other_, unflatten_;
};

}  // namespace

PYBIND11_MODULE(_torch_C, m) {
  m.doc() = "lazyrt.torch's use of PyTorch's C++ API";
  py::class_<Guard>(m, "Guard", "The facts a call shares with the last one for its capture to replay it, checked on the next call (see the source).")
      .def(py::init<const py::dict&>(), py::arg("spec"))
      .def("check", &Guard::check, py::arg("args"),
           "Whether a call with these positional arguments has the recorded facts.");
  py::class_<Handover>(m, "Handover", "A capture's inputs handed to its compiled step (see the source).")
      .def(py::init<size_t, std::vector<int64_t>, py::object>(), py::arg("inputs"), py::arg("inplace"),
           py::arg("aliased"))
      .def("standin", &Handover::standin, py::arg("slot"), py::arg("tensor"),
           "The zeros standing in for a slot's missing gradient (never lent).")
      .def("has_standin", [](const Handover& h, size_t s) { return h.standin_of(s).defined(); }, py::arg("slot"))
      .def("mark", &Handover::mark, py::arg("slot"), py::arg("hard"), py::arg("soft"),
           "Marks dims of a slot's views dynamic (bit masks: mark_dynamic's, maybe_mark_dynamic's).")
      .def("forget_standins", &Handover::forget_standins,
           "Lets go of the stand-ins and the views kept of them (the gradients exist now).")
      .def("views", [](Handover& h, const py::sequence& inputs) {
        const std::vector<lz::Tensor>& v = h.views(inputs_from(inputs));
        py::list out(v.size());
        for (size_t i = 0; i < v.size(); ++i) out[i] = py::cast(v[i]);
        return out;
      }, py::arg("inputs"), "The lazyrt views of this call's inputs (torch tensors and floats).")
      .def("finish", [](Handover& h) {
        py::list out;
        for (auto& [j, grad] : h.finish())
          out.append(py::make_tuple(j, py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(grad)))));
        return out;
      },
           "After the step ran on views(): bump or copy in the written tensors; returns (position, new "
           "gradient) for the in-place items whose tensor is a stand-in (the caller sets the gradient).")
      .def("release", &Handover::release, "Drops this call's inputs (a step that failed).");
  py::enum_<Source>(m, "Source", "What an input of a captured step is read from each call.")
      .value("ARG", Source::Arg).value("TENSOR", Source::Tensor).value("GRAD", Source::Grad)
      .value("STATE", Source::State).value("LR", Source::Lr).value("PLACE", Source::Place);
  py::enum_<Target>(m, "Target", "What a write-back after a captured step writes.")
      .value("SLOT", Target::Slot).value("GRAD", Target::Grad).value("STATE", Target::State);
  py::enum_<How>(m, "How", "How a write-back writes its value.")
      .value("UPDATE", How::Update).value("NEW", How::New).value("CLEAR", How::Clear).value("CONST", How::Const);
  py::enum_<Leaf>(m, "Leaf", "What a result leaf of a captured step is.")
      .value("CONST", Leaf::Const).value("INPUT", Leaf::Input).value("OUTPUT", Leaf::Output)
      .value("DEVICE", Leaf::Device);
  py::class_<Plan>(m, "Plan", "A capture's call plan: its write-backs, results and outputs (see the source).")
      .def(py::init<const py::dict&>(), py::arg("spec"));
  py::class_<Call>(m, "Call", "Every call of a capture, in one world (see the source).")
      .def(py::init<const py::dict&>(), py::arg("spec"))
      .def("__call__", &Call::call, py::arg("args"),
           "A guarded call's result, or spec's miss (the guard does not hold) or other (nothing ran).")
      .def("run", &Call::run, py::arg("args"), "The call's result (Python found its capture).")
      .def("set_step", &Call::set_step, py::arg("step"), "The compiled step, once compiled.");
  m.def("shared_memory", &shared_memory_of, py::arg("values"), py::arg("inputs"),
        "The positions of the values whose memory an input's or an earlier value's overlaps.");
  m.def("set_device_dispatcher", &lazyrt_torch::set_device_dispatcher, py::arg("fn"),
        "Sets fn(op name, args, kwargs), which computes the ops reaching the lazyrt device's C++ kernel.");
  m.def("set_device_shape", [](py::handle t, std::vector<int64_t> sizes) {
    lazyrt_torch::set_device_shape(tensor_of(t), sizes);
  }, py::arg("tensor"), py::arg("sizes"),
        "Gives a lazyrt device tensor a new shape in place (contiguous strides): its metadata only.");
}
