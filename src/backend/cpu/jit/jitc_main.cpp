// lazyrt-jitc: the compiler process of generated kernels (code_server.h). Reads requests from
// fd 3, a socket to the process that started it, and answers each with a shared object or an
// error, until the socket closes.
#include <unistd.h>

#include <exception>
#include <memory>
#include <string>

#include "backend/cpu/jit/code_server.h"
#include "backend/cpu/jit/codegen.h"

int main() {
  using namespace lazyrt::jit;
  constexpr int kSocket = 3;
  // Nothing else the starting process left open stays open here (a pipe held by this process
  // would keep its reader from ever seeing the end).
  ::close_range(kSocket + 1, ~0u, 0);
  std::unique_ptr<Compiler> compiler;
  std::string request;
  while (read_frame(kSocket, request)) {
    std::string answer;
    try {
      if (!compiler) compiler = std::make_unique<Compiler>();
      answer = "K" + compiler->shared_object(decode_regions(request));
    } catch (const std::exception& e) {
      answer = std::string("E") + e.what();
    }
    if (!write_frame(kSocket, answer)) break;
  }
  // The socket closed: the process that started this one is gone or done. Its linking
  // directory removed, it ends without running LLVM's static destructors.
  compiler.reset();
  ::_exit(0);
}
