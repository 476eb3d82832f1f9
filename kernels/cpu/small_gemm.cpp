// y = x @ W^T (+ bias) for few rows (decode steps), fp32, on a weight packed in 32-column panels.
//
// Why our own: at decode-sized batches (tens of rows) a step streams every weight from DRAM once, and
// oneDNN's packed GEMM leaves that traffic unoverlapped with its FMAs; this kernel overlaps it and
// runs near the FMA peak there (docs/benchmarks.md, design figures).
// Each thread walks its share of the panels; while the first row block of a panel computes, the
// next panel is prefetched into L2, and the other row blocks then read the panel from L2.
// Every output is one FMA chain over k in order, then + bias: a row's bits do not depend on the
// other rows of the call (batch invariance, docs/batch-invariance.md).
//
// Layout: wp[P][K][32] holds W[p*32 + c][k] at wp[p][k][c], columns past N zero.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "vec_math.h"

namespace bulkrun_cpu {
namespace {

constexpr int64_t kPanel = 32;  // columns per panel: two F16 vectors

// The two register tiles. On AVX-512 a panel's 32 columns are two registers a row: 12 rows x 2 =
// 24 accumulators of the 32 registers. On AVX2 (16 registers of 8 floats) an F16 is two registers,
// and GCC's code for rows of F16 pairs spilled its accumulators (~1 GFLOP/s on a Zen 2 core), so
// the panel runs as two 16-column halves (one cache line of a k row each), 6 rows x 2 registers.
// Both are plain vector types (F16, F8); acc += w * x compiles to one FMA (-ffp-contract=fast).
constexpr int kRowsWide = 12, kRowsHalves = 6;
#if defined(__AVX512F__) || !(defined(__AVX2__) && defined(__FMA__))
constexpr bool kNativeHalves = false;
#else
constexpr bool kNativeHalves = true;
#endif

// rows x 32 columns of y from `rows` rows of x and one panel; `prefetch` (or null) is the next
// panel, asked for one k row (two cache lines) per k so it arrives within this sweep.
template <int R>
void panel_rows(const float* x, int64_t ldx, const float* panel, int64_t K, const float* bias,
                const float* prefetch, float* y, int64_t ldy, int64_t cols) {
  F16 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = F16{};
#pragma GCC unroll 4
  for (int64_t k = 0; k < K; ++k) {
    const F16 w0 = load16(panel + k * kPanel), w1 = load16(panel + k * kPanel + 16);
    if (prefetch) {
      __builtin_prefetch(prefetch + k * kPanel, 0, 2);
      __builtin_prefetch(prefetch + k * kPanel + 16, 0, 2);
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const float xv = x[r * ldx + k];
      acc[r][0] += w0 * xv;
      acc[r][1] += w1 * xv;
    }
  }
  for (int r = 0; r < R; ++r) {
    F16 lo = acc[r][0], hi = acc[r][1];
    if (bias) {
      lo += load16(bias);
      hi += load16(bias + 16);
    }
    float* dst = y + r * ldy;
    if (cols == kPanel) {
      store16(dst, lo);
      store16(dst + 16, hi);
    } else {  // the last panel: y has no room past column N
      float tmp[kPanel];
      store16(tmp, lo);
      store16(tmp + 16, hi);
      std::copy(tmp, tmp + cols, dst);
    }
  }
}

// rows x 16 columns of y from `rows` rows of x and one half of a panel (`half`: its first column);
// `prefetch` (or null): the same half of the next panel, one cache line per k.
template <int R>
void half_panel_rows(const float* x, int64_t ldx, const float* half, int64_t K, const float* bias,
                     const float* prefetch, float* y, int64_t ldy, int64_t cols) {
  F8 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = F8{};
#pragma GCC unroll 4
  for (int64_t k = 0; k < K; ++k) {
    const F8 w0 = load8(half + k * kPanel), w1 = load8(half + k * kPanel + 8);
    if (prefetch) __builtin_prefetch(prefetch + k * kPanel, 0, 2);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const float xv = x[r * ldx + k];
      acc[r][0] += w0 * xv;
      acc[r][1] += w1 * xv;
    }
  }
  F8 b[2] = {};  // no bias: + 0 changes no sum (a chain from +0 is never -0)
  if (bias) std::memcpy(b, bias, sizeof(b));
  for (int r = 0; r < R; ++r) {
    const F8 out[2] = {acc[r][0] + b[0], acc[r][1] + b[1]};
    std::memcpy(y + r * ldy, out, cols * sizeof(float));  // the last panel: y has no room past column N
  }
}

// rows x 32 columns of y on the halves tile: the panel's two halves in turn (the second from L2)
template <int R>
void panel_halves(const float* x, int64_t ldx, const float* panel, int64_t K, const float* bias,
                  const float* prefetch, float* y, int64_t ldy, int64_t cols) {
  for (int64_t h = 0; h < 2 && 16 * h < cols; ++h)
    half_panel_rows<R>(x, ldx, panel + 16 * h, K, bias ? bias + 16 * h : nullptr,
                       prefetch ? prefetch + 16 * h : nullptr, y + 16 * h, ldy, std::min<int64_t>(16, cols - 16 * h));
}

template <int R, bool Halves>
void rows_dispatch(int64_t rows, const float* x, int64_t ldx, const float* panel, int64_t K,
                   const float* bias, const float* prefetch, float* y, int64_t ldy, int64_t cols) {
  if constexpr (R > 1) {
    if (rows < R) return rows_dispatch<R - 1, Halves>(rows, x, ldx, panel, K, bias, prefetch, y, ldy, cols);
  }
  if constexpr (Halves)
    panel_halves<R>(x, ldx, panel, K, bias, prefetch, y, ldy, cols);
  else
    panel_rows<R>(x, ldx, panel, K, bias, prefetch, y, ldy, cols);
}

template <bool Halves>
void run_panels(const at::Tensor& x, const at::Tensor& wp, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && wp.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat,
              "small_gemm is float32 only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [M, K] with contiguous rows");
  TORCH_CHECK(wp.dim() == 3 && wp.size(2) == kPanel && wp.is_contiguous(), "wp must be [P, K, 32], contiguous");
  TORCH_CHECK(wp.size(1) == x.size(1), "x has ", x.size(1), " columns, the weight ", wp.size(1));
  TORCH_CHECK(y.dim() == 2 && y.size(0) == x.size(0) && y.stride(1) == 1, "y must be [M, N] with contiguous rows");
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1), P = wp.size(0);
  TORCH_CHECK(N <= P * kPanel && N > (P - 1) * kPanel, "y has ", N, " columns, the weight ", P, " panels");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias)
    TORCH_CHECK(bias->is_contiguous() && bias->scalar_type() == at::kFloat && bias->numel() == P * kPanel,
                "bias must be float32 padded to the panels");
  const float* xp = x.data_ptr<float>();
  const float* w = wp.data_ptr<float>();
  const float* b = has_bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t ldx = x.stride(0), ldy = y.stride(0);
  constexpr int kRows = Halves ? kRowsHalves : kRowsWide;
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const float* panel = w + p * K * kPanel;
      const float* next = p + 1 < p1 ? panel + K * kPanel : nullptr;
      const int64_t cols = std::min(kPanel, N - p * kPanel);
      const float* bp = b ? b + p * kPanel : nullptr;
      for (int64_t m0 = 0; m0 < M; m0 += kRows)
        rows_dispatch<kRows, Halves>(std::min<int64_t>(kRows, M - m0), xp + m0 * ldx, ldx, panel, K, bp,
                                     m0 == 0 ? next : nullptr, yp + m0 * ldy + p * kPanel, ldy, cols);
    }
  });
}

// The tile this CPU's registers suit: the 32-column one on AVX-512, the halves on AVX2.
void small_gemm(const at::Tensor& x, const at::Tensor& wp, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  run_panels<kNativeHalves>(x, wp, bias, y);
}

// The halves tile on any CPU: what an AVX2 CPU runs, for tests and benches elsewhere.
void small_gemm_halves(const at::Tensor& x, const at::Tensor& wp, const c10::optional<at::Tensor>& bias,
                       at::Tensor& y) {
  run_panels<true>(x, wp, bias, y);
}

}  // namespace
}  // namespace bulkrun_cpu

TORCH_LIBRARY_FRAGMENT(bulkrun_cpu, m) {
  m.def("small_gemm(Tensor x, Tensor wp, Tensor? bias, Tensor(a!) y) -> ()");
  m.def("small_gemm_halves(Tensor x, Tensor wp, Tensor? bias, Tensor(a!) y) -> ()");
}

TORCH_LIBRARY_IMPL(bulkrun_cpu, CPU, m) {
  m.impl("small_gemm", &bulkrun_cpu::small_gemm);
  m.impl("small_gemm_halves", &bulkrun_cpu::small_gemm_halves);
}
