// Reader for the op parity fixtures written by tests/fixtures/gen_op_fixtures.py: one case per
// block of lines (case, op, group?, attr..., in..., out, alt?, end). See that script for the
// format.
//
// Values are kept exactly as written: floats as doubles (an f32, bf16 or f16 value is exactly a
// double), integers and bools as int64. Numbers go through strtod/strtoll because they read nan,
// inf and -inf, which std::istream does not.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <lazyrt/lazyrt.h>

#include "util/half.h"

namespace lazyrt::fixtures {

struct FixtureTensor {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<double> reals;   // f32, f64, bf16 and f16 values
  std::vector<int64_t> ints;   // i32, i64 and b8 values
};

struct OpCase {
  std::string name;
  std::string op;
  std::string group;  // cases of one group run as one test; empty: a test of its own
  std::map<std::string, std::vector<std::string>> attrs;  // key -> the tokens after it
  std::vector<FixtureTensor> inputs;
  FixtureTensor expected;
  std::optional<FixtureTensor> alt;  // another output torch gives, also accepted (16-bit cases)
  int line = 0;  // where the case starts in the fixture file
  // The 'in', 'out' and 'alt' lines (number, text) that parse_values has yet to read; shared,
  // as gtest copies each test's parameter several times.
  std::shared_ptr<const std::vector<std::pair<int, std::string>>> unparsed;
};

/// When load_op_cases reads the tensors' values: at once, or when a case runs (parse_values).
/// ctest starts a test binary once per test, and each start lists every case: reading only
/// names, ops and attributes keeps that start short however many values the file holds.
enum class Values { Now, Later };

inline DType parse_dtype(const std::string& s) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::b8})
    if (s == dtype_name(d)) return d;
  throw std::runtime_error("unknown dtype '" + s + "'");
}

inline double parse_real(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') throw std::runtime_error("bad number '" + s + "'");
  return v;
}

inline int64_t parse_int(const std::string& s) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0) throw std::runtime_error("bad integer '" + s + "'");
  return v;
}

// "DTYPE DIM... : VALUE..." (the keyword already read from `in`).
inline FixtureTensor parse_tensor(std::istringstream& in) {
  FixtureTensor t;
  std::string tok;
  if (!(in >> tok)) throw std::runtime_error("missing dtype");
  t.dtype = parse_dtype(tok);
  bool colon = false;
  while (in >> tok) {
    if (tok == ":") {
      colon = true;
      break;
    }
    t.shape.push_back(parse_int(tok));
  }
  if (!colon) throw std::runtime_error("missing ':' after the shape");
  const bool floating = is_floating(t.dtype);
  while (in >> tok) {
    if (floating) t.reals.push_back(parse_real(tok));
    else t.ints.push_back(parse_int(tok));
  }
  const size_t n = floating ? t.reals.size() : t.ints.size();
  if (static_cast<int64_t>(n) != shape_numel(t.shape))
    throw std::runtime_error(std::to_string(n) + " values for shape " + shape_str(t.shape));
  return t;
}

// One 'in', 'out' or 'alt' line (the keyword already read from `in`) into the case.
inline void parse_tensor_line(OpCase& c, const std::string& key, std::istringstream& in) {
  if (key == "in") c.inputs.push_back(parse_tensor(in));
  else if (key == "out") c.expected = parse_tensor(in);
  else c.alt = parse_tensor(in);
}

/// Reads the values load_op_cases(path, Values::Later) left unparsed. Throws naming the line.
inline void parse_values(OpCase& c) {
  if (!c.unparsed) return;
  for (const auto& [lineno, text] : *c.unparsed) {
    try {
      std::istringstream in(text);
      std::string key;
      in >> key;
      parse_tensor_line(c, key, in);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("case " + c.name + ", fixture line " + std::to_string(lineno) + ": " +
                               e.what());
    }
  }
  c.unparsed.reset();
}

/// Every case of the file, in order. Throws std::runtime_error naming the line on bad input.
inline std::vector<OpCase> load_op_cases(const std::string& path, Values values = Values::Now) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open op fixture file " + path);
  std::vector<OpCase> cases;
  OpCase cur;
  std::vector<std::pair<int, std::string>> unparsed;
  bool open = false, has_out = false;
  std::string line;
  for (int lineno = 1; std::getline(file, line); ++lineno) {
    try {
      const size_t start = line.find_first_not_of(" \t");
      if (start == std::string::npos || line[start] == '#') continue;
      const std::string key = line.substr(start, line.find_first_of(" \t", start) - start);
      if (values == Values::Later && (key == "in" || key == "out" || key == "alt")) {
        if (!open) throw std::runtime_error("'" + key + "' outside a case");
        unparsed.emplace_back(lineno, std::move(line));
        has_out = has_out || key == "out";
        continue;
      }
      std::istringstream in(line);
      in >> std::ws;
      in.ignore(static_cast<std::streamsize>(key.size()));
      if (key == "case") {
        if (open) throw std::runtime_error("'case' before 'end' of the previous case");
        cur = OpCase{};
        in >> cur.name;
        cur.line = lineno;
        open = true;
        has_out = false;
        continue;
      }
      if (!open) throw std::runtime_error("'" + key + "' outside a case");
      if (key == "op") {
        in >> cur.op;
      } else if (key == "group") {
        in >> cur.group;
      } else if (key == "attr") {
        std::string name, tok;
        in >> name;
        auto& values = cur.attrs[name];
        while (in >> tok) values.push_back(tok);
      } else if (key == "in" || key == "out" || key == "alt") {
        parse_tensor_line(cur, key, in);
        has_out = has_out || key == "out";
      } else if (key == "end") {
        if (cur.name.empty() || cur.op.empty() || !has_out)
          throw std::runtime_error("case without a name, an op or an output");
        if (!unparsed.empty())
          cur.unparsed = std::make_shared<const decltype(unparsed)>(std::move(unparsed));
        unparsed.clear();
        cases.push_back(std::move(cur));
        open = false;
      } else {
        throw std::runtime_error("unknown keyword '" + key + "'");
      }
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": " + e.what());
    }
  }
  if (open) throw std::runtime_error(path + ": the last case has no 'end'");
  return cases;
}

// gtest prints test parameters byte by byte unless told how; the case name is what matters.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// A 16-bit tensor from the fixture's doubles. Each is a value of the type, so the conversion
// through float is exact; a value that is not (a broken fixture) is an error, not rounded.
template <class Half>
Tensor half_tensor(const FixtureTensor& t) {
  std::vector<Half> v;
  for (double x : t.reals) {
    const Half h(static_cast<float>(x));
    const double back = static_cast<float>(h);
    if (back != x && !(std::isnan(x) && std::isnan(back)))
      throw std::runtime_error("value " + std::to_string(x) + " is not exactly a " + dtype_name(t.dtype));
    v.push_back(h);
  }
  return from_blob(v.data(), t.shape, t.dtype);
}

/// The fixture's values as lazyrt device data of the same dtype and shape.
inline Tensor make_tensor(const FixtureTensor& t) {
  switch (t.dtype) {
    case DType::f32: return tensor(std::vector<float>(t.reals.begin(), t.reals.end()), t.shape);
    case DType::f64: return tensor(t.reals, t.shape);
    case DType::bf16: return half_tensor<bf16>(t);
    case DType::f16: return half_tensor<f16>(t);
    case DType::i32: return tensor(std::vector<int32_t>(t.ints.begin(), t.ints.end()), t.shape);
    case DType::i64: return tensor(t.ints, t.shape);
    case DType::b8: {
      std::vector<bool> v;
      for (int64_t x : t.ints) v.push_back(x != 0);
      return tensor(v, t.shape);
    }
  }
  throw std::runtime_error(std::string("fixtures do not use dtype ") + dtype_name(t.dtype));
}

}  // namespace lazyrt::fixtures
