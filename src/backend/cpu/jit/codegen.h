// The code generator, run by the compiler process lazyrt-jitc (code_server.h): fusion regions
// to a shared object through LLVM and the system linker. Only lazyrt-jitc links it (and LLVM).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/jit/jit.h"

namespace llvm {
class LLVMContext;
class Module;
class TargetMachine;
}  // namespace llvm

namespace lazyrt::jit {

class Compiler {
 public:
  /// For the host CPU. Throws lazyrt::Error.
  Compiler();
  ~Compiler();
  /// The regions as one module: a shared object whose function kernel_name(k) is region k's
  /// loop (jit.h's FusedFn). Throws lazyrt::Error.
  std::string shared_object(const std::vector<FusedRegion>& regions);

 private:
  void make_dir();
  std::string emit_object(const std::vector<FusedRegion>& regions, const std::string& name);
  std::unique_ptr<llvm::Module> load_library(llvm::LLVMContext& ctx);
  void optimize(llvm::Module& m);
  static void dump(const llvm::Module& m, const std::string& path);

  std::unique_ptr<llvm::TargetMachine> tm_;
  std::string dir_;  // where objects are linked
  uint64_t next_module_ = 0;
};

}  // namespace lazyrt::jit
