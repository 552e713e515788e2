#include "runtime/collective.h"

#include <map>
#include <mutex>

#include "util/check.h"

namespace lazyrt::runtime {
namespace {

std::mutex mu;
std::map<int64_t, std::shared_ptr<Communicator>>& groups() {
  static std::map<int64_t, std::shared_ptr<Communicator>> g;
  return g;
}

}  // namespace

void set_communicator(int64_t group, std::shared_ptr<Communicator> c) {
  std::lock_guard<std::mutex> lock(mu);
  if (c) groups()[group] = std::move(c);
  else groups().erase(group);
}

std::shared_ptr<Communicator> communicator(int64_t group, std::string_view op) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = groups().find(group);
  LAZYRT_CHECK(it != groups().end(), op, ": no process group ", group == 0 ? std::string("(the default one)") : std::to_string(group),
               " is initialized in this process: call distributed::init_process_group() first");
  return it->second;
}

}  // namespace lazyrt::runtime
