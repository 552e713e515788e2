// The one header users include.
#pragma once

#include "lazyrt/amp.h"
#include "lazyrt/backend.h"
#include "lazyrt/cache.h"
#include "lazyrt/debug.h"
#include "lazyrt/distributed.h"
#include "lazyrt/loops.h"
#include "lazyrt/random.h"
#include "lazyrt/replay.h"
#include "lazyrt/metrics.h"
#include "lazyrt/nn.h"
#include "lazyrt/optim.h"
#include "lazyrt/tensor.h"
#include "lazyrt/types.h"
