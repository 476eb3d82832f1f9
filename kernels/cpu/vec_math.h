// Small math for the CPU kernels, written for the compiler's vector extensions: `F16` is one AVX-512
// register of 16 floats (two AVX2 registers where AVX-512 is missing; the cross-lane steps and the
// selects have AVX2 versions, as generic 16-lane shuffles, compares and ?: compile to lane-by-lane
// code there). The same templates work on plain floats, so `#pragma omp simd` loops over them
// vectorize too.
//
// Tensors are float32 or bfloat16; a bfloat16 element is held as its bits, `bf16` (torch's
// at::BFloat16 has the same layout). Kernels compute in float32 either way: load16 / to_float widen
// on the way in, store16 / from_float round to nearest even on the way out (as torch's .bfloat16()).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace bulkrun_cpu {

typedef float F16 __attribute__((vector_size(64)));
typedef float F16Unaligned __attribute__((vector_size(64), aligned(4)));
typedef int32_t I16 __attribute__((vector_size(64)));

inline F16 load16(const float* p) { return *reinterpret_cast<const F16Unaligned*>(p); }
// Half an F16 (8 floats: one AVX2 register), for code whose F16 sums would not fit AVX2's 16
// registers; loaded by memcpy, as __m256 and its intrinsics made GCC 12 keep such sums on the stack.
typedef float F8 __attribute__((vector_size(32)));
inline F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof(F8));
  return v;
}
inline void store8(float* p, F8 v) { std::memcpy(p, &v, sizeof(F8)); }
inline void store16(float* p, F16 v) { *reinterpret_cast<F16Unaligned*>(p) = v; }
// Whether an F16 takes two registers (AVX2): code whose F16 values GCC would keep on the stack there
// has an 8-lane-halves form
#ifdef __AVX512F__
constexpr bool kF16IsTwoRegisters = false;
#else
constexpr bool kF16IsTwoRegisters = true;
#endif
inline F16 splat(float x) { return F16{} + x; }

// Lane i of the result: x[i] > y[i] ? a[i] : b[i] (y may be one value for every lane; on plain
// values, the plain ?:). GCC 12 compares and selects a 64-byte vector lane by lane, with branches,
// where vectors are 32 bytes (AVX2): there it goes as two 8-lane halves, a compare and a blend each.
// The same lanes either way.
template <typename V>
struct Halves {
  typedef std::remove_cv_t<std::remove_reference_t<decltype(V{}[0])>> Lane;
  typedef Lane Half __attribute__((vector_size(sizeof(V) / 2)));
  Half h[2];
  explicit Halves(V v) { std::memcpy(h, &v, sizeof(V)); }
};
template <typename X, typename Y, typename V>
inline V where_greater(X x, Y y, V a, V b) {
#ifdef __AVX512F__
  return x > y ? a : b;
#else
  if constexpr (std::is_arithmetic_v<X>) {
    return x > y ? a : b;
  } else {
    const Halves<X> xs(x);
    const Halves<V> as(a), bs(b);
    typename Halves<V>::Half out[2];
    for (int i = 0; i < 2; ++i) {
      if constexpr (std::is_arithmetic_v<Y>) out[i] = xs.h[i] > y ? as.h[i] : bs.h[i];
      else out[i] = xs.h[i] > Halves<Y>(y).h[i] ? as.h[i] : bs.h[i];
    }
    V v;
    std::memcpy(&v, out, sizeof(V));
    return v;
  }
#endif
}

typedef uint16_t bf16;
typedef uint16_t U16x16Unaligned __attribute__((vector_size(32), aligned(2)));
typedef uint32_t U32x16 __attribute__((vector_size(64)));

inline float to_float(float x) { return x; }
inline float to_float(bf16 b) { return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16); }

// float -> T, rounding to nearest even; a NaN stays a (quiet) NaN
template <typename T>
inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    const uint32_t u = __builtin_bit_cast(uint32_t, x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((u >> 16) | 0x40);
    return static_cast<bf16>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

// bf16 is the top half of an fp32: widen 16 of them by a shift (one instruction with AVX-512)
inline F16 load16(const bf16* p) {
#ifdef __AVX512F__
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return __builtin_bit_cast(F16, _mm512_slli_epi32(wide, 16));
#else
  return __builtin_bit_cast(F16, __builtin_convertvector(*reinterpret_cast<const U16x16Unaligned*>(p), U32x16) << 16);
#endif
}

// 8 of them, as load8 loads floats
typedef uint16_t U16x8Unaligned __attribute__((vector_size(16), aligned(2)));
typedef uint32_t U32x8 __attribute__((vector_size(32)));
inline F8 load8(const bf16* p) {
  return __builtin_bit_cast(F8, __builtin_convertvector(*reinterpret_cast<const U16x8Unaligned*>(p), U32x8) << 16);
}

inline void store16(bf16* p, F16 v) {
#if defined(__AVX512BF16__)
  const __m256bh r = _mm512_cvtneps_pbh(__builtin_bit_cast(__m512, v));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), __builtin_bit_cast(__m256i, r));
#else
  for (int i = 0; i < 16; ++i) p[i] = from_float<bf16>(v[i]);
#endif
}

// v rounded to bf16 as from_float rounds each lane (nearest even, NaN kept quiet, subnormals kept:
// the AVX512-BF16 conversion store16 uses flushes them), and widened back / stored. For the
// elementwise ops, whose bf16 outputs are the scalar rounding's, 16 lanes at a time.
inline U32x16 nearest_bf16_bits(F16 v) {
  const U32x16 u = __builtin_bit_cast(U32x16, v);
  const U32x16 nan = (u >> 16) | 0x40u;
  const U32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return where_greater(u & 0x7fffffffu, 0x7f800000u, nan, rounded);
}
inline F16 round_bf16(F16 v) { return __builtin_bit_cast(F16, nearest_bf16_bits(v) << 16); }
inline void store16_nearest(bf16* p, F16 v) {
  *reinterpret_cast<U16x16Unaligned*>(p) = __builtin_convertvector(nearest_bf16_bits(v), U16x16Unaligned);
}
inline void store16_nearest(float* p, F16 v) { store16(p, v); }

// store16_nearest's bits through the AVX512-BF16 conversion, one instruction for its nine: it rounds
// to nearest even and quiets a NaN as from_float does (3e8 random, NaN, inf and tie lanes compared),
// but flushes subnormals to zero. `flushed` gathers the lanes that were subnormal: a row that had
// any is stored again with store16_nearest (store_row_nearest). For the elementwise ops bound by their vector
// arithmetic (the gated activation: 150 -> 110 us a 256 x 1536 block, one Zen 5 core).
struct NearestRowStore {
  uint32_t flushed = 0;
  void operator()(float* p, F16 v) { store16(p, v); }
  void operator()(bf16* p, F16 v) {
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
    flushed |= _mm512_fpclass_ps_mask(__builtin_bit_cast(__m512, v), 0x20);  // 0x20: subnormal
    store16(p, v);
#else
    store16_nearest(p, v);
#endif
  }
};

// row(store) writes a row's vectors through `store`: through NearestRowStore, and once more with
// store16_nearest where that flushed a subnormal lane, so the row holds store16_nearest's bits.
template <typename Row>
inline void store_row_nearest(Row&& row) {
  NearestRowStore fast;
  row(fast);
  if (fast.flushed) row([](auto* p, F16 v) { store16_nearest(p, v); });
}
// v as a T would hold it (bf16: rounded, then widened again)
inline F16 round_to(F16 v, float) { return v; }
inline F16 round_to(F16 v, bf16) { return round_bf16(v); }

// A software prefetch into L1 that the compiler keeps: GCC deletes a loop whose body is only
// __builtin_prefetch calls (it counts them as free of side effects), so x86 gets the instruction itself.
inline void prefetch_l1(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

// The same into L2 only: L1 has few miss buffers, and a burst of L1 prefetches stalls on them.
inline void prefetch_l2(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

template <typename T>
inline T select_max(T a, T b) { return where_greater(a, b, a, b); }
template <typename T>
inline T select_min(T a, T b) { return where_greater(b, a, a, b); }

// exp(x) to ~1 ulp for x in [-87, 88] (Cephes expf). Inputs below -87 give exp(-87) ~ 1.6e-38:
// callers that need an exact 0 (masked softmax lanes) select it themselves. kClamp = false: the
// caller knows x is in [-87, 88] or selects such lanes away (a softmax's shifted scores), and skips
// the clamps (the same bits in range; anything, even NaN, outside).
template <bool kClamp = true, typename T>
inline T vec_exp(T x) {
  if constexpr (kClamp) x = select_min(select_max(x, T{} - 87.0f), T{} + 88.0f);
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  const T t = x * 1.44269504088896341f + magic;
  const T n = t - magic;
  const T r = x - n * 0.693359375f - n * -2.12194440e-4f;
  T p = T{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const T y = p * r * r + r + 1.0f;
  if constexpr (sizeof(T) == sizeof(float)) {
    const int32_t e = __builtin_bit_cast(int32_t, t) - __builtin_bit_cast(int32_t, magic);
    return y * __builtin_bit_cast(float, (e + 127) << 23);
  } else {
    const I16 e = __builtin_bit_cast(I16, t) - __builtin_bit_cast(int32_t, magic);
    return y * __builtin_bit_cast(F16, (e + 127) << 23);
  }
}

// Lane i of the result = the sum of the 16 lanes of v[i], by one fixed tree: lanes x and x+8 first,
// then x and x+4, x and x+2, x and x+1. A row's score is bit for bit the same on every CPU path below
// (additions only commute, so each path may hold the partial sums in its own lane order).
#ifdef __AVX2__
#ifndef __AVX512F__
// An F16 as the two AVX2 registers the compiler holds it in (lanes 0-7, 8-15).
struct F16Halves {
  __m256 lo, hi;
};
inline F16 join(__m256 lo, __m256 hi) { return __builtin_bit_cast(F16, F16Halves{lo, hi}); }

// The tree on 256-bit registers: the generic shuffles of 16-lane vectors compile to lane-by-lane
// moves without AVX-512. s1: v[x] + v[x+8]; s2 [vector 2i | 2i+1]: s1[x] + s1[x+4];
// s3 [4m, 4m+2 | 4m+1, 4m+3]: s2[x] + s2[x+2]; then s3[0] + s3[1], lanes put back in order.
inline F16 sum_each(const F16* v) {
  __m256 s1[16], s2[8], s3[4], out[2];
  for (int i = 0; i < 16; ++i) {  // loaded as halves: a bit_cast of the F16 went through the stack
    const float* f = reinterpret_cast<const float*>(v + i);
    s1[i] = _mm256_add_ps(_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8));
  }
  for (int i = 0; i < 8; ++i)
    s2[i] = _mm256_add_ps(_mm256_permute2f128_ps(s1[2 * i], s1[2 * i + 1], 0x20),
                          _mm256_permute2f128_ps(s1[2 * i], s1[2 * i + 1], 0x31));
  for (int m = 0; m < 4; ++m)
    s3[m] = _mm256_add_ps(_mm256_shuffle_ps(s2[2 * m], s2[2 * m + 1], 0x44),
                          _mm256_shuffle_ps(s2[2 * m], s2[2 * m + 1], 0xee));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // [0 2 4 6 | 1 3 5 7] -> 0 .. 7
  for (int n = 0; n < 2; ++n)
    out[n] = _mm256_permutevar8x32_ps(_mm256_add_ps(_mm256_shuffle_ps(s3[2 * n], s3[2 * n + 1], 0x88),
                                                    _mm256_shuffle_ps(s3[2 * n], s3[2 * n + 1], 0xdd)),
                                      order);
  return join(out[0], out[1]);
}
#define BULKRUN_SUM_EACH_AVX2 1
#endif
#endif

#ifndef BULKRUN_SUM_EACH_AVX2
// A shuffle tree that folds halves together (8, 4, 2, 1 lanes): 15 two-shuffle folds for 16 dot
// products instead of 16 serial lane sums.
inline F16 sum_each(const F16* v) {
  const I16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const I16 lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const I16 lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const I16 lo1 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  F16 w[8], x[4], y[2];
  for (int k = 0; k < 8; ++k)
    w[k] = __builtin_shuffle(v[2 * k], v[2 * k + 1], lo8) + __builtin_shuffle(v[2 * k], v[2 * k + 1], lo8 + 8);
  for (int k = 0; k < 4; ++k)
    x[k] = __builtin_shuffle(w[2 * k], w[2 * k + 1], lo4) + __builtin_shuffle(w[2 * k], w[2 * k + 1], lo4 + 4);
  for (int k = 0; k < 2; ++k)
    y[k] = __builtin_shuffle(x[2 * k], x[2 * k + 1], lo2) + __builtin_shuffle(x[2 * k], x[2 * k + 1], lo2 + 2);
  return __builtin_shuffle(y[0], y[1], lo1) + __builtin_shuffle(y[0], y[1], lo1 + 1);
}
#endif

// In place: v[i][j] <- v[j][i] for a 16 x 16 block held in 16 vectors (four butterfly stages).
inline void transpose16(F16* v) {
#ifdef __AVX512F__
  // in-lane unpacks, then 128-bit block shuffles: each one single-cycle instruction (the generic
  // two-source shuffles below compile to ~15x the cycles here)
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = __builtin_bit_cast(__m512, v[i]);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  auto lo64 = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  auto hi64 = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  for (int i = 0; i < 16; i += 4) {
    r[i] = lo64(t[i], t[i + 2]);
    r[i + 1] = hi64(t[i], t[i + 2]);
    r[i + 2] = lo64(t[i + 1], t[i + 3]);
    r[i + 3] = hi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = __builtin_bit_cast(F16, _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88));
    v[i + 8] = __builtin_bit_cast(F16, _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd));
    v[i + 4] = __builtin_bit_cast(F16, _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88));
    v[i + 12] = __builtin_bit_cast(F16, _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd));
  }
#elif defined(BULKRUN_SUM_EACH_AVX2)
  // four 8 x 8 blocks, each transposed in registers (unpacks, in-lane shuffles, 128-bit swaps); the
  // off-diagonal blocks trade places
  __m256 lo[16], hi[16];
  for (int i = 0; i < 16; ++i) {
    const float* f = reinterpret_cast<const float*>(v + i);
    lo[i] = _mm256_loadu_ps(f);
    hi[i] = _mm256_loadu_ps(f + 8);
  }
  auto transpose8 = [](__m256* r) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; ++i) {
      r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
      r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
  };
  transpose8(lo);      // rows 0-7, lanes 0-7
  transpose8(hi);      // rows 0-7, lanes 8-15 -> rows 8-15, lanes 0-7
  transpose8(lo + 8);  // rows 8-15, lanes 0-7 -> rows 0-7, lanes 8-15
  transpose8(hi + 8);
  for (int i = 0; i < 8; ++i) {
    v[i] = join(lo[i], lo[i + 8]);
    v[i + 8] = join(hi[i], hi[i + 8]);
  }
#else
  const I16 lo[4] = {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                     {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                     {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                     {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
  for (int stage = 0, b = 8; stage < 4; ++stage, b /= 2) {
    const I16 hi = lo[stage] + b;
    for (int i = 0; i < 16; ++i) {
      if ((i / b) % 2 != 0) continue;
      const F16 a = v[i], c = v[i + b];
      v[i] = __builtin_shuffle(a, c, lo[stage]);
      v[i + b] = __builtin_shuffle(a, c, hi);
    }
  }
#endif
}

// The largest lane, by a shuffle tree: a max is exact, so any order gives the same value (up to the
// sign of a zero, which no caller can see: a softmax subtracts it, the greedy screen compares with
// it). The lane-by-lane loop compiled to a serial chain of 15 scalar maxes, ~10% of a prompt chunk's
// attention samples (one per row).
inline float lane_max(F16 v) {
  const I16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15};
  const I16 hi4 = {4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7};
  const I16 hi2 = {2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3};
  v = select_max(v, __builtin_shuffle(v, hi8));
  v = select_max(v, __builtin_shuffle(v, hi4));
  v = select_max(v, __builtin_shuffle(v, hi2));
  return v[0] > v[1] ? v[0] : v[1];
}

inline float lane_sum(F16 v) {
  const I16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15};
  const I16 hi4 = {4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7};
  const I16 hi2 = {2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3};
  v += __builtin_shuffle(v, hi8);
  v += __builtin_shuffle(v, hi4);
  v += __builtin_shuffle(v, hi2);
  return v[0] + v[1];
}

}  // namespace bulkrun_cpu
