// The process group behind include/lazyrt/distributed.h: joining it (a store, Gloo's TCP
// device and a full mesh of connections), and the Communicator (runtime/collective.h) that
// the collective kernels run through, over Gloo's collectives.
#pragma once

#include <string_view>

namespace lazyrt::distributed::detail {

/// The group's size, checked to be initialized (throws naming `op` otherwise).
int world_size_for(std::string_view op);

}  // namespace lazyrt::distributed::detail
