// y = x @ W^T (+ bias) in bf16 on AMX tiles, with a reduction order that is a function of K alone:
// torch.ops.bulkrun_cpu.amx_gemm.
//
// Why our own: oneDNN picks its blocking (and, for K = 1536 here, whether to split K) from the row
// count, so a row's bf16 output changed with how many rows shared its step (batch invariance, see
// docs/batch-invariance.md). Here every output row is its own 32-wide K steps in order, each one
// tile instruction accumulating into fp32, then bias and one rounding: the same bits whatever M is
// and wherever the row sits. One call streams each weight panel once for all rows (oneDNN in fixed
// row tiles would stream it once per tile), and no kernel is JIT-compiled per row count.
//
// Layout: wp[NB][KS][16][32] bf16, NB = ceil(N / 16) column blocks, KS = K / 32 steps; the tile of
// (block nb, step s) holds W[16 nb + c][32 s + 2 i + j] at [i][2 c + j] (AMX's pair-interleaved B).
// Columns past N are zeros. Threads own column-block pairs; within one, all rows in blocks of 32.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bf16_gemm_args.h"
#include "vec_math.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#define BULKRUN_AMX_GEMM 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace bulkrun_cpu {
namespace {

constexpr int64_t kCols = 16;  // columns per tile (16 fp32 of C, 16 pairs of B)
constexpr int64_t kStep = 32;  // K per tile instruction
constexpr int64_t kTileRows = 16;

#ifdef BULKRUN_AMX_GEMM
// Linux hands out AMX's tile state only on request (arch_prctl; asking twice is fine).
bool amx_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0-3: C (2 row blocks x 2 column blocks), 4-5: A (row blocks), 6-7: B (column blocks)
void configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
}

// C (32 x 32 fp32 in c, rows 128 bytes apart) = rows a0, a1 (16 each) times column blocks b0, b1
// over `steps` K steps; a second row block or column block only where `two_rows` / `two_cols`.
// The branches are per call, not per step: the instruction sequence of each row is the same.
void block(const bf16* a0, int64_t a0_stride, const bf16* a1, int64_t a1_stride, const bf16* b0, const bf16* b1,
           int64_t steps, bool two_rows, bool two_cols, float* c) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, a0 + s * kStep, a0_stride);
    _tile_loadd(6, b0 + s * kTileRows * kStep, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (two_cols) {
      _tile_loadd(7, b1 + s * kTileRows * kStep, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (two_rows) {
      _tile_loadd(5, a1 + s * kStep, a1_stride);
      _tile_dpbf16ps(2, 5, 6);
      if (two_cols) _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr int64_t ld = 2 * kCols * sizeof(float);
  _tile_stored(0, c, ld);
  _tile_stored(1, c + kCols, ld);
  _tile_stored(2, c + kTileRows * 2 * kCols, ld);
  _tile_stored(3, c + kTileRows * 2 * kCols + kCols, ld);
}
#endif

// rows x cols of the 32 x 32 fp32 block c (+ bias) -> y, rounded once to Y
template <typename Y>
void write_block(const float* c, int64_t rows, int64_t cols, const float* bias, Y* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = c + r * 2 * kCols;
    Y* dst = y + r * ldy;
    for (int64_t j = 0; j < cols; ++j) dst[j] = from_float<Y>(src[j] + (bias ? bias[j] : 0.f));
  }
}

template <typename Y>
void gemm(const at::Tensor& x, const at::Tensor& wp, const float* bias, at::Tensor& y) {
#ifdef BULKRUN_AMX_GEMM
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1), NB = wp.size(0), steps = K / kStep;
  const bf16* xp = static_cast<const bf16*>(x.data_ptr());
  const bf16* w = static_cast<const bf16*>(wp.data_ptr());
  Y* yp = static_cast<Y*>(y.data_ptr());
  const int64_t ldx = x.stride(0), ldy = y.stride(0);
  // the last partial 16-row block, zero-padded: a tile load must not read past x (its rows do not
  // touch the others': each C row comes from its own A row)
  const int64_t full = M / kTileRows * kTileRows;
  std::vector<bf16> tail(M > full ? kTileRows * K : 0, 0);
  for (int64_t r = full; r < M; ++r) std::memcpy(&tail[(r - full) * K], xp + r * ldx, K * sizeof(bf16));
  auto rows_at = [&](int64_t m) { return m < full ? xp + m * ldx : tail.data(); };
  auto stride_at = [&](int64_t m) { return static_cast<int64_t>((m < full ? ldx : K) * sizeof(bf16)); };
  const int64_t pairs = (NB + 1) / 2, panel = steps * kTileRows * kStep;
  at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
    configure();
    alignas(64) float c[2 * kTileRows * 2 * kCols];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t nb = 2 * p, n0 = nb * kCols;
      const bool two_cols = nb + 1 < NB;
      const bf16* b0 = w + nb * panel;
      for (int64_t m = 0; m < M; m += 2 * kTileRows) {
        const bool two_rows = m + kTileRows < M;
        const int64_t m1 = two_rows ? m + kTileRows : m;
        block(rows_at(m), stride_at(m), rows_at(m1), stride_at(m1), b0, b0 + panel, steps, two_rows, two_cols, c);
        write_block(c, std::min(2 * kTileRows, M - m), std::min(2 * kCols, N - n0), bias ? bias + n0 : nullptr,
                    yp + m * ldy + n0, ldy);
      }
    }
    _tile_release();
  });
#else
  TORCH_CHECK(false, "amx_gemm: built without AMX");
#endif
}

void amx_gemm(const at::Tensor& x, const at::Tensor& wp, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  const float* b = check_bf16_gemm_args("amx_gemm", x, wp, bias, y);
  if (y.scalar_type() == at::kBFloat16)
    gemm<bf16>(x, wp, b, y);
  else
    gemm<float>(x, wp, b, y);
}

bool amx_gemm_available() {
#ifdef BULKRUN_AMX_GEMM
  const char* env = std::getenv("BULKRUN_CPU_AMX");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  return amx_permitted();
#else
  return false;
#endif
}

}  // namespace
}  // namespace bulkrun_cpu

TORCH_LIBRARY_FRAGMENT(bulkrun_cpu, m) {
  m.def("amx_gemm(Tensor x, Tensor wp, Tensor? bias, Tensor(a!) y) -> ()");
  m.def("amx_gemm_available() -> bool", &bulkrun_cpu::amx_gemm_available);
}

TORCH_LIBRARY_IMPL(bulkrun_cpu, CPU, m) { m.impl("amx_gemm", &bulkrun_cpu::amx_gemm); }
