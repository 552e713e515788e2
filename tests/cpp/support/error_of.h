// The message of the lazyrt::Error a call throws, for tests of error messages.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>

#include <lazyrt/lazyrt.h>

namespace lazyrt::testing_support {

/// The message of the lazyrt::Error that `call` throws; a test failure if it throws anything
/// else or nothing.
inline std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw an exception that is not lazyrt::Error: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

}  // namespace lazyrt::testing_support
