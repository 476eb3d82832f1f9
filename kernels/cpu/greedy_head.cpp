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
#include <torch/library.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include <cmath>
#include <limits>

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
  float alpha, beta;  // margin = c2 |approx| + alpha ||w_j|| + beta
};

template <typename T>
inline T margin(T a, T w_norm, RowBound b) {
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

// max_j (approx - margin), or NaN when some approx is inf or NaN.
float lower_bound(const uint16_t* a, const float* w_norm, int64_t v, RowBound b) {
  F16 best = splat(-std::numeric_limits<float>::infinity());
  I16 bad = {};
  int64_t j = 0;
  for (; j + 16 <= v; j += 16) {
    const I16 bits = bf16_bits(a + j);
    const F16 x = __builtin_bit_cast(F16, bits);
    bad |= (bits & kExponent) == kExponent;
    best = select_max(best, x - margin(x, load16(w_norm + j), b));
  }
  float lo = lane_max(best);
  for (; j < v; ++j) {
    const int32_t bits = bf16_bits(a[j]);
    const float x = __builtin_bit_cast(float, bits);
    if ((bits & kExponent) == kExponent) return std::numeric_limits<float>::quiet_NaN();
    lo = select_max(lo, x - margin(x, w_norm[j], b));
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

int64_t row_argmax(const uint16_t* a, const float* h, const float* w, int64_t w_stride, const float* w_norm,
                   int64_t v, int64_t k) {
  RowBound b;
  if (!row_bound(h, k, b)) return -1;
  const float lo = lower_bound(a, w_norm, v, b);
  if (std::isnan(lo)) return -1;
  Best best;
  int64_t j = 0;
  for (; j + 16 <= v; j += 16) {
    const F16 x = __builtin_bit_cast(F16, bf16_bits(a + j));
    for (uint32_t hit = lane_bits(x + margin(x, load16(w_norm + j), b) >= lo); hit; hit &= hit - 1) {
      const int64_t t = j + __builtin_ctz(hit);
      if (!best.offer(exact_logit(h, w + t * w_stride, k), t)) return -1;
    }
  }
  for (; j < v; ++j) {
    const float x = __builtin_bit_cast(float, bf16_bits(a[j]));
    if (x + margin(x, w_norm[j], b) >= lo && !best.offer(exact_logit(h, w + j * w_stride, k), j)) return -1;
  }
  return best.token;
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

}  // namespace
}  // namespace bulkrun_cpu

TORCH_LIBRARY_FRAGMENT(bulkrun_cpu, m) {
  m.def("greedy_head(Tensor approx, Tensor h, Tensor weight, Tensor row_norms) -> Tensor");
}

TORCH_LIBRARY_IMPL(bulkrun_cpu, CPU, m) { m.impl("greedy_head", &bulkrun_cpu::greedy_head); }
