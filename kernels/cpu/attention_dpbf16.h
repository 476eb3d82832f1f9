// bf16 attention with scores on AVX512-BF16 dot products, for paged_attention.cpp: every bf16 item
// (decode rows and prompt chunks alike) where the CPU has them.
//
// Why: with fp32 FMAs every score costs one FMA per dim, and each key is widened from bf16 first;
// vdpbf16ps takes bf16 pairs as they lie in the cache and does two products per lane. Why one path
// for every item: a row's arithmetic here does not depend on how many rows share its item (each
// score and each output lane is one chain in a fixed order), so prompt chunks run many rows per item,
// sharing every key and value load, and stay batch invariant: a token computes the same bits in a
// 32-token chunk as alone in a decode step.
//
// Per item (kv heads side by side: a key's heads are one run of memory):
//   keys^T  per 16-key group: [pairs][16 keys] int32 (a dim pair of 16 keys per vector, transposed
//           from the cache in 16 x 16 blocks); a row's score for key j = scale * (the chain of
//           head_dim / 2 dot products over the pairs, in order, into lane j from 0)
//   softmax the fp32 rows as run_item does (mask, soft-cap, sinks, max, exp, sum)
//   values  widened to fp32 once per item; out lane d = the chain of fp32 FMAs p_j v_j[d] over the
//           keys in order, then / the row sum. (The probabilities stay fp32: rounding them to bf16
//           for a dot product cost greedy outputs identical to fp32's, bench/precision_bench.py.)
// Keys and values past the item's last key are never read (the transposed keys there are zeros). A
// key before a row's first or after its own position has probability exactly 0: an FMA with it adds
// an exact zero, so a row's bits are the same whatever rows share its item.
#pragma once

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define BULKRUN_DPBF16_ATTENTION 1
#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace bulkrun_cpu {
namespace {

constexpr int kDpScoreRows = 3;    // rows per score block, against 2 key groups: 24 accumulators, 5 loads a pair
constexpr int kDpScoreGroups = 4;  // key groups transposed together (a decode row scores several at once)
constexpr int64_t kEarlyValueBytes = 512 << 10;  // an item's keys and values below this stay in L2 together
constexpr int64_t kNextItemKeys = 512;  // the next item's first keys fetched during a decode item's value pass

// The first keys (up to kNextItemKeys) that item w reads, for a thread to prefetch while it runs the
// item before it; k_cache's rows hold every kv head of a key (key_stride elements).
inline NextItemKeys<bf16> first_keys_of(const WorkItem& w, const Geometry& g, const bf16* k_cache,
                                        const int32_t* tables, const int32_t* starts, const int32_t* lens,
                                        int64_t key_stride) {
  const int64_t first_pos = lens[w.seq] - (starts[w.seq + 1] - starts[w.seq]) + w.q_begin;
  const int64_t first = g.first_key(first_pos) / kKeys * kKeys;
  const int64_t last = std::min<int64_t>(first_pos + (w.q_end - w.q_begin), first + kNextItemKeys);
  return NextItemKeys<bf16>(k_cache, tables + w.seq * g.max_blocks, g.block_size, key_stride, first, last);
}

// 16 keys (rows[j] for j < n; zeros after) of one kv head -> kt[p][j] = the key j's dim pair p
inline void transpose_key_group(const bf16* const* rows, int64_t n, int64_t pairs, int32_t* kt) {
  for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
    const int64_t width = std::min<int64_t>(16, pairs - p0);
    const __mmask16 m = static_cast<__mmask16>((1u << width) - 1);
    F16 block[16];
    if (n == kKeys) {  // a whole group: no per-key test, so the block stays in registers
      for (int64_t j = 0; j < 16; ++j) block[j] = __builtin_bit_cast(F16, _mm512_maskz_loadu_epi32(m, rows[j] + 2 * p0));
    } else {
      for (int64_t j = 0; j < 16; ++j)
        block[j] = j < n ? __builtin_bit_cast(F16, _mm512_maskz_loadu_epi32(m, rows[j] + 2 * p0)) : F16{};
    }
    transpose16(block);
    float* dst = reinterpret_cast<float*>(kt + p0 * 16);
    if (width == 16) {  // stored from registers (a loop of runtime length became a memcpy of a stack copy)
#pragma GCC unroll 16
      for (int p = 0; p < 16; ++p) _mm512_storeu_ps(dst + p * 16, __builtin_bit_cast(__m512, block[p]));
    } else {
      for (int64_t p = 0; p < width; ++p) store16(dst + p * 16, block[p]);
    }
  }
}

// The cache rows of keys key0 + first, + first + step, ... below key0 + n (every kv head: offsets[]
// points at a key's whole row), into L2: a decode row reads each key once, and the kv heads after
// the first find theirs there.
template <typename T>
inline void prefetch_key_rows(const T* cache, const int64_t* offsets, int64_t key0, int64_t n, int64_t row_elems,
                              int64_t first = 0, int64_t step = 1) {
  for (int64_t j = first; j < n; j += step)
    for (int64_t f = 0; f < row_elems; f += 64 / sizeof(T)) prefetch_l2(cache + offsets[key0 + j] + f);
}

// scores[r * stride + b] = scale * (row r . keys of group b) for R rows (q[r]: the row's dim pairs)
// and KB transposed key groups (kt + b * pairs * 16). Each (row, group) sums its pairs in kChains
// interleaved chains (pair p into chain p % kChains, in order), then adds the chains as a tree:
// shorter chains round less than one of head_dim / 2 steps, and keep more dot products in flight.
constexpr int kChains = 4;
template <int R, int KB>
inline void score_block(const int32_t* const* q, const int32_t* kt, int64_t pairs, float scale, F16* scores,
                        int64_t stride) {
  __m512 acc[R][KB][kChains];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < KB; ++b)
      for (int c = 0; c < kChains; ++c) acc[r][b][c] = _mm512_setzero_ps();
  for (int64_t p0 = 0; p0 < pairs; p0 += kChains)  // pairs is a multiple of 8
    for (int c = 0; c < kChains; ++c) {
      const int64_t p = p0 + c;
      __m512bh a[R];
      for (int r = 0; r < R; ++r) a[r] = (__m512bh)_mm512_set1_epi32(q[r][p]);
      for (int b = 0; b < KB; ++b) {
        const __m512bh k = (__m512bh)_mm512_loadu_si512(kt + (b * pairs + p) * 16);
        for (int r = 0; r < R; ++r) acc[r][b][c] = _mm512_dpbf16_ps(acc[r][b][c], a[r], k);
      }
    }
  const __m512 s = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < KB; ++b) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[r][b][0], acc[r][b][1]), _mm512_add_ps(acc[r][b][2], acc[r][b][3]));
      scores[r * stride + b] = __builtin_bit_cast(F16, _mm512_mul_ps(sum, s));
    }
}

// acc[r][c] (R rows, NV 16-dim blocks) += p[r][j] * values[j] for keys j = k0 .. k1-1, in order:
// prob[r] is row r's fp32 probabilities by key, values + j * key_stride key j's NV fp32 blocks.
template <int R, int NV>
inline void weigh_block(const float* const* prob, const float* values, int64_t key_stride, int64_t k0, int64_t k1,
                        __m512 (*acc)[NV]) {
  for (int64_t j = k0; j < k1; ++j) {
    __m512 a[R];
    for (int r = 0; r < R; ++r) a[r] = _mm512_set1_ps(prob[r][j]);
    for (int c = 0; c < NV; ++c) {
      const __m512 v = _mm512_loadu_ps(values + j * key_stride + c * 16);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(a[r], v, acc[r][c]);
    }
  }
}

// weigh_block straight from the cache (bf16 rows, widened on the fly): for an item of one row block,
// whose values are read once, instead of widened into a buffer first. The same products and sums.
// row_elems > 0: also pull whole key rows (every kv head) kL2Ahead keys ahead into L2, for the first
// head's walk when the score pass did not (the later heads find them there).
constexpr int64_t kL2Ahead = 24;
template <int R, int NV>
inline void weigh_block_cache(const float* const* prob, const bf16* v_cache, const int64_t* offsets, int64_t head,
                              int64_t k0, int64_t k1, __m512 (*acc)[NV], int64_t row_elems,
                              NextItemKeys<bf16>* next_keys, int64_t next_lines_per_key) {
  if (row_elems) prefetch_key_rows(v_cache, offsets, k0, std::min(kL2Ahead, k1 - k0), row_elems);
  for (int64_t j = k0; j < k1; ++j) {
    if (next_keys) next_keys->advance(next_lines_per_key);
    if (row_elems && j + kL2Ahead < k1) prefetch_key_rows(v_cache, offsets, j + kL2Ahead, 1, row_elems);
    if (j + kL1Ahead < k1)
      for (int c = 0; c < NV; c += kVectorsPerLine<bf16>) prefetch_l1(v_cache + offsets[j + kL1Ahead] + head + 16 * c);
    const bf16* row = v_cache + offsets[j] + head;
    __m512 a[R];
    for (int r = 0; r < R; ++r) a[r] = _mm512_set1_ps(prob[r][j]);
    for (int c = 0; c < NV; ++c) {
      const __m512 v = __builtin_bit_cast(__m512, load16(row + 16 * c));
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(a[r], v, acc[r][c]);
    }
  }
}

template <int NV>
void run_item_dpbf16(const WorkItem& w, const Geometry& g, const bf16* q, const bf16* k_cache,
                     const bf16* v_cache, const int32_t* table, int64_t token0, int64_t new_tokens, int64_t context,
                     bf16* out, NextItemKeys<bf16>* next_keys) {
  constexpr int64_t D = NV * 16, kPairs = D / 2;
  // value sums per weigh block: R x NV accumulators + R broadcasts + one value vector in registers
  constexpr int kWeighRows = std::max(1, std::min(6, 24 / NV));
  const int64_t tile = w.q_end - w.q_begin, group = g.group, rows = tile * group, heads = g.num_kv_heads;
  const int64_t key_stride = heads * D;            // a key's row: every kv head side by side
  const int64_t first_pos = context - new_tokens;  // position of new token 0
  const int64_t num_keys = first_pos + w.q_end;    // the tile's last token sees keys 0 .. num_keys-1
  const int64_t key_groups = (num_keys + kKeys - 1) / kKeys;
  auto row_pos = [&](int64_t r) { return first_pos + w.q_begin + r / group; };  // r: row within a kv head
  auto groups_seen = [&](int64_t r) { return row_pos(r) / kKeys + 1; };
  auto first_group = [&](int64_t r) { return g.first_key(row_pos(r)) / kKeys; };
  const int64_t item_first_group = first_group(0);
  const int64_t first_key = item_first_group * kKeys;

  thread_local std::vector<int32_t> keys_t;
  thread_local std::vector<float> values;
  thread_local std::vector<F16> scores;
  thread_local std::vector<float> row_sum;
  thread_local std::vector<const int32_t*> q_rows;
  keys_t.resize(kDpScoreGroups * kPairs * 16);
  values.resize(num_keys * key_stride);  // [key][kv head][D] fp32
  scores.resize(heads * rows * key_groups);  // row (kv head, r) at (kvh * rows + r) * key_groups
  row_sum.resize(heads * rows);
  q_rows.resize(heads * rows);
  const int64_t* offsets = key_row_offsets(table, g.block_size, num_keys, key_stride);
  auto key_row = [&](const bf16* cache, int64_t key, int64_t kvh) { return cache + offsets[key] + kvh * D; };
  // keys are walked a block of groups at a time, every kv head of it together (a key's heads are one
  // run of memory); the next block's rows go to L2 while this one computes
  constexpr int64_t kBlockKeys = kDpScoreGroups * kKeys;
  auto prefetch = [&](const bf16* cache, int64_t key0) {
    if (key0 < num_keys) prefetch_key_rows(cache, offsets, key0, std::min(kBlockKeys, num_keys - key0), key_stride);
  };

  // An item of one row block (a decode row) reads its values once, straight from the cache; where
  // they fit in L2 beside the keys the score pass pulls them in as it goes, overlapping both streams.
  const bool one_block = rows <= kWeighRows;
  const bool values_early = one_block && 2 * (num_keys - first_key) * key_stride * 2 <= kEarlyValueBytes;
  prefetch(k_cache, first_key);  // the first block, while the queries are gathered
  // a decode item's value pass fetches the next item's keys, spread over its heads' walks of the keys
  if (!one_block) next_keys = nullptr;
  const int64_t next_lines_per_key =
      next_keys ? (next_keys->lines() + heads * (num_keys - first_key) - 1) / (heads * (num_keys - first_key)) : 0;
  for (int64_t kvh = 0; kvh < heads; ++kvh)
    for (int64_t r = 0; r < rows; ++r)
      q_rows[kvh * rows + r] = reinterpret_cast<const int32_t*>(
          q + (token0 + w.q_begin + r / group) * g.q_stride_token + (kvh * group + r % group) * g.q_stride_head);
  // pass 1: scores, kDpScoreGroups key groups at a time, masked
  for (int64_t kg0 = item_first_group; kg0 < key_groups; kg0 += kDpScoreGroups) {
    const int64_t nb = std::min<int64_t>(kDpScoreGroups, key_groups - kg0);
    // rows before the first token that sees key kg0 * 16 see none of these groups
    const int64_t r_start = std::max<int64_t>(0, kg0 * kKeys - first_pos - w.q_begin) * group;
    for (int64_t kvh = 0; kvh < heads; ++kvh) {
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t key0 = (kg0 + b) * kKeys, n = std::min(kKeys, num_keys - key0);
        // a block ahead (after the last key, the first values), a share of its keys per kv head: a
        // burst of a whole block's prefetches would overflow the cache's miss queue
        const int64_t ahead = key0 + kBlockKeys < num_keys ? key0 + kBlockKeys : first_key + key0 + kBlockKeys - num_keys;
        const bf16* ahead_cache = key0 + kBlockKeys < num_keys ? k_cache : v_cache;
        if (ahead < num_keys && (ahead_cache == k_cache || !values_early))
          prefetch_key_rows(ahead_cache, offsets, ahead, std::min(kKeys, num_keys - ahead), key_stride, kvh, heads);
        // and these keys' values, for the value walk: it then reads L2, not DRAM
        if (values_early) prefetch_key_rows(v_cache, offsets, key0, n, key_stride, kvh, heads);
        const bf16* rows_of_keys[kKeys];
        for (int64_t j = 0; j < n; ++j) rows_of_keys[j] = key_row(k_cache, key0 + j, kvh);
        transpose_key_group(rows_of_keys, n, kPairs, keys_t.data() + b * kPairs * 16);
      }
      for (int64_t r0 = r_start; r0 < rows; r0 += kDpScoreRows) {
        const int64_t n_rows = std::min<int64_t>(kDpScoreRows, rows - r0);
        const int32_t* const* qr = q_rows.data() + kvh * rows + r0;
        F16* dst = scores.data() + (kvh * rows + r0) * key_groups + kg0;
        // groups past the block's last row are past every row of it: masked whatever they hold
        const int64_t nb_seen = std::min<int64_t>(nb, groups_seen(r0 + n_rows - 1) - kg0);
        with_row_count<kDpScoreRows>(n_rows, [&](auto rows_in_block) {
          constexpr int R = decltype(rows_in_block)::value;
          // R x KB x kChains accumulators: at most 24 in registers
          constexpr int KB = R >= 4 ? 1 : R >= 2 ? 2 : 4;
          int64_t b = 0;
          for (; b + KB <= nb_seen; b += KB)
            score_block<R, KB>(qr, keys_t.data() + b * kPairs * 16, kPairs, g.scale, dst + b, key_groups);
          for (; b < nb_seen; ++b)
            score_block<R, 1>(qr, keys_t.data() + b * kPairs * 16, kPairs, g.scale, dst + b, key_groups);
        });
      }
      for (int64_t r = r_start; r < rows; ++r) {
        F16* sc = scores.data() + (kvh * rows + r) * key_groups + kg0;
        cap_scores(sc, nb, g.softcap);
        for (int64_t b = 0; b < nb; ++b)
          sc[b] = mask_keys(sc[b], (kg0 + b) * kKeys, g.first_key(row_pos(r)), row_pos(r));
      }
    }
  }
  // softmax in fp32, in place (zeros outside the row's keys)
  for (int64_t kvh = 0; kvh < heads; ++kvh)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = kvh * rows + r;
      row_sum[row] = softmax_row(scores.data() + row * key_groups, first_group(r), groups_seen(r), key_groups,
                                 g.sink(kvh * group + r % group));
    }
  // values: widened to fp32, every kv head of a key together (an item of one row block reads them
  // from the cache instead)
  for (int64_t j = first_key; j < (one_block ? first_key : num_keys); ++j) {
    if (j + kBlockKeys < num_keys) prefetch_key_rows(v_cache, offsets, j + kBlockKeys, 1, key_stride);  // a block ahead
    const bf16* src = v_cache + offsets[j];
    float* dst = values.data() + j * key_stride;
    for (int64_t c = 0; c < key_stride; c += 16) store16(dst + c, load16(src + c));
  }
  // pass 2: out = probs . values / row sum, kWeighRows rows per sweep over the values
  for (int64_t kvh = 0; kvh < heads; ++kvh) {
    const float* head_values = values.data() + kvh * D;
    for (int64_t r0 = 0; r0 < rows; r0 += kWeighRows) {
      const int64_t n_rows = std::min<int64_t>(kWeighRows, rows - r0);
      with_row_count<kWeighRows>(n_rows, [&](auto rows_in_block) {
        constexpr int R = decltype(rows_in_block)::value;
        const float* prob[R];
        for (int i = 0; i < R; ++i) prob[i] = reinterpret_cast<const float*>(scores.data() + (kvh * rows + r0 + i) * key_groups);
        // the block's last row sees the most keys; the others' later keys have probability 0
        const int64_t k1 = row_pos(r0 + R - 1) + 1;
        __m512 acc[R][NV];
        for (int i = 0; i < R; ++i)
          for (int c = 0; c < NV; ++c) acc[i][c] = _mm512_setzero_ps();
        if (one_block)
          weigh_block_cache<R, NV>(prob, v_cache, offsets, kvh * D, first_key, k1, acc,
                                   kvh == 0 && !values_early ? key_stride : 0, next_keys, next_lines_per_key);
        else
          weigh_block<R, NV>(prob, head_values, key_stride, first_key, k1, acc);
        for (int i = 0; i < R; ++i) {
          const int64_t r = r0 + i, token = w.q_begin + r / group, h = kvh * group + r % group;
          bf16* dst = out + (token0 + token) * g.out_stride_token + h * g.out_stride_head;
          const float inv = 1.f / row_sum[kvh * rows + r];
          for (int c = 0; c < NV; ++c) store16(dst + 16 * c, __builtin_bit_cast(F16, acc[i][c]) * inv);
        }
      });
    }
  }
}

}  // namespace
}  // namespace bulkrun_cpu
#endif
