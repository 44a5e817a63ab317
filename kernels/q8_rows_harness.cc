// The q8 kernel's inner function (`q8_rows`: one weight row against TM rows of x) timed on one
// thread outside XLA: no thread pool, no dispatch, the minimum of many passes over a matrix
// that stays in the caches. On a shared 2-core host whose speed drifts, per-call timings
// through JAX move by 20-50% from run to run; this moves by a few percent, so it tells a
// change in the register code from noise. Random codes (scales 1.0), random 8-bit x.
//
//   g++ -O3 -march=native -std=c++17 -fno-math-errno -ffp-contract=off -w \
//       -I$(python -c "import jaxlib, os; print(os.path.dirname(jaxlib.__file__))")/include \
//       kernels/q8_rows_harness.cc -o /tmp/q8_rows_harness && /tmp/q8_rows_harness
//
// Prints microseconds per matrix (every weight row once against the TM rows), Q4_K [2048,
// 1536] (w_gate's shape, fewer rows) with and without the 8-row tile layout (`Q8Tile`, what
// `matmul_q8_impl` hands every call of 2 rows or more), Q6_K [512, 8960] (w_down's), Q5_0 and
// Q8_0 [2048, 896] (the 0.5B drafter's 896-wide rows).
#include "../vocabjax/kernels/cpu_matmul.cc"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

namespace {

template <QT T, int TM>
double per_matrix_us(const std::vector<uint8_t>& w, int64_t F, int64_t D,
                     const std::vector<int8_t>& q, const std::vector<float>& d,
                     const std::vector<int32_t>& sums, const Q8Tile* tile, int passes) {
  constexpr int64_t V = QTraits<T>::values, B = QTraits<T>::bytes;
  const int64_t row_bytes = D / V * B;
  std::vector<float> y(TM * F);
  double best = 1e30;
  for (int r = 0; r < passes; ++r) {
    const auto t = std::chrono::steady_clock::now();
    for (int64_t f = 0; f < F; ++f)
      q8_rows<T, TM>(w.data() + f * row_bytes, q.data(), d.data(), sums.data(), D, y.data() + f,
                     F, tile);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
                              .count());
  }
  return best * 1e6;
}

template <QT T>
void run(const char* name, int64_t F, int64_t D) {
  constexpr int64_t V = QTraits<T>::values, B = QTraits<T>::bytes, P = 200;
  std::mt19937 g(1);
  std::vector<uint8_t> w(F * D / V * B);
  for (auto& b : w) b = static_cast<uint8_t>(g());
  for (int64_t i = 0; i < F * D / V; ++i) {  // f16 1.0 for the block's scales
    uint8_t* p = w.data() + i * B;
    if (T == QT::Q4_K) { p[0] = 0; p[1] = 0x3c; p[2] = 0; p[3] = 0x3c; }
    else if (T == QT::Q6_K) { p[208] = 0; p[209] = 0x3c; }
    else { p[0] = 0; p[1] = 0x3c; }  // the 32-value types: the scale first
  }
  constexpr int64_t M = 8, QK = kQ8Kind<T> == Q8Kind::K256 ? 256 : 32;
  std::vector<int8_t> q(M * D);
  for (auto& v : q) v = static_cast<int8_t>(static_cast<int>(g() % 255) - 127);
  std::vector<float> d(M * D / QK, 0.01f);
  std::vector<int32_t> sums(M * D / 32);
  for (int64_t i = 0; i < M * D / 32; ++i)
    for (int l = 0; l < 32; ++l) sums[i] += q[i * 32 + l];
  std::printf("%s [%ld, %ld], us per matrix (minimum of %ld passes)\n", name, F, D, P);
  std::printf("  rows of x    1: %.0f\n", per_matrix_us<T, 1>(w, F, D, q, d, sums, nullptr, P));
#if defined(VJ_Q8_TILE)
  const int64_t nb = D / QK;
  std::vector<float> td(nb * 8);
  std::vector<int16_t> ts(nb * 64);
  fill_tile(d.data(), sums.data(), 8, nb, td.data(), ts.data());
  const Q8Tile tile{td.data(), ts.data()};
  const Q8Tile* tp = T == QT::Q4_K ? &tile : nullptr;
#else
  const Q8Tile* tp = nullptr;
#endif
  std::printf("  rows of x    2: %.0f   (tile layout: %.0f)\n",
              per_matrix_us<T, 2>(w, F, D, q, d, sums, nullptr, P),
              per_matrix_us<T, 2>(w, F, D, q, d, sums, tp, P));
  std::printf("  rows of x    4: %.0f   (tile layout: %.0f)\n",
              per_matrix_us<T, 4>(w, F, D, q, d, sums, nullptr, P),
              per_matrix_us<T, 4>(w, F, D, q, d, sums, tp, P));
  std::printf("  rows of x    5: %.0f   (tile layout: %.0f)\n",
              per_matrix_us<T, 5>(w, F, D, q, d, sums, nullptr, P),
              per_matrix_us<T, 5>(w, F, D, q, d, sums, tp, P));
  std::printf("  rows of x %4d: %.0f   (tile layout: %.0f)\n", kQ8TM,
              per_matrix_us<T, kQ8TM>(w, F, D, q, d, sums, nullptr, P),
              per_matrix_us<T, kQ8TM>(w, F, D, q, d, sums, tp, P));
}

}  // namespace

int main() {
  run<QT::Q4_K>("Q4_K", 2048, 1536);
  run<QT::Q6_K>("Q6_K", 512, 8960);
  run<QT::Q5_0>("Q5_0", 2048, 896);  // the 0.5B drafter's body
  run<QT::Q8_0>("Q8_0", 2048, 896);
  return 0;
}
