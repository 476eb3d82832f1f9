// The int8 screen of the LM head on AMX tiles, for greedy_head.cpp: approx = h . w_j for every token,
// read from a quarter of the fp32 head's bytes.
//
// Why: a decode step's LM head streams every vocabulary row; in bf16 that is 57 MB for the default
// model, 9% of the step's DRAM traffic, and at a few hundred rows the bf16 product is compute-bound.
// Here the weights are int8, one scale per row (half the bf16 bytes), and AMX's int8 tiles multiply
// at twice its bf16 rate. The screen only has to be close, with a proven bound (greedy_head.cpp): the
// token is decided by exact logits.
//
// Weights: w_j ~ s_j q_j, q_j = round(w_j / s_j) in [-127, 127], s_j = max |w_j| / 127; packed as
// AMX's B tiles, [NB][KS][16][64] int8, NB = ceil(V / 16), KS = ceil(K / 64): the tile of (block nb,
// step s) holds q[16 nb + n][64 s + 4 i + c] at [i][4 n + c]; columns past V and K past the end are 0.
// Rows: h ~ a q_hi + b q_lo, two int8 rows (a = max |h| / 127, b the same of the rest h - a q_hi), so
// the product's error is the weights' quantization, not the hidden row's (whose outlier dimensions
// would otherwise set a coarse step for all of it). The integer sums are exact (int32); then
// approx = s_j (a I_hi + b I_lo), rounded to bf16.
#pragma once

#include "amx_tiles.h"
#include "vec_math.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace bulkrun_cpu {
namespace {

constexpr int64_t kInt8Step = 64;  // K per int8 tile instruction
constexpr int64_t kInt8Cols = 16;

// x (k values) -> q[0 .. k) = round(x / s) in [-127, 127], s = max |x| / 127 (returned; 0 and all
// q 0 where x is all zeros). skip (optional, k flags): dimensions left out, q 0 there and s over the
// others (head_vnni.h's outliers). Any q is sound: the bound measures the error it leaves exactly.
template <typename T>
inline float quantize_row(const T* x, int64_t k, int8_t* q, const uint8_t* skip = nullptr) {
  double top = 0.0;
  for (int64_t i = 0; i < k; ++i)
    if (!skip || !skip[i]) top = std::max(top, std::fabs(static_cast<double>(x[i])));
  const float scale = static_cast<float>(top / 127.0);
  const double inv = scale > 0.f ? 1.0 / scale : 0.0;
  for (int64_t i = 0; i < k; ++i)
    q[i] = skip && skip[i] ? 0 : static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0, 127.0));
  return scale;
}

// One weight row: its quantized values into q[0 .. k) (the caller packs them), its scale; returns
// ||w - s q|| in double.
inline double quantize_weight_row(const float* w, int64_t k, int8_t* q, float& scale) {
  scale = quantize_row(w, k, q);
  double err = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    const double e = static_cast<double>(w[i]) - static_cast<double>(scale) * q[i];
    err += e * e;
  }
  return std::sqrt(err);
}

// The hidden row h (k floats) as hi and lo int8 rows (zero past k up to kp) and their scales: hi
// quantizes h, lo what hi leaves (h - a q_hi, in double).
struct SplitRow {
  float hi_scale = 0.f, lo_scale = 0.f;
};
inline SplitRow split_row(const float* h, int64_t k, int64_t kp, int8_t* hi, int8_t* lo) {
  SplitRow s;
  s.hi_scale = quantize_row(h, k, hi);
  thread_local std::vector<double> rest;
  rest.resize(k);
  for (int64_t i = 0; i < k; ++i) rest[i] = static_cast<double>(h[i]) - static_cast<double>(s.hi_scale) * hi[i];
  s.lo_scale = quantize_row(rest.data(), k, lo);
  for (int64_t i = k; i < kp; ++i) hi[i] = lo[i] = 0;
  return s;
}

}  // namespace
}  // namespace bulkrun_cpu

#if defined(BULKRUN_AMX_TILES) && defined(__AMX_INT8__) && defined(__AVX512BF16__)
#define BULKRUN_HEAD_INT8 1

namespace bulkrun_cpu {
namespace {

// approx[r][j] (bf16, rows ldc apart) = bf16(s_j (a_r I_hi + b_r I_lo)) for rows r < m and tokens j < v.
// a: the rows as [ceil(m / 16)][hi, lo][16][kp] int8 (each 16-row block's hi rows, then its lo rows);
// split: their scales; packed, scales: the weights'.
void int8_screen(const int8_t* a, const SplitRow* split, int64_t m, int64_t kp, const int8_t* packed,
                 const float* scales, int64_t v, uint16_t* approx, int64_t ldc) {
  const int64_t nb = (v + kInt8Cols - 1) / kInt8Cols, ks = kp / kInt8Step, pairs = (nb + 1) / 2;
  const int64_t panel = ks * 16 * 64, blocks = (m + 15) / 16;
  at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
    configure_tiles();
    alignas(64) int32_t c[4][16][16];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b0 = 2 * p, cols = std::min<int64_t>(32, v - b0 * kInt8Cols);
      const bool two = b0 + 1 < nb;
      const int8_t* w0 = packed + b0 * panel;
      const int8_t* w1 = w0 + panel;
      for (int64_t rb = 0; rb < blocks; ++rb) {
        const int8_t* hi = a + rb * 2 * 16 * kp;
        const int8_t* lo = hi + 16 * kp;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t s = 0; s < ks; ++s) {
          _tile_loadd(4, hi + s * kInt8Step, kp);
          _tile_loadd(5, lo + s * kInt8Step, kp);
          _tile_loadd(6, w0 + s * 1024, 64);
          _tile_dpbssd(0, 4, 6);
          _tile_dpbssd(2, 5, 6);
          if (two) {
            _tile_loadd(7, w1 + s * 1024, 64);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(3, 5, 7);
          }
        }
        _tile_stored(0, c[0], 64);
        _tile_stored(1, c[1], 64);
        _tile_stored(2, c[2], 64);
        _tile_stored(3, c[3], 64);
        const int64_t rows = std::min<int64_t>(16, m - rb * 16);
        for (int64_t r = 0; r < rows; ++r) {
          const SplitRow& sr = split[rb * 16 + r];
          uint16_t* out = approx + (rb * 16 + r) * ldc + b0 * kInt8Cols;
          for (int64_t h = 0; h < 2 && h * 16 < cols; ++h) {
            const __m512 hi_sum = _mm512_cvtepi32_ps(_mm512_load_si512(c[h][r]));
            const __m512 lo_sum = _mm512_cvtepi32_ps(_mm512_load_si512(c[2 + h][r]));
            const __m512 t = _mm512_fmadd_ps(hi_sum, _mm512_set1_ps(sr.hi_scale), _mm512_mul_ps(lo_sum, _mm512_set1_ps(sr.lo_scale)));
            const int64_t n = std::min<int64_t>(16, cols - h * 16);
            const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
            const __m512 sc = _mm512_maskz_loadu_ps(mask, scales + b0 * kInt8Cols + h * 16);
            const __m256bh y = _mm512_cvtneps_pbh(_mm512_mul_ps(t, sc));
            _mm256_mask_storeu_epi16(out + h * 16, mask, (__m256i)y);
          }
        }
      }
    }
    _tile_release();
  });
}

}  // namespace
}  // namespace bulkrun_cpu
#endif
