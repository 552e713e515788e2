// Reader for the op parity fixtures written by tests/fixtures/gen_op_fixtures.py: one case per
// block of lines (case, op, attr..., in..., out, end). See that script for the format.
//
// Values are kept exactly as written: floats as doubles (an f32 value is exactly a double),
// integers and bools as int64. Numbers go through strtod/strtoll because they read nan, inf
// and -inf, which std::istream does not.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <lazyrt/lazyrt.h>

namespace lazyrt::fixtures {

struct FixtureTensor {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<double> reals;   // f32 and f64 values
  std::vector<int64_t> ints;   // i32, i64 and b8 values
};

struct OpCase {
  std::string name;
  std::string op;
  std::map<std::string, std::vector<std::string>> attrs;  // key -> the tokens after it
  std::vector<FixtureTensor> inputs;
  FixtureTensor expected;
  int line = 0;  // where the case starts in the fixture file
};

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

/// Every case of the file, in order. Throws std::runtime_error naming the line on bad input.
inline std::vector<OpCase> load_op_cases(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open op fixture file " + path);
  std::vector<OpCase> cases;
  OpCase cur;
  bool open = false, has_out = false;
  std::string line;
  for (int lineno = 1; std::getline(file, line); ++lineno) {
    try {
      std::istringstream in(line);
      std::string key;
      if (!(in >> key) || key[0] == '#') continue;
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
      } else if (key == "attr") {
        std::string name, tok;
        in >> name;
        auto& values = cur.attrs[name];
        while (in >> tok) values.push_back(tok);
      } else if (key == "in") {
        cur.inputs.push_back(parse_tensor(in));
      } else if (key == "out") {
        cur.expected = parse_tensor(in);
        has_out = true;
      } else if (key == "end") {
        if (cur.name.empty() || cur.op.empty() || !has_out)
          throw std::runtime_error("case without a name, an op or an output");
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

/// The fixture's values as lazyrt device data of the same dtype and shape.
inline Tensor make_tensor(const FixtureTensor& t) {
  switch (t.dtype) {
    case DType::f32: return tensor(std::vector<float>(t.reals.begin(), t.reals.end()), t.shape);
    case DType::f64: return tensor(t.reals, t.shape);
    case DType::i32: return tensor(std::vector<int32_t>(t.ints.begin(), t.ints.end()), t.shape);
    case DType::i64: return tensor(t.ints, t.shape);
    case DType::b8: {
      std::vector<bool> v;
      for (int64_t x : t.ints) v.push_back(x != 0);
      return tensor(v, t.shape);
    }
    default: throw std::runtime_error(std::string("fixtures do not use dtype ") + dtype_name(t.dtype));
  }
}

}  // namespace lazyrt::fixtures
