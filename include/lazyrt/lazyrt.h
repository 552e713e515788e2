// The one header users include.
#pragma once

#include "lazyrt/cache.h"
#include "lazyrt/metrics.h"
#include "lazyrt/tensor.h"
#include "lazyrt/types.h"
