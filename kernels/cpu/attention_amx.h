// Prompt-chunk attention on AMX tiles (bf16 in, fp32 accumulation), for paged_attention.cpp.
//
// Why: a prompt chunk's attention is two matmuls per kv head (scores = Q K^T, out = P V), and with
// AVX-512 FMAs in fp32 they take a large share of a bf16 step next to linears that run on AMX
// (docs/benchmarks.md, design figures). AMX multiplies 16x32 by 32x16 bf16 tiles into fp32 in
// one instruction. What stays as run_item does it: fp32 scores, the causal mask, one max / exp /
// sum per row in fp32 (softmax_row). What changes: the probabilities are rounded to bf16 for the
// P V product (as FlashAttention does on GPUs; 2^-9 relative per probability), and the row sums
// that normalize the output are the fp32 ones.
//
// Layouts (AMX's B operand wants K-dimension pairs interleaved, "VNNI"):
//   q rows  [padded rows][D] bf16, rows (token, q head of the group), zero rows pad to 16
//   keys^T  per 16-key group and 32-dim step: 16 rows (dim pairs) x 16 keys x 2 bf16
//   values  per 32-key chunk and 16-dim block: 16 rows (key pairs) x 16 dims x 2 bf16
//   scores  [padded rows][key groups x 16] fp32 (softmax in place)
//   probs   [padded rows][key chunks x 32] bf16
// Keys and values past the sequence's last key are zeros, never the cache's unused slots.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#define BULKRUN_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace bulkrun_cpu {
namespace {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl: ask the kernel for a state component
constexpr int kXfeatureXtiledata = 18;     // ... the AMX tile data

// Whether this process may run AMX: Linux hands out the 8 KB tile state only on request (oneDNN
// asks too; asking twice is fine). BULKRUN_CPU_AMX=0 turns the AMX path off (A/B measurements).
inline bool amx_ready() {
  static const bool ready = [] {
    const char* env = std::getenv("BULKRUN_CPU_AMX");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ready;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// All eight tiles 16 rows x 64 bytes: C = 16 x 16 fp32, A = 16 x 32 bf16, B = 16 pairs x 16 x 2 bf16.
inline void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// lane n = a[n] | b[n] << 16: the pair (a[n], b[n]) of two rows' 16 bf16 each, side by side in memory
inline __m512i interleave_rows(const bf16* a, const bf16* b) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

// C_j = sum_i A_i B_ij for j < n <= 4 (tiles 0-3: C, 4: A, 5-7: B): A_i is 16 rows x 32 bf16 at
// a + 32 i (rows a_stride bytes apart), B_ij the pair-interleaved tile at b + i b_step + j b_next,
// and C_j (16 x 16 fp32) goes to c + 16 j (rows c_stride bytes apart). One A load serves n products.
inline void tile_products(int64_t n, int64_t steps, const bf16* a, int64_t a_stride, const bf16* b, int64_t b_step,
                          int64_t b_next, float* c, int64_t c_stride) {
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t i = 0; i < steps; ++i) {
    const bf16* bi = b + i * b_step;
    _tile_loadd(4, a + 32 * i, a_stride);
    _tile_loadd(5, bi, 64);
    _tile_dpbf16ps(0, 4, 5);
    if (n > 1) { _tile_loadd(6, bi + b_next, 64); _tile_dpbf16ps(1, 4, 6); }
    if (n > 2) { _tile_loadd(7, bi + 2 * b_next, 64); _tile_dpbf16ps(2, 4, 7); }
    if (n > 3) { _tile_loadd(5, bi + 3 * b_next, 64); _tile_dpbf16ps(3, 4, 5); }
  }
  _tile_stored(0, c, c_stride);
  if (n > 1) _tile_stored(1, c + 16, c_stride);
  if (n > 2) _tile_stored(2, c + 32, c_stride);
  if (n > 3) _tile_stored(3, c + 48, c_stride);
}

// 2^n e^f-style exp for the softmax below: e^x = 2^(x log2 e), the fraction by a degree-5 polynomial
// (relative error < 3e-6; the probabilities are rounded to bf16, 2^-9, right after) and the power
// of two by one scalef. x <= 0 here; below -87 the caller selects an exact 0.
inline __m512 exp_fast(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.69314718f));  // |f| <= ln2 / 2
  __m512 p = _mm512_set1_ps(1.f / 120);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// One row's raw scores (key groups 0 .. last_key / 16) -> bf16 probabilities p16 (zeros up to
// padded_keys); returns their fp32 sum. Only the last group holds keys past the row's own (masked):
// max, then exp and sum and the bf16 rounding in one pass.
inline float softmax_row_bf16(const F16* scores, int64_t last_key, float scale, bf16* p16, int64_t padded_keys) {
  const int64_t seen = last_key / kKeys + 1;
  const __mmask16 visible = static_cast<__mmask16>((2u << (last_key % kKeys)) - 1);  // lanes 0 .. last_key % 16
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  auto group = [&](int64_t kg) {
    const __m512 v = __builtin_bit_cast(__m512, scores[kg]);
    return kg + 1 < seen ? v : _mm512_mask_blend_ps(visible, minus_inf, v);
  };
  __m512 m = group(0);
  for (int64_t kg = 1; kg < seen; ++kg) m = _mm512_max_ps(m, group(kg));
  const __m512 shift = _mm512_set1_ps(-_mm512_reduce_max_ps(m) * scale), s = _mm512_set1_ps(scale);
  const __m512 floor = _mm512_set1_ps(-87.f);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t kg = 0; kg < seen; ++kg) {
    const __m512 x = _mm512_fmadd_ps(group(kg), s, shift);  // -inf where masked
    const __m512 p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, floor, _CMP_GT_OQ), exp_fast(x));
    sum = _mm512_add_ps(sum, p);
    store16(p16 + kg * kKeys, __builtin_bit_cast(F16, p));
  }
  std::memset(p16 + seen * kKeys, 0, (padded_keys - seen * kKeys) * sizeof(bf16));
  return _mm512_reduce_add_ps(sum);
}

template <int NV>
void run_item_amx(const WorkItem& w, const Geometry& g, const bf16* q, const bf16* k_cache, const bf16* v_cache,
                  const int32_t* table, int64_t token0, int64_t new_tokens, int64_t context, bf16* out) {
  static_assert(NV % 2 == 0, "a tile row holds 32 dims: head_dim must be a multiple of 32");
  constexpr int64_t D = NV * 16, kSteps = NV / 2;  // 32-dim steps of the score product
  const int64_t tile = w.q_end - w.q_begin, group = g.group, rows = tile * group;
  const int64_t blocks = (rows + 15) / 16, padded_rows = blocks * 16;
  const int64_t key_stride = g.num_kv_heads * D;
  const int64_t first_pos = context - new_tokens;
  const int64_t num_keys = first_pos + w.q_end;
  const int64_t key_groups = (num_keys + kKeys - 1) / kKeys;
  const int64_t chunks = (num_keys + 31) / 32, padded_keys = chunks * 32;
  auto last_key = [&](int64_t r) { return first_pos + w.q_begin + r / group; };  // the last key row r sees

  thread_local std::vector<bf16> q_rows, keys_t, values, probs16;
  thread_local std::vector<F16> scores;
  thread_local std::vector<float> row_sum, block_out;
  q_rows.assign(padded_rows * D, 0);
  keys_t.resize(key_groups * kSteps * 512);
  values.resize(chunks * NV * 512);
  probs16.resize(padded_rows * padded_keys);
  scores.resize(padded_rows * key_groups);
  row_sum.resize(rows);
  block_out.resize(16 * D);
  const int64_t* offsets = key_row_offsets(table, g.block_size, num_keys, key_stride);
  configure_tiles();

  for (int64_t kvh = 0; kvh < g.num_kv_heads; ++kvh) {
    for (int64_t r = 0; r < rows; ++r) {
      const bf16* src = q + (token0 + w.q_begin + r / group) * g.q_stride_token + (kvh * group + r % group) * g.q_stride_head;
      std::memcpy(q_rows.data() + r * D, src, D * sizeof(bf16));
    }
    // keys^T: per group of 16 keys and 32-dim step, a 16 x 16 transpose of 32-bit dim pairs
    for (int64_t kg = 0; kg < key_groups; ++kg) {
      const int64_t key0 = kg * kKeys, n = std::min(kKeys, num_keys - key0);
      for (int64_t s = 0; s < kSteps; ++s) {
        F16 block[16];
        for (int64_t j = 0; j < 16; ++j)
          block[j] = j < n ? load16(reinterpret_cast<const float*>(k_cache + offsets[key0 + j] + kvh * D + 32 * s))
                           : F16{};
        transpose16(block);
        std::memcpy(keys_t.data() + (kg * kSteps + s) * 512, block, sizeof(block));
      }
    }
    // values: per chunk of 32 keys and 16-dim block, key pairs interleaved
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t p = 0; p < 16; ++p) {
        const int64_t a = c * 32 + 2 * p, b = a + 1;
        for (int64_t nb = 0; nb < NV; ++nb) {
          __m512i pair = _mm512_setzero_si512();
          if (b < num_keys)
            pair = interleave_rows(v_cache + offsets[a] + kvh * D + 16 * nb, v_cache + offsets[b] + kvh * D + 16 * nb);
          else if (a < num_keys)
            pair = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v_cache + offsets[a] + kvh * D + 16 * nb)));
          _mm512_storeu_si512(values.data() + ((c * NV + nb) * 16 + p) * 32, pair);
        }
      }

    // scores = Q K^T, four key groups per pass over a row block's queries
    for (int64_t rb = 0; rb < blocks; ++rb) {
      const int64_t groups = last_key(std::min(rows, rb * 16 + 16) - 1) / kKeys + 1;
      const bf16* a_base = q_rows.data() + rb * 16 * D;
      float* c_base = reinterpret_cast<float*>(scores.data() + rb * 16 * key_groups);
      for (int64_t kg = 0; kg < groups; kg += 4)
        tile_products(std::min<int64_t>(4, groups - kg), kSteps, a_base, D * 2, keys_t.data() + kg * kSteps * 512, 512,
                      kSteps * 512, c_base + kg * 16, key_groups * 64);
    }
    // scale, causal mask, softmax in fp32; the probabilities to bf16 for the value product
    for (int64_t r = 0; r < padded_rows; ++r) {
      bf16* p16 = probs16.data() + r * padded_keys;
      if (r >= rows) {
        std::memset(p16, 0, padded_keys * sizeof(bf16));
        continue;
      }
      row_sum[r] = softmax_row_bf16(scores.data() + r * key_groups, last_key(r), g.scale, p16, padded_keys);
    }
    // out = P V / row sums, up to four 16-dim blocks per pass over the row block's probabilities
    for (int64_t rb = 0; rb < blocks; ++rb) {
      const int64_t r_end = std::min(rows, rb * 16 + 16);
      const int64_t used_chunks = last_key(r_end - 1) / 32 + 1;
      const bf16* a_base = probs16.data() + rb * 16 * padded_keys;
      for (int64_t nb0 = 0; nb0 < NV; nb0 += 4)
        tile_products(std::min<int64_t>(4, NV - nb0), used_chunks, a_base, padded_keys * 2, values.data() + nb0 * 512,
                      NV * 512, 512, block_out.data() + nb0 * 16, D * 4);
      for (int64_t r = rb * 16; r < r_end; ++r) {
        const int64_t token = w.q_begin + r / group, h = kvh * group + r % group;
        bf16* dst = out + (token0 + token) * g.out_stride_token + h * g.out_stride_head;
        const float inv = 1.f / row_sum[r];
        for (int64_t c = 0; c < NV; ++c) store16(dst + 16 * c, load16(block_out.data() + (r - rb * 16) * D + 16 * c) * inv);
      }
    }
  }
  _tile_release();
}

}  // namespace
}  // namespace bulkrun_cpu
#endif
