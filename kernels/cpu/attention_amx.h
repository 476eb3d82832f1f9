// bf16 attention on AMX tiles, for paged_attention.cpp: every bf16 item (decode rows and prompt
// chunks alike, every extra: window, soft-cap, sinks) where the CPU has AMX and head_dim is a
// multiple of 32.
//
// Why: AMX multiplies 16x32 by 32x16 bf16 tiles into fp32 in one instruction, ~8x the AVX512-BF16
// dot products of this class of CPU, so a prompt chunk's two matmuls per kv head (scores, then the
// probability-weighted values) stop costing more than the linears beside them. Why one path for
// every item: an AMX product's C[m][n] is a function of A's row m and B's column n alone, so a
// query row computes the same bits in a 64-token chunk as alone in a decode step (batch
// invariance, docs/batch-invariance.md).
//
// Per item and kv head, with the query rows (token, q head of the group) in blocks of 16:
//   scores    C^T = K Q^T on tiles: A = 16 keys straight from the cache where a 16-key group is slots
//             of one block (block_size a multiple of 16; else copied), B = a block's queries, dim
//             pairs interleaved (built once per item); each 16 x 16 C^T is transposed into the rows'
//             scores
//   softmax   run_item's, row by row in fp32: scale, soft-cap, mask (causal, window), max with the
//             sink, exp, sum (softmax_row)
//   P V       A = the probabilities as hi + lo bf16 halves (p = hi + lo to ~2^-17: the value sums
//             stay as close to fp32's as the fp32-FMA paths), B = the values, key pairs interleaved;
//             each 32-key chunk adds hi then lo, chunks in order, then / the fp32 row sum
// A row's keys outside its own range (causal, window, past the sequence) have probability exactly 0,
// so the extra chunks a row block walks for its other rows add exact zeros.
#pragma once

#include "amx_tiles.h"

#if defined(BULKRUN_AMX_TILES) && defined(BULKRUN_DPBF16_ATTENTION)
#define BULKRUN_AMX 1

namespace bulkrun_cpu {
namespace {

// C_j (j < n <= 4) = sum over `steps` of A_s B_sj; A_s: 16 rows of 32 bf16 at a + 32 s (rows a_stride
// bytes apart), B_sj at b + s * b_step + j * b_next; C_j to c + 16 j, rows c_stride bytes apart.
// Tiles 0-3: C, 4: A, 5-7: B. One A load serves n products.
inline void tile_products(int64_t n, int64_t steps, const bf16* a, int64_t a_stride, const bf16* b, int64_t b_step,
                          int64_t b_next, float* c, int64_t c_stride) {
  _tile_zero(0);
  if (n > 1) _tile_zero(1);
  if (n > 2) _tile_zero(2);
  if (n > 3) _tile_zero(3);
  for (int64_t s = 0; s < steps; ++s) {
    const bf16* bs = b + s * b_step;
    _tile_loadd(4, a + 32 * s, a_stride);
    _tile_loadd(5, bs, 64);
    _tile_dpbf16ps(0, 4, 5);
    if (n > 1) { _tile_loadd(6, bs + b_next, 64); _tile_dpbf16ps(1, 4, 6); }
    if (n > 2) { _tile_loadd(7, bs + 2 * b_next, 64); _tile_dpbf16ps(2, 4, 7); }
    if (n > 3) { _tile_loadd(5, bs + 3 * b_next, 64); _tile_dpbf16ps(3, 4, 5); }
  }
  _tile_stored(0, c, c_stride);
  if (n > 1) _tile_stored(1, c + 16, c_stride);
  if (n > 2) _tile_stored(2, c + 32, c_stride);
  if (n > 3) _tile_stored(3, c + 48, c_stride);
}

// C_j (j < n <= 4) = sum over chunks k of (Ahi_k + Alo_k) B_kj, hi then lo per chunk, chunks in
// order; Ahi_k: 16 rows of 32 bf16 at a_hi + 32 k (rows a_stride bytes apart), Alo_k likewise, B_kj
// at b + k * b_step + j * 512; C_j to c + 16 j, rows c_stride bytes apart. Tiles 0-3: C, 4-5: A, 6-7: B.
inline void weigh_tiles(int64_t n, int64_t chunks, const bf16* a_hi, const bf16* a_lo, int64_t a_stride,
                        const bf16* b, int64_t b_step, float* c, int64_t c_stride) {
  _tile_zero(0);
  if (n > 1) _tile_zero(1);
  if (n > 2) _tile_zero(2);
  if (n > 3) _tile_zero(3);
  for (int64_t k = 0; k < chunks; ++k) {
    const bf16* bk = b + k * b_step;
    _tile_loadd(4, a_hi + 32 * k, a_stride);
    _tile_loadd(5, a_lo + 32 * k, a_stride);
    _tile_loadd(6, bk, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(0, 5, 6);
    if (n > 1) { _tile_loadd(7, bk + 512, 64); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(1, 5, 7); }
    if (n > 2) { _tile_loadd(6, bk + 1024, 64); _tile_dpbf16ps(2, 4, 6); _tile_dpbf16ps(2, 5, 6); }
    if (n > 3) { _tile_loadd(7, bk + 1536, 64); _tile_dpbf16ps(3, 4, 7); _tile_dpbf16ps(3, 5, 7); }
  }
  _tile_stored(0, c, c_stride);
  if (n > 1) _tile_stored(1, c + 16, c_stride);
  if (n > 2) _tile_stored(2, c + 32, c_stride);
  if (n > 3) _tile_stored(3, c + 48, c_stride);
}

// Keys key0 .. key0+7 (pairs of one 16-key group) of one kv head's values -> rows 8 half .. of the
// chunk's B tiles, two per 32 dims: row i = (v[2i][d], v[2i+1][d]) for 16 dims d. The pairs come from
// unpacking within 128-bit lanes (one instruction each, where a cross-lane permute costs three), so
// of 32 dims the even tile holds dims 0-3, 8-11, 16-19, 24-27 and the odd one the other 16: a tile
// product's column n depends on B's column n alone, so this only moves the output's dims, which
// unpermute_dims puts back. Keys at or past num_keys are zeros (the cache's unused slots may hold
// anything).
template <int NV>
inline void interleave_values(const bf16* v_cache, const int64_t* offsets, int64_t head, int64_t key0, int64_t half,
                              int64_t num_keys, bf16* tiles, const char* pf_k = nullptr, const char* pf_v = nullptr,
                              int64_t pf_lines = 0) {
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t l = i * pf_lines / 8; l < (i + 1) * pf_lines / 8; ++l) {
      prefetch_l2(pf_k + 64 * l);
      prefetch_l2(pf_v + 64 * l);
    }
    const int64_t a = key0 + 2 * i, b = a + 1;
    bf16* row = tiles + (8 * half + i) * 32;
    for (int64_t c = 0; c < NV; c += 2) {  // 32 dims: two 16-dim blocks
      const __m512i va = a < num_keys ? _mm512_loadu_si512(v_cache + offsets[a] + head + 16 * c) : _mm512_setzero_si512();
      const __m512i vb = b < num_keys ? _mm512_loadu_si512(v_cache + offsets[b] + head + 16 * c) : _mm512_setzero_si512();
      _mm512_storeu_si512(row + c * 512, _mm512_unpacklo_epi16(va, vb));
      _mm512_storeu_si512(row + (c + 1) * 512, _mm512_unpackhi_epi16(va, vb));
    }
  }
}

// The outputs of an even and an odd value tile (interleave_values' dim order) -> dims 0-15, 16-31.
inline void unpermute_dims(F16 even, F16 odd, F16& first, F16& second) {
  const __m512i lo = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  const __m512 e = __builtin_bit_cast(__m512, even), o = __builtin_bit_cast(__m512, odd);
  first = __builtin_bit_cast(F16, _mm512_permutex2var_ps(e, lo, o));
  second = __builtin_bit_cast(F16, _mm512_permutex2var_ps(e, hi, o));
}

constexpr int64_t kGatherRows = 4;  // up to this many real rows in a block: gathered columns beat a 16 x 16 transpose

// The caller configures the tiles (configure_tiles) once per thread and call, not per item.
template <int NV>
void run_item_amx(const WorkItem& w, const Geometry& g, const bf16* q, const bf16* k_cache, const bf16* v_cache,
                  const int32_t* table, int64_t token0, int64_t new_tokens, int64_t context, bf16* out) {
  static_assert(NV % 2 == 0, "a tile row holds 32 dims: head_dim must be a multiple of 32");
  constexpr int64_t D = NV * 16, kSteps = D / 32;
  const int64_t tile = w.q_end - w.q_begin, group = g.group, rows = tile * group;
  const int64_t blocks = (rows + 15) / 16, padded_rows = blocks * 16;
  const int64_t heads = g.num_kv_heads, key_stride = heads * D;
  const int64_t first_pos = context - new_tokens;  // position of new token 0
  const int64_t num_keys = first_pos + w.q_end;    // the tile's last token sees keys 0 .. num_keys-1
  // row r (pad rows: the last's) sees keys first_key[r] .. last_key[r] (its own position)
  thread_local std::vector<int64_t> last_key, first_key;
  last_key.resize(padded_rows);
  first_key.resize(padded_rows);
  for (int64_t r = 0; r < padded_rows; ++r) {
    last_key[r] = first_pos + w.q_begin + std::min(r, rows - 1) / group;
    first_key[r] = g.first_key(last_key[r]);
  }
  // the buffers hold key groups g0 .. key_groups-1: from the item's first seen group, rounded down to
  // a 32-key chunk (c0)
  const int64_t g0 = first_key[0] / kKeys / 2 * 2, c0 = g0 / 2;
  const int64_t key_groups = (num_keys + kKeys - 1) / kKeys, held = key_groups - g0, chunks = (held + 1) / 2;
  // row r sees key groups [first_group(r), groups_seen(r)); a row block, the union of its rows'
  auto first_group = [&](int64_t r) { return first_key[r] / kKeys; };
  auto groups_seen = [&](int64_t r) { return last_key[r] / kKeys + 1; };
  const bool direct = g.block_size % kKeys == 0;  // a 16-key group is one run of slots of one block

  // per kv head h: q_t + h * q_t_head, scores + h * padded_rows * held, values + h * chunks * NV * 512
  thread_local std::vector<int32_t> q_t;  // [heads][blocks][steps][16 dim pairs][16 rows]: B of the scores
  thread_local std::vector<F16> scores;   // [heads][padded_rows][held]: scores, then probabilities
  thread_local std::vector<bf16> p_hi, p_lo;  // [padded_rows][chunks * 32]: A of P V
  thread_local std::vector<bf16> values;  // [heads][chunks][NV][16 key pairs][32]: B of P V
  thread_local std::vector<bf16> gathered;  // [16][D]: one key group, where groups span blocks
  thread_local std::vector<float> row_sum, c_t, block_out;
  const int64_t q_t_head = blocks * kSteps * 256, scores_head = padded_rows * held, values_head = chunks * NV * 512;
  q_t.resize(heads * q_t_head);
  scores.resize(heads * scores_head);
  p_hi.assign(padded_rows * chunks * 32, 0);
  p_lo.assign(padded_rows * chunks * 32, 0);
  values.resize(heads * values_head);
  gathered.resize(direct ? 0 : kKeys * D);
  row_sum.resize(padded_rows);
  c_t.resize(4 * 256);
  block_out.resize(16 * std::min<int64_t>(NV, 4) * 16);
  const int64_t* offsets = key_row_offsets(table, g.block_size, num_keys, key_stride);
  const int64_t p_stride = chunks * 32;

  // queries as B: per kv head, block and 32-dim step, the 16 rows' dim pairs transposed (pad rows zero)
  for (int64_t kvh = 0; kvh < heads; ++kvh)
    for (int64_t rb = 0; rb < blocks; ++rb)
      for (int64_t s = 0; s < kSteps; ++s) {
        F16 block[16];
        for (int64_t n = 0; n < 16; ++n) {
          const int64_t r = rb * 16 + n;
          const bf16* src = q + (token0 + w.q_begin + r / group) * g.q_stride_token + (kvh * group + r % group) * g.q_stride_head;
          block[n] = r < rows ? load16(reinterpret_cast<const float*>(src + 32 * s)) : F16{};
        }
        transpose16(block);
        std::memcpy(q_t.data() + kvh * q_t_head + (rb * kSteps + s) * 256, block, sizeof(block));
      }
  // scores, group by group and every kv head of it (a key's heads are one run of memory), up to four
  // row blocks per key load, masked; the values laid out as B tiles on the way (both streams read
  // once); the next group's rows go to L2 meanwhile, a share of its keys per kv head
  // C^T's rows are 64 floats apart (up to four row blocks side by side)
  const __m512i key_rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(64));
  prefetch_key_rows(k_cache, offsets, g0 * kKeys, std::min(kKeys, num_keys - g0 * kKeys), key_stride);
  prefetch_key_rows(v_cache, offsets, g0 * kKeys, std::min(kKeys, num_keys - g0 * kKeys), key_stride);
  for (int64_t kg = g0; kg < key_groups; ++kg) {
    const int64_t key0 = kg * kKeys, n = std::min(kKeys, num_keys - key0);
    const int64_t next = key0 + kKeys, m = std::min(kKeys, num_keys - next);
    // row blocks that see this group: causal from below, a window from above
    int64_t rb0 = 0, rb1 = blocks;
    while (rb0 < blocks && groups_seen(rb0 * 16 + 15) <= kg) ++rb0;
    while (rb1 > rb0 && first_group((rb1 - 1) * 16) > kg) --rb1;
    for (int64_t kvh = 0; kvh < heads; ++kvh) {
      const int64_t head = kvh * D;
      // the next group's keys and values: where a group is one run (direct), spread over this head's
      // value interleaving, so the miss buffers see a steady trickle; else in one burst
      const int64_t run_lines = direct && m > 0 ? (m * key_stride * 2 + 63) / 64 : 0;
      const int64_t pf_first = kvh * run_lines / heads, pf_count = (kvh + 1) * run_lines / heads - pf_first;
      const char* pf_k = reinterpret_cast<const char*>(k_cache + (m > 0 ? offsets[next] : 0)) + 64 * pf_first;
      const char* pf_v = reinterpret_cast<const char*>(v_cache + (m > 0 ? offsets[next] : 0)) + 64 * pf_first;
      if (m > 0 && !direct) {
        prefetch_key_rows(k_cache, offsets, next, m, key_stride, kvh, heads);
        prefetch_key_rows(v_cache, offsets, next, m, key_stride, kvh, heads);
      }
      // a key past the last (a direct load reads the block's unused slots) only fills its own
      // C^T row, and mask_keys drops it
      const bf16* keys = k_cache + offsets[key0] + head;
      int64_t keys_stride = key_stride * 2;
      if (!direct) {
        std::memset(gathered.data(), 0, gathered.size() * sizeof(bf16));
        for (int64_t j = 0; j < n; ++j) std::memcpy(gathered.data() + j * D, k_cache + offsets[key0 + j] + head, D * 2);
        keys = gathered.data(), keys_stride = D * 2;
      }
      F16* head_scores = scores.data() + kvh * scores_head;
      for (int64_t rb = rb0; rb < rb1; rb += 4) {
        const int64_t nb = std::min<int64_t>(4, rb1 - rb);
        tile_products(nb, kSteps, keys, keys_stride, reinterpret_cast<const bf16*>(q_t.data() + kvh * q_t_head) + rb * kSteps * 512,
                      512, kSteps * 512, c_t.data(), 4 * 16 * 4);
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t r0 = (rb + b) * 16, real = std::min<int64_t>(16, rows - r0);  // pad rows are never read
          F16 block[16];  // C^T's row j: key j's scores of the 16 rows -> block[n]: row n's of the 16 keys
          if (real <= kGatherRows) {  // a decode row's few: a column each, not the whole transpose
            for (int64_t i = 0; i < real; ++i)
              block[i] = __builtin_bit_cast(F16, _mm512_i32gather_ps(_mm512_add_epi32(key_rows, _mm512_set1_epi32(b * 16 + i)), c_t.data(), 4));
          } else {
            for (int64_t j = 0; j < 16; ++j) block[j] = load16(c_t.data() + j * 64 + b * 16);
            transpose16(block);
          }
          for (int64_t i = 0; i < real; ++i) block[i] *= g.scale;
          cap_scores(block, real, g.softcap);
          for (int64_t i = 0; i < real; ++i)
            head_scores[(r0 + i) * held + kg - g0] = mask_keys(block[i], key0, first_key[r0 + i], last_key[r0 + i]);
        }
      }
      bf16* head_values = values.data() + kvh * values_head;
      interleave_values<NV>(v_cache, offsets, head, key0, kg % 2, num_keys, head_values + (kg / 2 - c0) * NV * 512,
                            pf_k, pf_v, pf_count);
      if (kg + 1 == key_groups && kg % 2 == 0)  // the last chunk's second half: past the keys, zeros
        interleave_values<NV>(v_cache, offsets, head, next, 1, num_keys, head_values + (chunks - 1) * NV * 512);
    }
  }

  for (int64_t kvh = 0; kvh < heads; ++kvh) {
    F16* head_scores = scores.data() + kvh * scores_head;
    const bf16* head_values = values.data() + kvh * values_head;
    for (int64_t rb = 0; rb < blocks; ++rb) {
      const int64_t r_end = std::min(rows, rb * 16 + 16);
      const int64_t cb0 = first_group(rb * 16) / 2 - c0, cb1 = (groups_seen(r_end - 1) + 1) / 2 - c0;
      // softmax in fp32, in place (zeros outside the row's keys); then hi and lo bf16 halves
      for (int64_t r = rb * 16; r < r_end; ++r) {
        F16* pr = head_scores + r * held;
        row_sum[r] = softmax_row(pr, first_group(r) - g0, groups_seen(r) - g0, held, g.sink(kvh * group + r % group));
        for (int64_t kg = 2 * cb0; kg < std::min(2 * cb1, held); ++kg) {
          const __m256bh hi = _mm512_cvtneps_pbh(__builtin_bit_cast(__m512, pr[kg]));
          const F16 back = load16(reinterpret_cast<const bf16*>(&hi));
          const __m256bh lo = _mm512_cvtneps_pbh(__builtin_bit_cast(__m512, pr[kg] - back));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(p_hi.data() + r * p_stride + kg * kKeys), (__m256i)hi);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(p_lo.data() + r * p_stride + kg * kKeys), (__m256i)lo);
        }
      }
      // out = P V / row sums, up to four 16-dim blocks per pass over the block's probabilities
      for (int64_t nb0 = 0; nb0 < NV; nb0 += 4) {
        const int64_t nd = std::min<int64_t>(4, NV - nb0);
        const int64_t a = rb * 16 * p_stride + cb0 * 32;
        weigh_tiles(nd, cb1 - cb0, p_hi.data() + a, p_lo.data() + a, p_stride * 2,
                    head_values + (cb0 * NV + nb0) * 512, NV * 512, block_out.data(), nd * 16 * 4);
        for (int64_t r = rb * 16; r < r_end; ++r) {
          const int64_t token = w.q_begin + r / group, h = kvh * group + r % group;
          bf16* dst = out + (token0 + token) * g.out_stride_token + h * g.out_stride_head + nb0 * 16;
          const float inv = 1.f / row_sum[r];
          const float* sums = block_out.data() + (r - rb * 16) * nd * 16;
          for (int64_t c = 0; c < nd; c += 2) {  // nd is even: NV is
            F16 first, second;
            unpermute_dims(load16(sums + 16 * c), load16(sums + 16 * c + 16), first, second);
            store16(dst + 16 * c, first * inv);
            store16(dst + 16 * c + 16, second * inv);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace bulkrun_cpu
#endif
