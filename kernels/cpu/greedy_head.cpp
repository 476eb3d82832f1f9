// The exact greedy token of each row from a bf16 screen of the LM head: torch.ops.bulkrun_cpu.greedy_head.
//
// approx[i, j] = bf16(h_i) . bf16(w_j), accumulated in fp32 and rounded to bf16 (oneDNN). Every entry
// is within  margin_j = c2 |approx| + alpha_i ||w_j|| + beta_i  of the exact logit h_i . w_j, so
//   L_i = max_j (approx - margin)  is a lower bound on the row's best exact logit, and
//   only tokens with approx + margin >= L_i can be its argmax.
// Those few candidates (about 4 of 49152 on real rows) get exact logits (fp32 inputs, products exact
// in double, double sums); the largest wins, ties to the lowest id, as torch.argmax breaks them.
// Two vector passes over the bf16 row (it stays in L2): one for L, one for the candidates.
//
// The bound, with u = 2^-8 (round-to-nearest of h and w to bf16, done by torch) and K = hidden size:
//   inputs:  |bf16(h)bf16(w) - hw| <= (2u + u^2)|hw|, summed: (2u + u^2) ||h|| ||w||  (Cauchy-Schwarz);
//   fp32 sums in any order, even with a faithful (not nearest) add: gamma = K 2^-23 / (1 - K 2^-23)
//            times sum |bf16(h)bf16(w)| <= (1 + u)^2 ||h|| ||w||;
//   double sums of the exact check: K 2^-52 ||h|| ||w||;
//   bf16 output: 2^-7 |approx|, even if the conversion truncates;
//   flushed subnormals (the bf16 dot instructions flush inputs and results): inputs below 2^-126 lose
//            at most 2^-126 (||h||_1 + ||w||_1) <= 2^-126 sqrt(K) (1 + u)(||h|| + ||w||); each of the
//            < 2K + 2 flushed products, sums and outputs less than 2^-126: 1e-30 K covers them;
//   our own fp32 evaluation of approx -+ margin: a few roundings of 2^-24, covered by the extra 2^-21
//            in c2 and by rounding alpha and beta up by 2^-18.
// A row with a non-finite approx or bound, or with more than kMaxChecked candidates (near-equal
// logits everywhere), returns -1: the caller computes it in full.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "head_int8.h"
#include "head_vnni.h"
#include "vec_math.h"

namespace bulkrun_cpu {
namespace {

typedef uint16_t U16x16 __attribute__((vector_size(32), aligned(2)));
typedef float F8Unaligned __attribute__((vector_size(32), aligned(4)));
typedef double D8 __attribute__((vector_size(64)));

constexpr float kInflate = 1.0f + 0x1p-18f;
constexpr float kC2 = 0x1p-7f + 0x1p-21f;  // + 2^-21: our roundings of a -+ margin, 2^-24 (|a| + margin)
constexpr int kMaxChecked = 2048;  // more candidates (near-equal logits): the full fp32 row is cheaper
constexpr int32_t kExponent = 0x7f800000;

// bf16 is the top half of an fp32: widen 16 of them by a shift. (GCC splits the generic widening
// into two halves on Zen 4; the intrinsic is one instruction.)
inline I16 bf16_bits(const uint16_t* p) {
#ifdef __AVX512F__
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return __builtin_bit_cast(I16, wide) << 16;
#else
  return __builtin_convertvector(*reinterpret_cast<const U16x16*>(p), I16) << 16;
#endif
}
inline int32_t bf16_bits(uint16_t b) { return static_cast<int32_t>(static_cast<uint32_t>(b) << 16); }

// Bit l set where lane l of a comparison result is set (one mask instruction with AVX-512).
inline uint32_t lane_bits(I16 mask) {
#ifdef __AVX512F__
  const __m512i m = __builtin_bit_cast(__m512i, mask);
  return _mm512_test_epi32_mask(m, m);
#else
  uint32_t bits = 0;
  for (int l = 0; l < 16; ++l) bits |= static_cast<uint32_t>(mask[l] != 0) << l;
  return bits;
#endif
}

struct RowBound {
  float alpha, beta, gamma = 0.f;  // margin = c2 |approx| + alpha ||w_j|| (+ gamma ||e_j||: int8) + beta
};

// kErr: the int8 screen's bound, with its term in the weight row's quantization error ||e_j||
template <bool kErr, typename T>
inline T margin(T a, T w_norm, T e_norm, RowBound b) {
  if constexpr (kErr) return select_max(a, -a) * kC2 + (w_norm * b.alpha + (e_norm * b.gamma + b.beta));
  return select_max(a, -a) * kC2 + (w_norm * b.alpha + b.beta);
}

// Rounded up to the next float: the bound must never shrink.
inline float float_up(double x) {
  const float f = static_cast<float>(x);
  return static_cast<double>(f) >= x ? f : std::nextafter(f, std::numeric_limits<float>::infinity());
}

// The row's bound terms, or false when they are not finite (the row then goes to the full head).
bool row_bound(const float* h, int64_t k, RowBound& out) {
  double sq = 0.0;
  for (int64_t i = 0; i < k; ++i) sq += static_cast<double>(h[i]) * h[i];
  const double kd = static_cast<double>(k), u = 0x1p-8;
  const double h_norm = std::sqrt(sq) * (1.0 + kd * 0x1p-52);
  const double gamma = kd * 0x1p-23 / (1.0 - kd * 0x1p-23);
  const double c1 = 2.0 * u + u * u + gamma * (1.0 + u) * (1.0 + u) + kd * 0x1p-52;
  const double flush = 0x1p-126 * std::sqrt(kd) * (1.0 + u);
  out.alpha = float_up((c1 * h_norm + flush) * kInflate);
  out.beta = float_up((flush * h_norm + 1e-30 * kd) * kInflate);
  return std::isfinite(out.alpha) && std::isfinite(out.beta);
}

// max_j (approx - margin), or NaN when some approx is inf or NaN. e_norm: the int8 screen's (kErr).
template <bool kErr>
float lower_bound(const uint16_t* a, const float* w_norm, const float* e_norm, int64_t v, RowBound b) {
  F16 best = splat(-std::numeric_limits<float>::infinity());
  I16 bad = {};
  int64_t j = 0;
  for (; j + 16 <= v; j += 16) {
    const I16 bits = bf16_bits(a + j);
    const F16 x = __builtin_bit_cast(F16, bits);
    bad |= (bits & kExponent) == kExponent;
    best = select_max(best, x - margin<kErr>(x, load16(w_norm + j), kErr ? load16(e_norm + j) : F16{}, b));
  }
  float lo = lane_max(best);
  for (; j < v; ++j) {
    const int32_t bits = bf16_bits(a[j]);
    const float x = __builtin_bit_cast(float, bits);
    if ((bits & kExponent) == kExponent) return std::numeric_limits<float>::quiet_NaN();
    lo = select_max(lo, x - margin<kErr>(x, w_norm[j], kErr ? e_norm[j] : 0.f, b));
  }
  return lane_bits(bad) ? std::numeric_limits<float>::quiet_NaN() : lo;
}

// h . w with every product exact in double, summed in a fixed order (equal rows give equal logits).
double exact_logit(const float* h, const float* w, int64_t k) {
  D8 acc = {};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const D8 x = __builtin_convertvector(*reinterpret_cast<const F8Unaligned*>(h + i), D8);
    const D8 y = __builtin_convertvector(*reinterpret_cast<const F8Unaligned*>(w + i), D8);
    acc += x * y;
  }
  double sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  for (; i < k; ++i) sum += static_cast<double>(h[i]) * w[i];
  return sum;
}

struct Best {
  double logit = -std::numeric_limits<double>::infinity();
  int64_t token = -1;
  int checked = 0;
  // Candidates arrive in increasing j: strict > keeps the lowest id. False once there are too many.
  bool offer(double logit_j, int64_t j) {
    if (logit_j > logit || token < 0) logit = logit_j, token = j;
    return ++checked <= kMaxChecked;
  }
};

// The row's exact argmax from its screen a (bf16 [v]) under the bound b, or -1 (see the top).
template <bool kErr>
int64_t screened_row(const uint16_t* a, const float* h, const float* w, int64_t w_stride, const float* w_norm,
                     const float* e_norm, int64_t v, int64_t k, RowBound b) {
  const float lo = lower_bound<kErr>(a, w_norm, e_norm, v, b);
  if (std::isnan(lo)) return -1;
  Best best;
  int64_t j = 0;
  for (; j + 16 <= v; j += 16) {
    const F16 x = __builtin_bit_cast(F16, bf16_bits(a + j));
    const F16 m = margin<kErr>(x, load16(w_norm + j), kErr ? load16(e_norm + j) : F16{}, b);
    for (uint32_t hit = lane_bits(x + m >= lo); hit; hit &= hit - 1) {
      const int64_t t = j + __builtin_ctz(hit);
      if (!best.offer(exact_logit(h, w + t * w_stride, k), t)) return -1;
    }
  }
  for (; j < v; ++j) {
    const float x = __builtin_bit_cast(float, bf16_bits(a[j]));
    if (x + margin<kErr>(x, w_norm[j], kErr ? e_norm[j] : 0.f, b) >= lo &&
        !best.offer(exact_logit(h, w + j * w_stride, k), j))
      return -1;
  }
  return best.token;
}

int64_t row_argmax(const uint16_t* a, const float* h, const float* w, int64_t w_stride, const float* w_norm,
                   int64_t v, int64_t k) {
  RowBound b;
  if (!row_bound(h, k, b)) return -1;
  return screened_row<false>(a, h, w, w_stride, w_norm, nullptr, v, k, b);
}

// approx [N, V] bf16, h [N, K] fp32, weight [V, K] fp32, row_norms [V] fp32 (>= the true norms)
// -> int64 [N]: each row's exact argmax token, or -1 where the caller must compute it in full.
at::Tensor greedy_head(const at::Tensor& approx, const at::Tensor& h, const at::Tensor& weight,
                       const at::Tensor& row_norms) {
  TORCH_CHECK(approx.scalar_type() == at::kBFloat16 && approx.dim() == 2 && approx.stride(1) == 1,
              "approx must be bfloat16 [N, V] with contiguous rows");
  TORCH_CHECK(h.scalar_type() == at::kFloat && h.dim() == 2 && h.stride(1) == 1, "h must be float32 [N, K]");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.stride(1) == 1,
              "weight must be float32 [V, K] with contiguous rows");
  TORCH_CHECK(row_norms.scalar_type() == at::kFloat && row_norms.is_contiguous(), "row_norms must be float32");
  const int64_t n = h.size(0), k = h.size(1), v = weight.size(0);
  TORCH_CHECK(approx.size(0) == n && approx.size(1) == v && weight.size(1) == k && row_norms.numel() == v,
              "greedy_head: mismatched shapes");
  TORCH_CHECK(k > 0 && k < (1 << 20), "greedy_head: hidden size out of range");
  at::Tensor tokens = at::empty({n}, approx.options().dtype(at::kLong));
  const auto* ap = reinterpret_cast<const uint16_t*>(approx.data_ptr<at::BFloat16>());
  const float* hp = h.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* np = row_norms.data_ptr<float>();
  int64_t* out = tokens.data_ptr<int64_t>();
  at::parallel_for(0, n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      out[i] = row_argmax(ap + i * approx.stride(0), hp + i * h.stride(0), wp, weight.stride(0), np, v, k);
  });
  return tokens;
}

// tokens[r] = row r's exact argmax from its int8 screen (approx bf16 [N, V]) under the bound
// bound_of(r, b) sets, or -1 where the row is not finite or its bound is not (the caller computes it).
template <typename BoundOf>
void tokens_from_screen(const uint16_t* approx, const at::Tensor& h, const at::Tensor& weight,
                        const at::Tensor& row_norms, const at::Tensor& err_norms, const uint8_t* finite,
                        at::Tensor& tokens, BoundOf bound_of) {
  const int64_t n = h.size(0), k = h.size(1), v = weight.size(0);
  const float* hp = h.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* wn = row_norms.data_ptr<float>();
  const float* en = err_norms.data_ptr<float>();
  int64_t* out = tokens.data_ptr<int64_t>();
  at::parallel_for(0, n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      RowBound b;
      out[r] = finite[r] && bound_of(r, b)
                   ? screened_row<true>(approx + r * v, hp + r * k, wp, weight.stride(0), wn, en, v, k, b)
                   : -1;
    }
  });
}

// The int8 screen's bound for row h (see head_int8.h), or false when it is not finite. With
// h~ = a q_hi + b q_lo and w~_j = s_j q_j (exactly what the tiles multiply), h.w_j - h~.w~_j =
// (h - h~).w_j + h~.(w_j - w~_j), so |h.w_j - h~.w~_j| <= ||h - h~|| ||w_j|| + ||h~|| ||e_j||; the
// fp32 epilogue (int32 -> fp32, a I_hi + b I_lo, times s_j: four roundings) adds at most
// 2^-21 (||a q_hi|| + ||b q_lo||)(||w_j|| + ||e_j||); bf16 output: c2 |approx|; the exact check's
// double sums: K 2^-52 ||h|| ||w_j||; underflow in the epilogue (an fp32 op loses at most 2^-126
// absolute even where it flushes, the bf16 conversion too): 2^-122 (1 + max s_j). Norms in double,
// rounded up.
bool int8_row_bound(const float* h, int64_t k, SplitRow split, const int8_t* hi, const int8_t* lo,
                    double max_scale, RowBound& out) {
  double hh = 0.0, hi_sq = 0.0, lo_sq = 0.0, approx_sq = 0.0, err_sq = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    const double x = h[i], a = static_cast<double>(split.hi_scale) * hi[i], b = static_cast<double>(split.lo_scale) * lo[i];
    hh += x * x, hi_sq += a * a, lo_sq += b * b;
    approx_sq += (a + b) * (a + b);
    err_sq += (x - a - b) * (x - a - b);
  }
  const double kd = static_cast<double>(k), grow = 1.0 + (kd + 8.0) * 0x1p-50;  // the double sums' roundings
  const double rounding = 0x1p-21 * (std::sqrt(hi_sq) + std::sqrt(lo_sq)) * grow;
  out.alpha = float_up((std::sqrt(err_sq) * grow + rounding + kd * 0x1p-52 * std::sqrt(hh) * grow + 1e-300) * kInflate);
  out.gamma = float_up((std::sqrt(approx_sq) * grow + rounding) * kInflate);
  out.beta = float_up(0x1p-122 * (1.0 + max_scale) * kInflate);
  return std::isfinite(out.alpha) && std::isfinite(out.gamma) && std::isfinite(hh);
}

// Every row j of weight [v, k]: quantized into q, its scale into scales[j] and its error norm,
// rounded up, into err_norms[j]; then place(j, q) packs it. Rows in parallel, 16 at a time.
template <typename Place>
void quantize_head_rows(const float* weight, int64_t v, int64_t k, float* scales, float* err_norms, Place place) {
  at::parallel_for(0, (v + 15) / 16, 16, [&](int64_t b0, int64_t b1) {
    std::vector<int8_t> q(k);
    for (int64_t j = b0 * 16; j < std::min(v, b1 * 16); ++j) {
      err_norms[j] = float_up(quantize_weight_row(weight + j * k, k, q.data(), scales[j]) * (1.0 + 0x1p-40) * kInflate);
      place(j, q.data());
    }
  });
}

// weight fp32 [V, K] -> (packed int8 [NB][KS][16][64] as AMX's B tiles, scales fp32 [V], err_norms fp32 [V]
// >= ||w_j - s_j q_j||): head_int8.h's layout.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_head_int8(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.is_contiguous(),
              "pack_head_int8: weight must be contiguous float32 [V, K]");
  const int64_t v = weight.size(0), k = weight.size(1);
#ifdef BULKRUN_HEAD_INT8
  const int64_t nb = (v + kInt8Cols - 1) / kInt8Cols, ks = (k + kInt8Step - 1) / kInt8Step;
  at::Tensor packed = at::zeros({nb, ks, 16, 64}, weight.options().dtype(at::kChar));
  at::Tensor scales = at::empty({v}, weight.options());
  at::Tensor err = at::empty({v}, weight.options());
  int8_t* pp = packed.data_ptr<int8_t>();
  quantize_head_rows(weight.data_ptr<float>(), v, k, scales.data_ptr<float>(), err.data_ptr<float>(),
                     [&](int64_t j, const int8_t* q) {
                       const int64_t b = j / kInt8Cols, n = j % kInt8Cols;
                       for (int64_t i = 0; i < k; ++i)  // step i / 64, tile row (i % 64) / 4, byte 4 n + i % 4
                         pp[((b * ks + i / kInt8Step) * 16 + (i % kInt8Step) / 4) * 64 + 4 * n + i % 4] = q[i];
                     });
  return {packed, scales, err};
#else
  TORCH_CHECK(false, "pack_head_int8: built without AMX int8");
#endif
}

// The exact greedy tokens from the int8 screen: h fp32 [N, K]; packed, scales, err_norms from
// pack_head_int8 and max_scale the largest of the scales; weight fp32 [V, K]; row_norms [V] (>= the
// true norms). -1 where the caller must compute the row in full (as greedy_head).
at::Tensor greedy_head_int8(const at::Tensor& h, const at::Tensor& packed, const at::Tensor& scales,
                            const at::Tensor& err_norms, double max_scale, const at::Tensor& weight,
                            const at::Tensor& row_norms) {
  TORCH_CHECK(h.scalar_type() == at::kFloat && h.dim() == 2 && h.is_contiguous(), "h must be contiguous float32 [N, K]");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.stride(1) == 1,
              "weight must be float32 [V, K] with contiguous rows");
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.dim() == 4 && packed.is_contiguous() && packed.size(2) == 16 &&
                  packed.size(3) == 64, "packed must be pack_head_int8's");
  const int64_t n = h.size(0), k = h.size(1), v = weight.size(0), kp = packed.size(1) * kInt8Step;
  TORCH_CHECK(weight.size(1) == k && kp >= k && kp < k + kInt8Step && packed.size(0) == (v + 15) / 16,
              "greedy_head_int8: mismatched shapes");
  for (const at::Tensor* t : {&scales, &err_norms, &row_norms})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == v, "per-token vectors must be float32 [V]");
  at::Tensor tokens = at::empty({n}, h.options().dtype(at::kLong));
#ifdef BULKRUN_HEAD_INT8
  TORCH_CHECK(amx_ready(), "greedy_head_int8: AMX is off here");
  if (n == 0) return tokens;
  const float* hp = h.data_ptr<float>();
  const int64_t blocks = (n + 15) / 16;
  std::vector<int8_t> rows(blocks * 2 * 16 * kp, 0);  // [block][hi, lo][16][kp]
  std::vector<SplitRow> split(n);
  std::vector<uint8_t> finite(n);
  at::parallel_for(0, n, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = hp + r * k;
      bool ok = true;
      for (int64_t i = 0; i < k; ++i) ok &= std::isfinite(x[i]);
      finite[r] = ok;
      int8_t* hi = rows.data() + ((r / 16) * 32 + r % 16) * kp;
      if (ok) split[r] = split_row(x, k, kp, hi, hi + 16 * kp);
    }
  });
  const float* sp = scales.data_ptr<float>();
  at::Tensor approx = at::empty({n, v}, h.options().dtype(at::kBFloat16));
  auto* ap = reinterpret_cast<uint16_t*>(approx.data_ptr<at::BFloat16>());
  int8_screen(rows.data(), split.data(), n, kp, packed.data_ptr<int8_t>(), sp, v, ap, v);
  tokens_from_screen(ap, h, weight, row_norms, err_norms, finite.data(), tokens, [&](int64_t r, RowBound& b) {
    const int8_t* hi = rows.data() + ((r / 16) * 32 + r % 16) * kp;
    return int8_row_bound(hp + r * k, k, split[r], hi, hi + 16 * kp, max_scale, b);
  });
  return tokens;
#else
  TORCH_CHECK(false, "greedy_head_int8: built without AMX int8");
#endif
}

// The VNNI screen's bound for row h (see head_vnni.h), or false when it is not finite. With h~ = a q
// (zero at the outlier dimensions O) + h at O, and the int8 part multiplying s_j q_j, h.w_j - the
// screen's exact value = sum over i not in O of (h_i - a q_i) w_j[i] + a q_i (w_j[i] - s_j q_j[i]), so
// at most ||h - a q|| ||w_j|| + ||a q|| ||e_j||. Its fp32 evaluation (int32 -> fp32, times s_j, times
// a, then n_out FMAs, each a rounding of at most 2^-24 of the running sum, itself at most
// ||a q|| (||w_j|| + ||e_j||) + ||h_O|| ||w_j||) adds (n_out + 4) 2^-24 of that; bf16 output: c2
// |approx|; the exact check's double sums: K 2^-52 ||h|| ||w_j||; underflow (each fp32 op loses at
// most 2^-126 absolute, flushed inputs at most 2^-126 times the other factor): n_out 2^-126 ||w_j||
// and (n_out + 8) 2^-122 (1 + max s_j + ||h_O||). Norms in double, rounded up.
bool vnni_row_bound(const float* h, int64_t k, float a, const int8_t* q, const uint8_t* is_out, int64_t n_out,
                    double max_scale, RowBound& out) {
  double hh = 0.0, aq_sq = 0.0, err_sq = 0.0, out_sq = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    const double x = h[i], y = static_cast<double>(a) * q[i];
    hh += x * x;
    if (is_out[i]) {
      out_sq += x * x;
    } else {
      aq_sq += y * y;
      err_sq += (x - y) * (x - y);
    }
  }
  const double kd = static_cast<double>(k), grow = 1.0 + (kd + 8.0) * 0x1p-50;  // the double sums' roundings
  const double c = (static_cast<double>(n_out) + 4.0) * 0x1p-24;
  const double aq = std::sqrt(aq_sq) * grow, h_out = std::sqrt(out_sq) * grow;
  out.alpha = float_up((std::sqrt(err_sq) * grow + c * (aq + h_out) + kd * 0x1p-52 * std::sqrt(hh) * grow +
                        static_cast<double>(n_out) * 0x1p-126 + 1e-300) * kInflate);
  out.gamma = float_up(aq * (1.0 + c) * kInflate);
  out.beta = float_up((static_cast<double>(n_out) + 8.0) * 0x1p-122 * (1.0 + max_scale + h_out) * kInflate);
  return std::isfinite(out.alpha) && std::isfinite(out.gamma) && std::isfinite(out.beta) && std::isfinite(hh);
}

// weight fp32 [V, K] -> (packed int8 [NB][KQ][16][4], scales fp32 [V], err_norms fp32 [V] >= ||w_j - s_j
// q_j||, rowsums int32 [V]): head_vnni.h's layout.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pack_head_vnni(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.is_contiguous(),
              "pack_head_vnni: weight must be contiguous float32 [V, K]");
  const int64_t v = weight.size(0), k = weight.size(1), nb = (v + 15) / 16, kq = (k + 3) / 4;
  at::Tensor packed = at::zeros({nb, kq, 16, 4}, weight.options().dtype(at::kChar));
  at::Tensor scales = at::zeros({v}, weight.options());
  at::Tensor err = at::zeros({v}, weight.options());
  at::Tensor rowsums = at::zeros({v}, weight.options().dtype(at::kInt));
  int8_t* pp = packed.data_ptr<int8_t>();
  int32_t* rp = rowsums.data_ptr<int32_t>();
  quantize_head_rows(weight.data_ptr<float>(), v, k, scales.data_ptr<float>(), err.data_ptr<float>(),
                     [&](int64_t j, const int8_t* q) {
                       const int64_t b = j / 16, n = j % 16;
                       int32_t sum = 0;
                       for (int64_t i = 0; i < k; ++i) {  // quad i / 4, lane n, byte i % 4
                         pp[((b * kq + i / 4) * 16 + n) * 4 + i % 4] = q[i];
                         sum += q[i];
                       }
                       rp[j] = sum;
                     });
  return {packed, scales, err, rowsums};
}

// The exact greedy tokens from the VNNI screen: h fp32 [N, K]; packed, scales, err_norms, rowsums from
// pack_head_vnni and max_scale the largest scale; outlier_dims int64 [n_out] (distinct, < K) and
// w_out fp32 [NB][n_out][16] the weights there; weight fp32 [V, K]; row_norms [V] (>= the true
// norms). -1 where the caller must compute the row in full (as greedy_head).
at::Tensor greedy_head_vnni(const at::Tensor& h, const at::Tensor& packed, const at::Tensor& scales,
                            const at::Tensor& err_norms, const at::Tensor& rowsums, double max_scale,
                            const at::Tensor& outlier_dims, const at::Tensor& w_out, const at::Tensor& weight,
                            const at::Tensor& row_norms) {
  TORCH_CHECK(h.scalar_type() == at::kFloat && h.dim() == 2 && h.is_contiguous(), "h must be contiguous float32 [N, K]");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.stride(1) == 1,
              "weight must be float32 [V, K] with contiguous rows");
  const int64_t n = h.size(0), k = h.size(1), v = weight.size(0), nb = (v + 15) / 16, kq = (k + 3) / 4;
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.is_contiguous() && packed.dim() == 4 && packed.size(0) == nb &&
                  packed.size(1) == kq && packed.size(2) == 16 && packed.size(3) == 4 && weight.size(1) == k,
              "packed must be pack_head_vnni's of this weight");
  for (const at::Tensor* t : {&scales, &err_norms, &row_norms})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == v, "per-token vectors must be float32 [V]");
  TORCH_CHECK(rowsums.scalar_type() == at::kInt && rowsums.is_contiguous() && rowsums.numel() == v, "rowsums must be int32 [V]");
  TORCH_CHECK(outlier_dims.scalar_type() == at::kLong && outlier_dims.dim() == 1 && outlier_dims.is_contiguous(),
              "outlier_dims must be int64 [n_out]");
  const int64_t n_out = outlier_dims.numel();
  const int64_t* dims = outlier_dims.data_ptr<int64_t>();
  std::vector<uint8_t> is_out(k, 0);
  for (int64_t o = 0; o < n_out; ++o) {
    TORCH_CHECK(dims[o] >= 0 && dims[o] < k && !is_out[dims[o]], "outlier_dims must be distinct dimensions of h");
    is_out[dims[o]] = 1;
  }
  TORCH_CHECK(w_out.scalar_type() == at::kFloat && w_out.is_contiguous() && w_out.dim() == 3 && w_out.size(0) == nb &&
                  w_out.size(1) == n_out && w_out.size(2) == 16,
              "w_out must be float32 [NB, n_out, 16]");
  at::Tensor tokens = at::empty({n}, h.options().dtype(at::kLong));
#ifdef BULKRUN_HEAD_VNNI
  if (n == 0) return tokens;
  const float* hp = h.data_ptr<float>();
  std::vector<uint8_t> u(n * kq * 4, 128);
  std::vector<int8_t> q(n * k, 0);
  std::vector<float> a(n, 0.f), h_out(std::max<int64_t>(1, n * n_out), 0.f);
  std::vector<uint8_t> finite(n);
  at::parallel_for(0, n, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = hp + r * k;
      bool ok = true;
      for (int64_t i = 0; i < k; ++i) ok &= std::isfinite(x[i]);
      finite[r] = ok;
      if (!ok) continue;
      int8_t* qr = q.data() + r * k;
      a[r] = quantize_row(x, k, qr, is_out.data());
      uint8_t* ur = u.data() + r * kq * 4;
      for (int64_t i = 0; i < k; ++i) ur[i] = static_cast<uint8_t>(qr[i] + 128);
      for (int64_t o = 0; o < n_out; ++o) h_out[r * n_out + o] = x[dims[o]];
    }
  });
  at::Tensor approx = at::empty({n, v}, h.options().dtype(at::kBFloat16));
  auto* ap = reinterpret_cast<uint16_t*>(approx.data_ptr<at::BFloat16>());
  const VnniRows rows{u.data(), a.data(), h_out.data(), kq, n_out};
  const VnniWeights w{packed.data_ptr<int8_t>(), scales.data_ptr<float>(), rowsums.data_ptr<int32_t>(),
                      w_out.data_ptr<float>(), v};
  vnni_screen(rows, w, n, ap, v);
  tokens_from_screen(ap, h, weight, row_norms, err_norms, finite.data(), tokens, [&](int64_t r, RowBound& b) {
    return vnni_row_bound(hp + r * k, k, a[r], q.data() + r * k, is_out.data(), n_out, max_scale, b);
  });
  return tokens;
#else
  TORCH_CHECK(false, "greedy_head_vnni: built without AVX512-VNNI");
#endif
}

bool greedy_head_vnni_available() {
#ifdef BULKRUN_HEAD_VNNI
  return true;
#else
  return false;
#endif
}

bool greedy_head_int8_available() {
#ifdef BULKRUN_HEAD_INT8
  return amx_ready();
#else
  return false;
#endif
}

}  // namespace
}  // namespace bulkrun_cpu

TORCH_LIBRARY_FRAGMENT(bulkrun_cpu, m) {
  m.def("greedy_head(Tensor approx, Tensor h, Tensor weight, Tensor row_norms) -> Tensor");
  m.def("pack_head_int8(Tensor weight) -> (Tensor, Tensor, Tensor)");
  m.def("greedy_head_int8(Tensor h, Tensor packed, Tensor scales, Tensor err_norms, float max_scale, "
        "Tensor weight, Tensor row_norms) -> Tensor");
  m.def("greedy_head_int8_available() -> bool", &bulkrun_cpu::greedy_head_int8_available);
  m.def("pack_head_vnni(Tensor weight) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("greedy_head_vnni(Tensor h, Tensor packed, Tensor scales, Tensor err_norms, Tensor rowsums, "
        "float max_scale, Tensor outlier_dims, Tensor w_out, Tensor weight, Tensor row_norms) -> Tensor");
  m.def("greedy_head_vnni_available() -> bool", &bulkrun_cpu::greedy_head_vnni_available);
}

TORCH_LIBRARY_IMPL(bulkrun_cpu, CPU, m) {
  m.impl("greedy_head", &bulkrun_cpu::greedy_head);
  m.impl("pack_head_int8", &bulkrun_cpu::pack_head_int8);
  m.impl("greedy_head_int8", &bulkrun_cpu::greedy_head_int8);
  m.impl("pack_head_vnni", &bulkrun_cpu::pack_head_vnni);
  m.impl("greedy_head_vnni", &bulkrun_cpu::greedy_head_vnni);
}
