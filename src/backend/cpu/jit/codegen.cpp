// The code generator (codegen.h), run in the compiler process lazyrt-jitc: fusion regions to
// machine code through LLVM.
//
// LLVM 16 (Debian's llvm-16-dev), the newest LLVM in Debian 12: the new pass manager's O2
// pipeline with the loop and SLP vectorizers, and the host CPU's features (AVX2, AVX-512 where
// present, as ORC's host detection finds them), emitted as a relocatable object and linked
// into a shared object by the system linker.
//
// A while loop over one-element values becomes one function too (jit.h's LoopFn): its cond
// and body inline in one machine loop, the carries in registers (emit_loop).
//
// Each region becomes one function (jit.h's FusedFn). Its loop walks the run in blocks of
// kBlock elements: for each element it loads the operands (strides fixed when the kernel is
// made: 0 for a broadcast operand, 1 for a contiguous one), runs the region's ops, and stores
// the results into stack buffers; at the end of the block the buffers are copied to the
// results. So every operand element of a block is read before any result of the block is
// written: a result may share its buffer with an operand, as in the interpreter.
//
// The per-element work is calls into the kernel library (kernel_lib.cpp: loads, stores, every
// op on every dtype, compiled from the interpreter's own source to bitcode at build time and
// embedded), which is linked into each module, made internal and always inlined, then
// vectorized with the loop. No fast-math flags and no contraction (AllowFPOpFusion = Strict,
// the library built with -ffp-contract=off), so each value is the interpreter's, bit for bit.
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Linker/Linker.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "scalar/elementwise_fns.h"
#include "ir/hash.h"
#include "ir/serialize.h"
#include "backend/cpu/jit/code_server.h"
#include "backend/cpu/jit/codegen.h"
#include "util/check.h"
#include "util/dtype_dispatch.h"

// The kernel library's bitcode, embedded by the build (kernel_lib_blob.cpp).
extern "C" const char lazyrt_jit_kernel_lib[];
extern "C" const char lazyrt_jit_kernel_lib_end[];
extern char** environ;

namespace lazyrt::jit {
namespace {

constexpr int64_t kBlock = 256;

std::string message(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return os.str();
}
template <class T>
T take(llvm::Expected<T> v, const char* what) {
  if (!v) throw Error(std::string("generated kernels: ") + what + ": " + message(v.takeError()));
  return std::move(*v);
}
void write_file(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const bool written = fd >= 0 && write_all(fd, bytes);
  if (fd >= 0) ::close(fd);
  if (!written) throw Error("generated kernels: cannot write " + path);
}
std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("generated kernels: cannot read " + path);
  std::string bytes;
  char buf[1 << 16];
  ssize_t r;
  while ((r = ::read(fd, buf, sizeof buf)) != 0) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    bytes.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  if (r != 0 || bytes.empty()) throw Error("generated kernels: cannot read " + path);
  return bytes;
}

// The enum identifier of an elementwise row (the kernel library's function names).
const char* row_name(ir::OpKind op) {
  switch (op) {
#define LAZYRT_ROW_NAME(Op, ...) \
  case ir::OpKind::Op: return #Op;
    LAZYRT_ELEMENTWISE_FNS(LAZYRT_ROW_NAME)
#undef LAZYRT_ROW_NAME
    default: break;
  }
  LAZYRT_ASSERT(false, ir::op_name(op), " has no generated form");
  return "";
}

// The LLVM type of a dtype's compute value, as the kernel library passes it.
llvm::Type* compute_type(llvm::LLVMContext& c, DType d) {
  switch (d) {
    case DType::f32:
    case DType::bf16:
    case DType::f16: return llvm::Type::getFloatTy(c);
    case DType::f64: return llvm::Type::getDoubleTy(c);
    case DType::i32: return llvm::Type::getInt32Ty(c);
    case DType::i64: return llvm::Type::getInt64Ty(c);
    case DType::b8: return llvm::Type::getInt1Ty(c);
  }
  LAZYRT_ASSERT(false, "bad dtype");
  return nullptr;
}

// A constant's compute value: what the interpreter's constant block holds.
llvm::Constant* constant_value(llvm::LLVMContext& c, DType d, double value) {
  return visit_dtype(d, [&](auto tag) -> llvm::Constant* {
    using T = decltype(tag);
    const compute_t<T> v = convert<compute_t<T>>(convert<T>(value));
    if constexpr (std::is_same_v<compute_t<T>, float>) return llvm::ConstantFP::get(llvm::Type::getFloatTy(c), v);
    else if constexpr (std::is_same_v<compute_t<T>, double>) return llvm::ConstantFP::get(llvm::Type::getDoubleTy(c), v);
    else if constexpr (std::is_same_v<T, bool>) return llvm::ConstantInt::get(llvm::Type::getInt1Ty(c), v ? 1 : 0);
    else return llvm::ConstantInt::get(compute_type(c, d), static_cast<uint64_t>(v), true);
  });
}

class Emitter {
 public:
  Emitter(llvm::Module& m) : m_(m), c_(m.getContext()), b_(c_) {}

  llvm::Function* library(const std::string& name) {
    llvm::Function* f = m_.getFunction(name);
    if (!f) {
      // Declared here; the kernel library's definition is linked in afterwards.
      llvm::Function* def = lib_declarations_->getFunction(name);
      LAZYRT_ASSERT(def, "the kernel library has no ", name);
      f = llvm::Function::Create(def->getFunctionType(), llvm::Function::ExternalLinkage, name, m_);
      f->setAttributes(def->getAttributes());
    }
    return f;
  }
  llvm::Value* call(const std::string& name, std::vector<llvm::Value*> args) {
    llvm::Function* f = library(name);
    llvm::FunctionType* ft = f->getFunctionType();
    while (args.size() < ft->getNumParams()) args.push_back(llvm::Constant::getNullValue(ft->getParamType(static_cast<unsigned>(args.size()))));
    llvm::CallInst* ci = b_.CreateCall(f, args);
    ci->setAttributes(f->getAttributes());
    return ci;
  }

  // The bytes of a row's functor (its attributes), as a constant the library reads.
  llvm::Value* row_bytes(const ir::Node& n) {
    std::string bytes;
    scalar::visit_elementwise_row(n.op, n.attrs, [&](const auto& row) {
      bytes.assign(reinterpret_cast<const char*>(&row.f), sizeof(row.f));
    });
    auto* init = llvm::ConstantDataArray::getRaw(bytes, bytes.size(), llvm::Type::getInt8Ty(c_));
    auto* g = new llvm::GlobalVariable(m_, init->getType(), true, llvm::GlobalValue::PrivateLinkage, init);
    g->setAlignment(llvm::Align(8));
    return g;
  }

  // The values of region g's nodes at one element: the constants and attributes made once
  // (value, row), parameter p loaded by load(p, its dtype's name).
  template <class Load>
  void element_values(const ir::Graph& g, std::vector<llvm::Value*>& value, const std::vector<llvm::Value*>& row,
                      Load&& load) {
    for (size_t k = 0; k < g.nodes.size(); ++k) {
      const ir::Node& node = g.nodes[k];
      if (node.op == ir::OpKind::Full) continue;
      auto operand = [&](size_t o) { return value[static_cast<size_t>(node.operands[o].node)]; };
      const std::string dt = dtype_name(node.op == ir::OpKind::Parameter || node.operands.empty()
                                            ? node.results[0].dtype
                                            : g.type(node.operands[node.op == ir::OpKind::Where ? 1 : 0]).dtype);
      if (node.op == ir::OpKind::Parameter) {
        value[k] = load(static_cast<size_t>(ir::NodeAttrs(node.op, node.attrs).i<"index">()), dt);
      } else if (node.op == ir::OpKind::Cast) {
        value[k] = call("lazyrt_jit_cast_" + dt + "_" + dtype_name(node.results[0].dtype), {operand(0)});
      } else if (node.op == ir::OpKind::Where) {
        value[k] = call("lazyrt_jit_where_" + dt, {operand(0), operand(1), operand(2)});
      } else {
        std::vector<llvm::Value*> args{row[k]};
        for (size_t o = 0; o < node.operands.size(); ++o) args.push_back(operand(o));
        value[k] = call(std::string("lazyrt_jit_op_") + row_name(node.op) + "_" + dt, args);
      }
    }
  }

  // The loop for results that share no byte with any operand: one pass over the run, each
  // result stored where it belongs as it is computed. Every pointer argument is noalias (the
  // caller checked), so the loop vectorizes without checks of its own. Arguments: each
  // operand's first element, each result's, the run's length.
  llvm::Function* emit_direct(const FusedRegion& r, const std::string& name, const std::vector<llvm::Value*>& row) {
    const ir::Graph& g = r.region;
    const size_t num_in = r.inner_strides.size(), num_out = g.outputs.size();
    auto* i64 = llvm::Type::getInt64Ty(c_);
    auto* ptr = llvm::PointerType::get(c_, 0);
    std::vector<llvm::Type*> params(num_in + num_out, ptr);
    params.push_back(i64);
    auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(c_), params, false);
    llvm::Function* f = llvm::Function::Create(fty, llvm::Function::InternalLinkage, name, m_);
    for (unsigned a = 0; a < num_in + num_out; ++a) {
      f->addParamAttr(a, llvm::Attribute::NoAlias);
      f->addParamAttr(a, llvm::Attribute::NoCapture);
      if (a < num_in) f->addParamAttr(a, llvm::Attribute::ReadOnly);
    }
    auto* entry = llvm::BasicBlock::Create(c_, "entry", f);
    auto* body = llvm::BasicBlock::Create(c_, "element", f);
    auto* done = llvm::BasicBlock::Create(c_, "done", f);
    b_.SetInsertPoint(entry);
    b_.CreateCondBr(b_.CreateICmpSGT(f->getArg(static_cast<unsigned>(num_in + num_out)), b_.getInt64(0)), body, done);
    b_.SetInsertPoint(body);
    llvm::PHINode* i = b_.CreatePHI(i64, 2, "i");
    i->addIncoming(b_.getInt64(0), entry);
    std::vector<llvm::Value*> value(g.nodes.size(), nullptr);
    for (size_t k = 0; k < g.nodes.size(); ++k)
      if (g.nodes[k].op == ir::OpKind::Full)
        value[k] = constant_value(c_, g.nodes[k].results[0].dtype, ir::NodeAttrs(g.nodes[k].op, g.nodes[k].attrs).f<"value">());
    element_values(g, value, row, [&](size_t p, const std::string& dt) {
      const int64_t st = r.inner_strides[p];
      llvm::Value* e = st == 0 ? b_.getInt64(0) : st == 1 ? static_cast<llvm::Value*>(i) : b_.CreateMul(i, b_.getInt64(st));
      return call("lazyrt_jit_load_" + dt, {f->getArg(static_cast<unsigned>(p)), e});
    });
    for (size_t j = 0; j < num_out; ++j)
      call(std::string("lazyrt_jit_store_") + dtype_name(g.type(g.outputs[j]).dtype),
           {f->getArg(static_cast<unsigned>(num_in + j)), i, value[static_cast<size_t>(g.outputs[j].node)]});
    llvm::Value* next_i = b_.CreateAdd(i, b_.getInt64(1));
    i->addIncoming(next_i, body);
    b_.CreateCondBr(b_.CreateICmpSLT(next_i, f->getArg(static_cast<unsigned>(num_in + num_out))), body, done);
    b_.SetInsertPoint(done);
    b_.CreateRetVoid();
    return f;
  }

  // A while loop over one-element values (jit.h's LoopFn). Each carry lives in a stack slot
  // of its stored dtype, so every iteration rounds it as the interpreter's buffers do (bf16,
  // f16); the body's new values are all computed before any slot is written. The captures are
  // loaded once.
  void emit_loop(const FusedRegion& r, const std::string& name) {
    const ir::Graph& body = r.region;
    const ir::Graph& cond = *r.cond;
    auto* ptr = llvm::PointerType::get(c_, 0);
    auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(c_), {ptr, ptr}, false);
    llvm::Function* f = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m_);
    llvm::Argument* in = f->getArg(0);
    llvm::Argument* out = f->getArg(1);
    for (unsigned a = 0; a < 2; ++a) {
      f->addParamAttr(a, llvm::Attribute::NoCapture);
      f->addParamAttr(a, llvm::Attribute::ReadOnly);
    }
    auto* entry = llvm::BasicBlock::Create(c_, "entry", f);
    auto* test = llvm::BasicBlock::Create(c_, "test", f);
    auto* step = llvm::BasicBlock::Create(c_, "step", f);
    auto* done = llvm::BasicBlock::Create(c_, "done", f);

    b_.SetInsertPoint(entry);
    const size_t carries = body.outputs.size();
    std::vector<DType> dtype(carries);
    std::vector<llvm::Value*> slot(carries);
    auto operand_ptr = [&](llvm::Value* array, size_t k) {
      return b_.CreateLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, array, k));
    };
    for (size_t k = 0; k < carries; ++k) {
      dtype[k] = body.type(body.outputs[k]).dtype;
      auto* a = b_.CreateAlloca(llvm::ArrayType::get(llvm::Type::getInt8Ty(c_), dtype_size(dtype[k])));
      a->setAlignment(llvm::Align(16));
      slot[k] = a;
      b_.CreateMemCpy(a, llvm::MaybeAlign(16), operand_ptr(in, k), llvm::MaybeAlign(1), dtype_size(dtype[k]));
    }
    std::map<size_t, llvm::Value*> captured;
    for (const ir::Graph* g : {&cond, &body})
      for (const ir::Node& n : g->nodes) {
        if (n.op != ir::OpKind::Parameter) continue;
        const auto p = static_cast<size_t>(ir::NodeAttrs(n.op, n.attrs).i<"index">());
        if (p >= carries && !captured.count(p))
          captured[p] = call("lazyrt_jit_load_" + std::string(dtype_name(n.results[0].dtype)), {operand_ptr(in, p), b_.getInt64(0)});
      }
    auto load = [&](size_t p, const std::string& dt) {
      return p < carries ? call("lazyrt_jit_load_" + dt, {slot[p], b_.getInt64(0)}) : captured.at(p);
    };
    auto values = [&](const ir::Graph& g) {
      std::vector<llvm::Value*> value(g.nodes.size(), nullptr), row(g.nodes.size(), nullptr);
      for (size_t i = 0; i < g.nodes.size(); ++i) {
        const ir::Node& node = g.nodes[i];
        if (node.op == ir::OpKind::Full)
          value[i] = constant_value(c_, node.results[0].dtype, ir::NodeAttrs(node.op, node.attrs).f<"value">());
        else if (scalar::has_elementwise_fn(node.op))
          row[i] = row_bytes(node);
      }
      element_values(g, value, row, load);
      return value;
    };
    b_.CreateBr(test);

    b_.SetInsertPoint(test);
    const std::vector<llvm::Value*> pred = values(cond);
    b_.CreateCondBr(pred[static_cast<size_t>(cond.outputs[0].node)], step, done);

    b_.SetInsertPoint(step);
    const std::vector<llvm::Value*> next = values(body);
    for (size_t k = 0; k < carries; ++k)
      call(std::string("lazyrt_jit_store_") + dtype_name(dtype[k]), {slot[k], b_.getInt64(0), next[static_cast<size_t>(body.outputs[k].node)]});
    b_.CreateBr(test);

    b_.SetInsertPoint(done);
    for (size_t k = 0; k < carries; ++k)
      b_.CreateMemCpy(operand_ptr(out, k), llvm::MaybeAlign(1), slot[k], llvm::MaybeAlign(16), dtype_size(dtype[k]));
    b_.CreateRetVoid();
  }

  void emit(const FusedRegion& r, const std::string& name, const llvm::Module* lib) {
    lib_declarations_ = lib;
    if (r.cond) return emit_loop(r, name);
    const ir::Graph& g = r.region;
    auto* i64 = llvm::Type::getInt64Ty(c_);
    auto* ptr = llvm::PointerType::get(c_, 0);
    auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(c_), {ptr, ptr, ptr, i64, i64}, false);
    llvm::Function* f = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m_);
    llvm::Argument* in = f->getArg(0);
    llvm::Argument* off = f->getArg(1);
    llvm::Argument* out = f->getArg(2);
    llvm::Argument* oo = f->getArg(3);
    llvm::Argument* n = f->getArg(4);
    for (int a = 0; a < 3; ++a) {
      f->addParamAttr(a, llvm::Attribute::NoCapture);
      f->addParamAttr(a, llvm::Attribute::ReadOnly);
    }

    // Constants and attributes, once.
    std::vector<llvm::Value*> value(g.nodes.size(), nullptr), row(g.nodes.size(), nullptr);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const ir::Node& node = g.nodes[i];
      if (node.op == ir::OpKind::Full)
        value[i] = constant_value(c_, node.results[0].dtype, ir::NodeAttrs(node.op, node.attrs).f<"value">());
      else if (scalar::has_elementwise_fn(node.op))
        row[i] = row_bytes(node);
    }
    const bool forward = std::all_of(r.inner_strides.begin(), r.inner_strides.end(), [](int64_t st) { return st >= 0; });
    llvm::Function* direct = forward ? emit_direct(r, "direct_" + name, row) : nullptr;

    auto* entry = llvm::BasicBlock::Create(c_, "entry", f);
    auto* check = llvm::BasicBlock::Create(c_, "check", f);
    auto* direct_call = llvm::BasicBlock::Create(c_, "direct", f);
    auto* outer = llvm::BasicBlock::Create(c_, "block", f);
    auto* body = llvm::BasicBlock::Create(c_, "element", f);
    auto* copy = llvm::BasicBlock::Create(c_, "store", f);
    auto* done = llvm::BasicBlock::Create(c_, "done", f);

    // Entry: operand pointers and offsets, result pointers, one stack buffer per result.
    b_.SetInsertPoint(entry);
    const size_t num_in = r.inner_strides.size();
    std::vector<llvm::Value*> in_ptr(num_in), in_off(num_in);
    for (size_t k = 0; k < num_in; ++k) {
      in_ptr[k] = b_.CreateLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, in, k));
      in_off[k] = b_.CreateLoad(i64, b_.CreateConstInBoundsGEP1_64(i64, off, k));
    }
    std::vector<llvm::Value*> out_ptr, buf;
    std::vector<DType> out_dtype;
    for (size_t j = 0; j < g.outputs.size(); ++j) {
      const DType d = g.type(g.outputs[j]).dtype;
      out_dtype.push_back(d);
      out_ptr.push_back(b_.CreateLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, out, j)));
      auto* a = b_.CreateAlloca(llvm::ArrayType::get(llvm::Type::getInt8Ty(c_), kBlock * dtype_size(d)));
      a->setAlignment(llvm::Align(64));
      buf.push_back(a);
    }
    b_.CreateCondBr(b_.CreateICmpSGT(n, b_.getInt64(0)), check, done);

    // Results that share no byte with any operand take the direct loop; one written over an
    // operand (a fused update in place) takes the blocks below.
    b_.SetInsertPoint(check);
    if (direct) {
      std::vector<llvm::Value*> args;
      std::vector<std::pair<llvm::Value*, llvm::Value*>> in_range, out_range;  // [first byte, end)
      std::vector<int64_t> in_size(num_in, 1);
      for (const ir::Node& node : g.nodes)
        if (node.op == ir::OpKind::Parameter)
          in_size[static_cast<size_t>(ir::NodeAttrs(node.op, node.attrs).i<"index">())] =
              static_cast<int64_t>(dtype_size(node.results[0].dtype));
      auto address = [&](llvm::Value* base, llvm::Value* index, int64_t size) {
        return b_.CreateGEP(llvm::Type::getInt8Ty(c_), base, b_.CreateMul(index, b_.getInt64(size)));
      };
      for (size_t k = 0; k < num_in; ++k) {
        const int64_t size = in_size[k];
        llvm::Value* first = address(in_ptr[k], in_off[k], size);
        llvm::Value* last = b_.CreateAdd(in_off[k], b_.CreateMul(b_.CreateSub(n, b_.getInt64(1)), b_.getInt64(r.inner_strides[k])));
        args.push_back(first);
        in_range.emplace_back(b_.CreatePtrToInt(first, i64), b_.CreatePtrToInt(address(in_ptr[k], b_.CreateAdd(last, b_.getInt64(1)), size), i64));
      }
      for (size_t j = 0; j < g.outputs.size(); ++j) {
        const int64_t size = static_cast<int64_t>(dtype_size(out_dtype[j]));
        llvm::Value* first = address(out_ptr[j], oo, size);
        args.push_back(first);
        out_range.emplace_back(b_.CreatePtrToInt(first, i64), b_.CreatePtrToInt(address(out_ptr[j], b_.CreateAdd(oo, n), size), i64));
      }
      args.push_back(n);
      llvm::Value* disjoint = b_.getTrue();
      for (const auto& [ob, oe] : out_range)
        for (const auto& [ib, ie] : in_range)
          disjoint = b_.CreateAnd(disjoint, b_.CreateOr(b_.CreateICmpULE(oe, ib), b_.CreateICmpULE(ie, ob)));
      b_.CreateCondBr(disjoint, direct_call, outer);
      b_.SetInsertPoint(direct_call);
      b_.CreateCall(direct, args);
      b_.CreateBr(done);
    } else {
      b_.CreateBr(outer);
      b_.SetInsertPoint(direct_call);
      b_.CreateUnreachable();
    }

    // Block: start s, m = min(kBlock, n - s) elements.
    b_.SetInsertPoint(outer);
    llvm::PHINode* s = b_.CreatePHI(i64, 2, "s");
    s->addIncoming(b_.getInt64(0), check);
    llvm::Value* left = b_.CreateSub(n, s);
    llvm::Value* m = b_.CreateSelect(b_.CreateICmpSLT(left, b_.getInt64(kBlock)), left, b_.getInt64(kBlock));
    b_.CreateBr(body);

    // Element i of the block.
    b_.SetInsertPoint(body);
    llvm::PHINode* i = b_.CreatePHI(i64, 2, "i");
    i->addIncoming(b_.getInt64(0), outer);
    llvm::Value* at = b_.CreateAdd(s, i);
    element_values(g, value, row, [&](size_t p, const std::string& dt) {
      const int64_t st = r.inner_strides[p];
      llvm::Value* e = st == 0 ? in_off[p] : b_.CreateAdd(in_off[p], st == 1 ? at : b_.CreateMul(at, b_.getInt64(st)));
      return call("lazyrt_jit_load_" + dt, {in_ptr[p], e});
    });
    for (size_t j = 0; j < g.outputs.size(); ++j)
      call(std::string("lazyrt_jit_store_") + dtype_name(out_dtype[j]), {buf[j], i, value[static_cast<size_t>(g.outputs[j].node)]});
    llvm::Value* next_i = b_.CreateAdd(i, b_.getInt64(1));
    i->addIncoming(next_i, body);
    b_.CreateCondBr(b_.CreateICmpSLT(next_i, m), body, copy);

    // The block's results, copied out once every operand of the block was read.
    b_.SetInsertPoint(copy);
    for (size_t j = 0; j < g.outputs.size(); ++j) {
      const int64_t size = static_cast<int64_t>(dtype_size(out_dtype[j]));
      llvm::Value* dst = b_.CreateGEP(llvm::Type::getInt8Ty(c_), out_ptr[j], b_.CreateMul(b_.CreateAdd(oo, s), b_.getInt64(size)));
      b_.CreateMemCpy(dst, llvm::MaybeAlign(1), buf[j], llvm::MaybeAlign(64), b_.CreateMul(m, b_.getInt64(size)));
    }
    llvm::Value* next_s = b_.CreateAdd(s, b_.getInt64(kBlock));
    s->addIncoming(next_s, copy);
    b_.CreateCondBr(b_.CreateICmpSLT(next_s, n), outer, done);

    b_.SetInsertPoint(done);
    b_.CreateRetVoid();
  }

 private:
  llvm::Module& m_;
  llvm::LLVMContext& c_;
  llvm::IRBuilder<> b_;
  const llvm::Module* lib_declarations_ = nullptr;
};

}  // namespace

Compiler::Compiler() {
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  llvm::orc::JITTargetMachineBuilder jtmb = take(llvm::orc::JITTargetMachineBuilder::detectHost(), "host");
  jtmb.setCodeGenOptLevel(llvm::CodeGenOpt::Default);
  jtmb.setRelocationModel(llvm::Reloc::PIC_);
  jtmb.getOptions().AllowFPOpFusion = llvm::FPOpFusion::Strict;
  tm_ = take(jtmb.createTargetMachine(), "target machine");
  make_dir();
}

// A private directory to link in, under TMPDIR or else /tmp, named with this process's id (so
// that what a killed compiler leaves can be told apart); made again when it is gone (a
// temporary-file cleaner, say).
void Compiler::make_dir() {
  std::string why;
  for (const char* base : {static_cast<const char*>(std::getenv("TMPDIR")), "/tmp"}) {
    if (!base || !*base) continue;
    std::string tmpl = std::string(base) + "/lazyrt-jitc-" + std::to_string(::getpid()) + "-XXXXXX";
    if (mkdtemp(tmpl.data())) {
      dir_ = tmpl;
      return;
    }
    why += std::string(" ") + base + ": " + std::strerror(errno) + ";";
  }
  throw Error("generated kernels: no directory to link in:" + why);
}

Compiler::~Compiler() {
  ::unlink((dir_ + "/m.o").c_str());
  ::unlink((dir_ + "/m.so").c_str());
  ::rmdir(dir_.c_str());
}

std::string Compiler::shared_object(const std::vector<FusedRegion>& regions) {
  const std::string name = "lazyrt_kernels_" + std::to_string(next_module_++);
  const std::string object = emit_object(regions, name);
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0) make_dir();
  const std::string o = dir_ + "/m.o", so = dir_ + "/m.so";
  write_file(o, object);
  // The system linker (binutils' ld, found when lazyrt was built): a shared object that needs
  // libm for the math functions the loops call.
  const char* argv[] = {LAZYRT_LINKER, "-shared", "--as-needed", "-o", so.c_str(), o.c_str(), "-lm", nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, LAZYRT_LINKER, nullptr, nullptr, const_cast<char**>(argv), environ);
  if (rc != 0) throw Error(std::string("generated kernels: running " LAZYRT_LINKER ": ") + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("generated kernels: " LAZYRT_LINKER " failed to link " + name);
  return read_file(so);
}

// The regions as one LLVM module, optimized and compiled to a relocatable object.
std::string Compiler::emit_object(const std::vector<FusedRegion>& regions, const std::string& name) {
  llvm::LLVMContext ctx;
  auto m = std::make_unique<llvm::Module>(name, ctx);
  m->setDataLayout(tm_->createDataLayout());
  m->setTargetTriple(tm_->getTargetTriple().str());
  std::unique_ptr<llvm::Module> lib = load_library(ctx);
  {
    Emitter e(*m);
    for (size_t k = 0; k < regions.size(); ++k) e.emit(regions[k], kernel_name(k), lib.get());
  }
  lib->setDataLayout(m->getDataLayout());
  lib->setTargetTriple(m->getTargetTriple());
  if (llvm::Linker::linkModules(*m, std::move(lib), llvm::Linker::Flags::LinkOnlyNeeded))
    throw Error("generated kernels: linking the kernel library failed");
  const std::string cpu = tm_->getTargetCPU().str(), features = tm_->getTargetFeatureString().str();
  for (llvm::Function& f : *m) {
    if (f.isDeclaration()) continue;
    if (!f.getName().startswith("lazyrt_k")) {
      f.setLinkage(llvm::GlobalValue::InternalLinkage);
      f.removeFnAttr(llvm::Attribute::NoInline);
      f.removeFnAttr(llvm::Attribute::OptimizeNone);
      f.addFnAttr(llvm::Attribute::AlwaysInline);
    }
    f.addFnAttr("target-cpu", cpu);
    f.addFnAttr("target-features", features);
    f.removeFnAttr("tune-cpu");
  }
  std::string err;
  llvm::raw_string_ostream es(err);
  if (llvm::verifyModule(*m, &es)) throw Error("generated kernels: invalid module: " + es.str());
  optimize(*m);
  if (const char* dir = std::getenv("LAZYRT_JIT_DUMP"); dir && *dir) dump(*m, std::string(dir) + "/" + name + ".ll");
  llvm::SmallVector<char, 0> bytes;
  llvm::raw_svector_ostream os(bytes);
  llvm::legacy::PassManager pm;
  if (tm_->addPassesToEmitFile(pm, os, nullptr, llvm::CGFT_ObjectFile))
    throw Error("generated kernels: the target cannot emit object files");
  pm.run(*m);
  return std::string(bytes.data(), bytes.size());
}

std::unique_ptr<llvm::Module> Compiler::load_library(llvm::LLVMContext& ctx) {
  const size_t size = static_cast<size_t>(lazyrt_jit_kernel_lib_end - lazyrt_jit_kernel_lib);
  auto buf = llvm::MemoryBuffer::getMemBuffer(llvm::StringRef(lazyrt_jit_kernel_lib, size), "kernel_lib", false);
  return take(llvm::getOwningLazyBitcodeModule(std::move(buf), ctx), "reading the kernel library");
}

void Compiler::dump(const llvm::Module& m, const std::string& path) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  if (!ec) m.print(os, nullptr);
}

void Compiler::optimize(llvm::Module& m) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PipelineTuningOptions pto;
  pto.LoopVectorization = true;
  pto.SLPVectorization = true;
  llvm::PassBuilder pb(tm_.get(), pto);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2);
  mpm.run(m, mam);
}

}  // namespace lazyrt::jit
