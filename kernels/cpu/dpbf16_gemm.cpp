// y = x @ W^T (+ bias) in bf16 on AVX512-BF16 dot products, for CPUs without AMX (AMD Zen 4/5, Intel
// Cooper Lake): torch.ops.bulkrun_cpu.dpbf16_gemm, with amx_gemm's weight layout and contract.
//
// Why our own: without it a batch invariant bf16 linear runs oneDNN in fixed 64-row tiles, which
// streams every weight once per tile: a decode step of 256 rows read the model's weights 4 times
// (docs/benchmarks.md). Here one call streams each weight panel once for all rows, and every output
// row is its own sum over K in pairs, in order (one vdpbf16ps per pair of K into an fp32 lane), then
// bias and one rounding: the same bits whatever M is and wherever the row sits.
//
// Layout (amx_gemm.cpp's): wp[NB][K/32][16][32] bf16; for column block nb the 16 lanes of K pair kp
// (= 16 s + i) are the 64 bytes at wp[nb][s][i], so a block's pairs are consecutive vectors. Threads
// own equal runs of column blocks, taken kPanel blocks (a panel) at a time; within one, rows kRows
// at a time, the panel staying in L2.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "bf16_gemm_args.h"
#include "panel_prefetch.h"
#include "vec_math.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define BULKRUN_DPBF16 1
#include <immintrin.h>
#endif

namespace bulkrun_cpu {
namespace {

constexpr int64_t kCols = 16;  // columns per block (one fp32 vector)
constexpr int64_t kPanel = 4;  // column blocks per panel: 4 x kRows accumulators
constexpr int64_t kRows = 6;   // rows per pass over a panel: 24 accumulators + 4 weight vectors
constexpr int64_t kRowChunk = 240;  // rows per sweep over all panels: their x stays in L2

#ifdef BULKRUN_DPBF16
// rows R x blocks C of y: acc[r][c] lane j = sum over K pairs of x[r] . W[16 (nb + c) + j], in order
template <int R, int C, typename Y>
void tile(const bf16* x, int64_t ldx, const bf16* w, int64_t block_stride, int64_t pairs, const float* bias,
          Y* y, int64_t ldy, int64_t cols, PanelPrefetch pf) {
  const int64_t step = pf.step(pairs);
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const int32_t* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = reinterpret_cast<const int32_t*>(x + r * ldx);
  for (int64_t kp = 0; kp < pairs; ++kp) {
    pf.issue(kp, step);
    __m512bh b[C];
    for (int c = 0; c < C; ++c)
      b[c] = (__m512bh)_mm512_loadu_si512(w + c * block_stride + kp * 2 * kCols);
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(xr[r][kp]);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a, b[c]);
    }
  }
  for (int c = 0; c < C; ++c) {
    const int64_t n = std::min<int64_t>(kCols, cols - c * kCols);
    if (n <= 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
    const __m512 add = bias ? _mm512_loadu_ps(bias + c * kCols) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const __m512 v = _mm512_add_ps(acc[r][c], add);
      Y* dst = y + r * ldy + c * kCols;
      if constexpr (std::is_same_v<Y, float>) {
        _mm512_mask_storeu_ps(dst, mask, v);
      } else {
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);  // round to nearest even, as store16
        _mm256_mask_storeu_epi16(dst, mask, h);
      }
    }
  }
}

// `next`/`next_bytes`: the panel this thread runs after this one (null: none); each pass prefetches
// its share of it.
template <int C, typename Y>
void rows_of_panel(int64_t rows, const bf16* x, int64_t ldx, const bf16* w, int64_t block_stride, int64_t pairs,
                   const float* bias, Y* y, int64_t ldy, int64_t cols, const bf16* next, int64_t next_bytes) {
  const int64_t passes = (rows + kRows - 1) / kRows;
  auto share = [&](int64_t pass) { return PanelPrefetch::share(next, next_bytes, pass, passes); };
  int64_t m = 0;
  for (; m + kRows <= rows; m += kRows)
    tile<kRows, C>(x + m * ldx, ldx, w, block_stride, pairs, bias, y + m * ldy, ldy, cols, share(m / kRows));
  const PanelPrefetch last = share(m / kRows);
  switch (rows - m) {  // the same per-row instructions on fewer rows
    case 1: tile<1, C>(x + m * ldx, ldx, w, block_stride, pairs, bias, y + m * ldy, ldy, cols, last); break;
    case 2: tile<2, C>(x + m * ldx, ldx, w, block_stride, pairs, bias, y + m * ldy, ldy, cols, last); break;
    case 3: tile<3, C>(x + m * ldx, ldx, w, block_stride, pairs, bias, y + m * ldy, ldy, cols, last); break;
    case 4: tile<4, C>(x + m * ldx, ldx, w, block_stride, pairs, bias, y + m * ldy, ldy, cols, last); break;
    case 5: tile<5, C>(x + m * ldx, ldx, w, block_stride, pairs, bias, y + m * ldy, ldy, cols, last); break;
    default: break;
  }
}
#endif

template <typename Y>
void gemm(const at::Tensor& x, const at::Tensor& wp, const float* bias, at::Tensor& y) {
#ifdef BULKRUN_DPBF16
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1), NB = wp.size(0);
  const bf16* xp = static_cast<const bf16*>(x.data_ptr());
  const bf16* w = static_cast<const bf16*>(wp.data_ptr());
  Y* yp = static_cast<Y*>(y.data_ptr());
  const int64_t ldx = x.stride(0), ldy = y.stride(0), pairs = K / 2, block_stride = K * kCols;
  for (int64_t m0 = 0; m0 < M; m0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, M - m0);
    // threads split the column blocks evenly (whole panels would leave one thread a panel more:
    // 15 or 9 panels on two threads idle one for 7-10% of the call); each runs its own in panels
    at::parallel_for(0, NB, kPanel, [&](int64_t b0, int64_t b1) {
      for (int64_t nb = b0; nb < b1; nb += kPanel) {
        const int64_t n0 = nb * kCols, blocks = std::min(kPanel, b1 - nb);
        const bf16* wb = w + nb * block_stride;
        const float* b = bias ? bias + n0 : nullptr;
        const bf16* xs = xp + m0 * ldx;
        Y* ys = yp + m0 * ldy + n0;
        const int64_t cols = N - n0;
        // a panel's blocks are adjacent: the next one is one contiguous run
        const bf16* next = nb + kPanel < b1 ? wb + kPanel * block_stride : nullptr;
        const int64_t next_bytes = next ? std::min(kPanel, b1 - nb - kPanel) * block_stride * 2 : 0;
        switch (blocks) {
          case 4: rows_of_panel<4>(rows, xs, ldx, wb, block_stride, pairs, b, ys, ldy, cols, next, next_bytes); break;
          case 3: rows_of_panel<3>(rows, xs, ldx, wb, block_stride, pairs, b, ys, ldy, cols, next, next_bytes); break;
          case 2: rows_of_panel<2>(rows, xs, ldx, wb, block_stride, pairs, b, ys, ldy, cols, next, next_bytes); break;
          default: rows_of_panel<1>(rows, xs, ldx, wb, block_stride, pairs, b, ys, ldy, cols, next, next_bytes); break;
        }
      }
    });
  }
#else
  TORCH_CHECK(false, "dpbf16_gemm: built without AVX512-BF16");
#endif
}

void dpbf16_gemm(const at::Tensor& x, const at::Tensor& wp, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  const float* b = check_bf16_gemm_args("dpbf16_gemm", x, wp, bias, y);
  if (y.scalar_type() == at::kBFloat16)
    gemm<bf16>(x, wp, b, y);
  else
    gemm<float>(x, wp, b, y);
}

bool dpbf16_gemm_available() {
#ifdef BULKRUN_DPBF16
  return true;
#else
  return false;
#endif
}

}  // namespace
}  // namespace bulkrun_cpu

TORCH_LIBRARY_FRAGMENT(bulkrun_cpu, m) {
  m.def("dpbf16_gemm(Tensor x, Tensor wp, Tensor? bias, Tensor(a!) y) -> ()");
  m.def("dpbf16_gemm_available() -> bool", &bulkrun_cpu::dpbf16_gemm_available);
}

TORCH_LIBRARY_IMPL(bulkrun_cpu, CPU, m) { m.impl("dpbf16_gemm", &bulkrun_cpu::dpbf16_gemm); }
