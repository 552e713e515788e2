#include <iostream>

#include <lazyrt/lazyrt.h>

int main() {
  using namespace lazyrt;
  const double got = (tensor({1, 2, 3}, {3}) * 2.0).sum().item();
  if (got != 12.0) {
    std::cerr << "consumer: expected 12, got " << got << '\n';
    return 1;
  }
  std::cout << "consumer: ok (12)\n";
  return 0;
}
