// The int8 screen of the LM head on AVX512-VNNI dot products, for greedy_head.cpp where AMX is absent
// (AMD Zen 4/5): approx = h . w_j for every token, from one int8 part of the row and its few largest
// dimensions in fp32.
//
// Why: a decode step's LM head is a fifth of its linear FLOPs, and the bf16 screen runs at the
// vdpbf16ps rate (32 products an instruction). vpdpbusd takes 64 byte products an instruction at
// the same instruction rate (Zen 5: 8.2 against 7.5 G a core), so a one-part int8 row screens in
// about half the time. One part is enough once the row's outlier dimensions (a model's final rows
// carry a few channels 10-40x the rest) are taken out: the rest quantizes finely, those few are
// multiplied in fp32. The screen only has to be close, with a proven bound (greedy_head.cpp).
//
// Weights: q_j = round(w_j / s_j) in [-127, 127], s_j = max |w_j| / 127 (head_int8.h's quantize_row),
// packed [NB][KQ][16][4] int8, NB = ceil(V / 16), KQ = ceil(K / 4): lane n of quad p holds
// q[16 nb + n][4p .. 4p + 3]; zeros past V and K. rowsum_j = sum_i q_j[i]. Outliers: w_out
// [NB][n_out][16] fp32 = w_j at the outlier dimensions (0 past V).
// Rows: q = round(h / a) with zeros at the outlier dimensions, a = max |h| over the others / 127,
// stored as u = q + 128 (vpdpbusd multiplies unsigned by signed bytes). The int32 sum S = u . q_j is
// exact, and S - 128 rowsum_j = q . q_j, so
//   approx = bf16( float(S - 128 rowsum_j) * s_j * a + sum_o h_o w_j[o] )   (the fp32 FMAs in order).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "panel_prefetch.h"
#include "vec_math.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define BULKRUN_HEAD_VNNI 1
#include <immintrin.h>

namespace bulkrun_cpu {
namespace {

constexpr int64_t kVnniCols = 16;  // tokens per block (one int32 vector)
constexpr int kVnniRows = 6;       // rows per pass over a panel: 6 x 4 accumulators
constexpr int kVnniPanel = 4;      // blocks per panel

struct VnniRows {
  const uint8_t* u;     // [m][kq * 4] the rows' u = q + 128
  const float* scale;   // [m] a
  const float* h_out;   // [m][n_out] the rows' values at the outlier dimensions
  int64_t kq, n_out;
};

struct VnniWeights {
  const int8_t* packed;   // [NB][kq][16][4]
  const float* scales;    // [V] s_j
  const int32_t* rowsum;  // [V]
  const float* w_out;     // [NB][n_out][16]
  int64_t v;
};

// The accumulators in vec_math.h's int32 vector type: in __m512i (64-bit lanes to GCC) every
// vpdpbusd result went through the stack.
inline I16 dot_bytes(I16 acc, I16 u, I16 q) {
  return __builtin_bit_cast(I16, _mm512_dpbusd_epi32(__builtin_bit_cast(__m512i, acc), __builtin_bit_cast(__m512i, u),
                                                     __builtin_bit_cast(__m512i, q)));
}

// rows r0 .. r0 + R of approx for blocks nb .. nb + C (cols tokens from 16 nb); pf: this tile's share
// of the thread's next panel (without it each panel's first tile waited on DRAM, and the screen ran
// at half the vpdpbusd rate)
template <int R, int C>
void vnni_tile(const VnniRows& x, const VnniWeights& w, int64_t r0, int64_t nb, int64_t cols, uint16_t* approx,
               int64_t ldc, PanelPrefetch pf) {
  const int64_t step = pf.step(x.kq);
  const int64_t block_bytes = x.kq * 64;
  const int8_t* wb = w.packed + nb * block_bytes;
  I16 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = I16{};
  const int32_t* u[R];
  for (int r = 0; r < R; ++r) u[r] = reinterpret_cast<const int32_t*>(x.u + (r0 + r) * x.kq * 4);
  for (int64_t p = 0; p < x.kq; ++p) {
    pf.issue(p, step);
    I16 b[C];
    for (int c = 0; c < C; ++c) b[c] = __builtin_bit_cast(I16, _mm512_loadu_si512(wb + c * block_bytes + p * 64));
    for (int r = 0; r < R; ++r) {
      const I16 a = __builtin_bit_cast(I16, _mm512_set1_epi32(u[r][p]));
      for (int c = 0; c < C; ++c) acc[r][c] = dot_bytes(acc[r][c], a, b[c]);
    }
  }
  // scaled sums, then the outlier products dimension by dimension: R x C independent FMA chains
  // (one chain per row and block at a time would wait on each FMA's latency)
  __m512 t[R][C];
  __mmask16 mask[C];
  const float* wo[C];
  for (int c = 0; c < C; ++c) {
    const int64_t n = std::clamp<int64_t>(cols - c * kVnniCols, 0, kVnniCols);
    mask[c] = static_cast<__mmask16>((1u << n) - 1);
    const int64_t j0 = (nb + c) * kVnniCols;
    const __m512i offset = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(mask[c], w.rowsum + j0), 7);  // 128 rowsum
    const __m512 s = _mm512_maskz_loadu_ps(mask[c], w.scales + j0);
    wo[c] = w.w_out + (nb + c) * x.n_out * kVnniCols;
    for (int r = 0; r < R; ++r) {
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(__builtin_bit_cast(__m512i, acc[r][c]), offset));
      t[r][c] = _mm512_mul_ps(_mm512_mul_ps(sum, s), _mm512_set1_ps(x.scale[r0 + r]));
    }
  }
  const float* ho = x.h_out + r0 * x.n_out;
  for (int64_t o = 0; o < x.n_out; ++o)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m512 wv = _mm512_loadu_ps(wo[c] + o * kVnniCols);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) t[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(ho[r * x.n_out + o]), wv, t[r][c]);
    }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) {
      const __m256bh y = _mm512_cvtneps_pbh(t[r][c]);
      _mm256_mask_storeu_epi16(approx + (r0 + r) * ldc + (nb + c) * kVnniCols, mask[c], (__m256i)y);
    }
}

// next, next_bytes: the panel this thread screens after this one (null: none); each tile prefetches
// its share of it
template <int C>
void vnni_rows(const VnniRows& x, const VnniWeights& w, int64_t m, int64_t nb, int64_t cols, uint16_t* approx,
               int64_t ldc, const int8_t* next, int64_t next_bytes) {
  const int64_t tiles = (m + kVnniRows - 1) / kVnniRows;
  auto share = [&](int64_t tile) { return PanelPrefetch::share(next, next_bytes, tile, tiles); };
  int64_t r0 = 0;
  for (; r0 + kVnniRows <= m; r0 += kVnniRows)
    vnni_tile<kVnniRows, C>(x, w, r0, nb, cols, approx, ldc, share(r0 / kVnniRows));
  const PanelPrefetch last = share(r0 / kVnniRows);
  switch (m - r0) {
    case 1: vnni_tile<1, C>(x, w, r0, nb, cols, approx, ldc, last); break;
    case 2: vnni_tile<2, C>(x, w, r0, nb, cols, approx, ldc, last); break;
    case 3: vnni_tile<3, C>(x, w, r0, nb, cols, approx, ldc, last); break;
    case 4: vnni_tile<4, C>(x, w, r0, nb, cols, approx, ldc, last); break;
    case 5: vnni_tile<5, C>(x, w, r0, nb, cols, approx, ldc, last); break;
    default: break;
  }
}

// approx [m][v] bf16 (rows ldc apart): the threads take runs of panels (kVnniPanel blocks), each
// panel's weights staying in L1/L2 while every row passes over them.
void vnni_screen(const VnniRows& x, const VnniWeights& w, int64_t m, uint16_t* approx, int64_t ldc) {
  const int64_t nb = (w.v + kVnniCols - 1) / kVnniCols, panels = (nb + kVnniPanel - 1) / kVnniPanel;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p * kVnniPanel, blocks = std::min<int64_t>(kVnniPanel, nb - b);
      const int64_t cols = std::min<int64_t>(blocks * kVnniCols, w.v - b * kVnniCols);
      const int64_t block_bytes = x.kq * 64, next_blocks = p + 1 < p1 ? std::min<int64_t>(kVnniPanel, nb - b - kVnniPanel) : 0;
      const int8_t* next = next_blocks > 0 ? w.packed + (b + kVnniPanel) * block_bytes : nullptr;
      const int64_t next_bytes = next_blocks * block_bytes;
      switch (blocks) {
        case 4: vnni_rows<4>(x, w, m, b, cols, approx, ldc, next, next_bytes); break;
        case 3: vnni_rows<3>(x, w, m, b, cols, approx, ldc, next, next_bytes); break;
        case 2: vnni_rows<2>(x, w, m, b, cols, approx, ldc, next, next_bytes); break;
        default: vnni_rows<1>(x, w, m, b, cols, approx, ldc, next, next_bytes); break;
      }
    }
  });
}

}  // namespace
}  // namespace bulkrun_cpu
#endif
