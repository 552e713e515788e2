// A first look at lazyrt: ops record a graph, nothing runs until a sync point, and the same
// step run on new data reuses the compiled executable.
#include <iostream>

#include <lazyrt/lazyrt.h>

int main() {
  using namespace lazyrt;
  // A tiny linear model fitted by gradient descent with hand-written gradients.
  Tensor w = zeros({3, 1});
  Tensor x = tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {4, 3});
  Tensor y = tensor({1, 2, 3, 4}, {4, 1});
  const double lr = 0.002;
  for (int step = 0; step < 10; ++step) {
    Tensor pred = matmul(x, w);
    Tensor err = pred - y;
    Tensor loss = mean(err * err);
    Tensor grad = matmul(transpose(x, 0, 1), err) * (2.0 / 4.0);
    w.add_(grad, -lr);
    std::cout << "step " << step << "  pending=" << loss.is_pending();
    mark_step();  // one graph: loss and the new w
    std::cout << "  loss=" << loss.item() << '\n';
  }
  std::cout << "w = " << w << "\n\n" << metrics::report();
  return 0;
}
