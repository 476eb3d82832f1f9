// Paged attention for the CPU: every sequence's new queries against its cached K/V, read in place
// through the block table (no gathered copy), causal, grouped-query. q, the cache and out are all
// float32 or all bfloat16 (a bf16 cache: half the bytes to stream); scores, softmax and value sums
// are float32 either way, and each output is rounded once.
//
// Why native code: on the CPU decode attention is bound by memory traffic. The PyTorch reference
// copies each sequence's K/V blocks into a contiguous buffer before SDPA reads them again; here every
// K/V row is read where it lies, 16 keys at a time: decode-sized items read each row once for all kv
// heads (run_item_few), prompt chunks kv head by kv head (run_item). Batch invariant, a prompt row's
// scores are summed key by key as a decode row's are (score_rows_by_key), so a row's bits do not
// depend on its item; otherwise against transposed keys (score_keys: fewer operations, other bits).
//
// Work item = (sequence, tile of up to kQueryTile new tokens), all heads. Items go to PyTorch's
// intra-op threads longest-first from a shared counter, so the threads finish together.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "vec_math.h"

namespace bulkrun_cpu {
namespace {

constexpr int64_t kQueryTile = 32;
constexpr int64_t kAmxQueryTile = 64;  // on AMX: each item reads its keys and values once, for more rows
constexpr int64_t kKeys = 16;  // keys per score vector (one F16)
// Where an F16 is two registers (AVX2: 16 registers of 8 floats, kF16IsTwoRegisters) half as many
// F16 sums fit: the row blocks below shrink with it, so the sums stay in registers (the same chains
// in any blocking: the same bits).
constexpr int64_t kRowBlock = kF16IsTwoRegisters ? 6 : 8;  // query rows scored together against transposed keys
// decode rows: each group of keys is prefetched into L2 a group ahead, and each key into L1 this many
// keys ahead (docs/benchmarks.md, design figures)
constexpr int64_t kL1Ahead = 4;
// 16-element vectors per 64-byte cache line: one prefetch per line
template <typename T>
constexpr int kVectorsPerLine = 64 / (16 * sizeof(T));

struct Geometry {
  int64_t num_q_heads, num_kv_heads, group, block_size, max_blocks;
  int64_t q_stride_token, q_stride_head, out_stride_token, out_stride_head;
  float scale;
  int64_t window;        // > 0: a query at p sees keys p - window + 1 .. p; 0: all keys up to p
  float softcap;         // > 0: scores = softcap * tanh(scores / softcap)
  const float* sinks;    // [Hq] logits joining each head's softmax denominator, or null

  int64_t first_key(int64_t pos) const { return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0; }
  float sink(int64_t head) const { return sinks ? sinks[head] : -std::numeric_limits<float>::infinity(); }
};

// tanh(x) = 1 - 2 / (e^2x + 1): exact limits at both ends (vec_exp clamps, so no inf / inf)
inline F16 vec_tanh(F16 x) { return 1.0f - 2.0f / (vec_exp(x * 2.0f) + 1.0f); }

// Soft-capped scores (Gemma 2): cap * tanh(s / cap), in place; nothing when the cap is off.
inline void cap_scores(F16* s, int64_t n, float cap) {
  if (cap <= 0.f) return;
  for (int64_t i = 0; i < n; ++i) s[i] = vec_tanh(s[i] * (1.0f / cap)) * cap;
}

// The lanes of a 16-key group (keys key0 .. key0+15) that a row seeing keys first .. last keeps;
// the others become -inf (a probability of exactly 0).
inline F16 mask_keys(F16 scores, int64_t key0, int64_t first, int64_t last) {
  const I16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const int32_t lo = static_cast<int32_t>(first - key0), hi = static_cast<int32_t>(last - key0);
  const F16 masked = splat(-std::numeric_limits<float>::infinity());
  return where_greater(lane, hi, masked, where_greater(-lane, -lo, masked, scores));  // past hi, before lo
}

struct WorkItem {
  int32_t seq, q_begin, q_end;  // the tile: new tokens q_begin .. q_end-1 of the sequence
  int64_t cost;
};

// Scores of `rows` query rows (NV vectors each) against up to 16 keys (rows[j] for j < n; the
// others are never read) -> scores[r] (lane j = key j). For the many rows of a prompt chunk: transpose
// the 16 keys once, then each row is NV*16 broadcast-FMAs across all 16 keys, 8 rows at a time so the
// FMAs do not wait on each other. (Decode-sized items take score_keys_few.)
template <int NV, typename T>
void score_keys(const F16* q, int64_t rows, const T* const* keys, int64_t n, F16* scores) {
  F16 keys_t[NV][kKeys];  // keys_t[c][x] lane j = key j, dim 16c + x
  for (int c = 0; c < NV; ++c) {
    for (int64_t j = 0; j < kKeys; ++j) keys_t[c][j] = j < n ? load16(keys[j] + 16 * c) : F16{};
    transpose16(keys_t[c]);
  }
  // q holds whole blocks of kRowBlock rows (zero rows pad the last), so no row is guarded
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const float* qf = reinterpret_cast<const float*>(q + r0 * NV);
    if constexpr (kF16IsTwoRegisters) {  // AVX2: the sums as 8-lane halves in registers (as weigh_block_halves)
      F8 halves[kRowBlock][2] = {};
      for (int c = 0; c < NV; ++c)
        for (int x = 0; x < 16; ++x) {
          const float* k = reinterpret_cast<const float*>(&keys_t[c][x]);
          const F8 k0 = load8(k), k1 = load8(k + 8);
          for (int64_t i = 0; i < kRowBlock; ++i) {
            const float qv = qf[i * NV * 16 + c * 16 + x];
            halves[i][0] += k0 * qv;
            halves[i][1] += k1 * qv;
          }
        }
      for (int64_t i = 0; i < std::min(kRowBlock, rows - r0); ++i) std::memcpy(scores + r0 + i, halves[i], sizeof(F16));
      continue;
    }
    F16 acc[kRowBlock] = {};
    for (int c = 0; c < NV; ++c)
      for (int x = 0; x < 16; ++x) {
        const F16 k = keys_t[c][x];
        for (int64_t i = 0; i < kRowBlock; ++i) acc[i] += k * qf[i * NV * 16 + c * 16 + x];
      }
    for (int64_t i = 0; i < std::min(kRowBlock, rows - r0); ++i) scores[r0 + i] = acc[i];
  }
}

// Where each key's row (every kv head side by side) starts in the cache, looked up in the block table
// once per item (any block size: a group of 16 keys may span blocks). Valid until the thread's next
// call; a plain pointer, as each use of a thread_local costs a TLS lookup.
inline const int64_t* key_row_offsets(const int32_t* table, int64_t block_size, int64_t num_keys,
                                      int64_t key_stride) {
  thread_local std::vector<int64_t> offsets;
  offsets.resize(num_keys);
  int64_t* out = offsets.data();
  // block by block: a division per key (block_size is known only at run time) cost more than the rest
  for (int64_t key0 = 0, b = 0; key0 < num_keys; key0 += block_size, ++b) {
    const int64_t base = static_cast<int64_t>(table[b]) * block_size * key_stride, n = std::min(block_size, num_keys - key0);
    for (int64_t j = 0; j < n; ++j) out[key0 + j] = base + j * key_stride;
  }
  return out;
}

// The cache rows (every kv head) of the item a thread runs next, walked a cache line at a time into
// L2. A decode item computes its value pass from L2 with DRAM idle; issuing a few of these per key
// there streams the next item's keys in meanwhile, so its score pass waits on none of them.
template <typename T>
struct NextItemKeys {
  const T* cache = nullptr;
  const int32_t* table = nullptr;
  int64_t block_size = 0, key_stride = 0;
  int64_t key = 0, last = 0;          // the run after this one starts at key `key`; keys end at `last`
  const T* line = nullptr;            // the next line to fetch, in a run of contiguous rows up to `end`
  const T* end = nullptr;

  NextItemKeys(const T* cache_, const int32_t* table_, int64_t block_size_, int64_t key_stride_, int64_t first,
               int64_t last_)
      : cache(cache_), table(table_), block_size(block_size_), key_stride(key_stride_), key(first), last(last_) {}
  int64_t lines() const { return (last - key) * key_stride * static_cast<int64_t>(sizeof(T)) / 64 + 1; }
  void advance(int64_t n) {
    for (; n > 0; --n) {
      if (line >= end) {  // the next block's rows: contiguous up to its end or the last key
        if (key >= last) return;
        const int64_t in_block = key % block_size, count = std::min(block_size - in_block, last - key);
        line = cache + (static_cast<int64_t>(table[key / block_size]) * block_size + in_block) * key_stride;
        end = line + count * key_stride;
        key += count;
      }
      prefetch_l2(line);
      line += 64 / sizeof(T);
    }
  }
};

// f(integral_constant<R>) for the runtime row count n in 1 .. Max, so per-row arrays can stay in registers.
template <int64_t Max, typename F>
void with_row_count(int64_t n, F&& f) {
  if constexpr (Max > 1)
    if (n < Max) return with_row_count<Max - 1>(n, f);
  f(std::integral_constant<int64_t, Max>{});
}

// One row's masked scores -> unnormalized probabilities in place; returns their sum. Only groups
// begin .. seen-1 hold keys the row sees; the others (up to key_groups) become exact zeros. A sink
// logit (-inf: none) joins the max and the sum but has no value row.
inline float softmax_row(F16* pr, int64_t begin, int64_t seen, int64_t key_groups, float sink) {
  for (int64_t kg = 0; kg < begin; ++kg) pr[kg] = F16{};
  for (int64_t kg = seen; kg < key_groups; ++kg) pr[kg] = F16{};
  F16 m = pr[begin];
  for (int64_t kg = begin + 1; kg < seen; ++kg) m = select_max(m, pr[kg]);
  const float row_max = std::max(lane_max(m), sink);
  F16 sum = F16{};
  if (sink > -std::numeric_limits<float>::infinity()) sum[0] = vec_exp(sink - row_max);
  for (int64_t kg = begin; kg < seen; ++kg) {
    // below e^-87 a probability is exactly 0: invisible next to the row's largest term (1), and
    // it keeps subnormal products (slow on most CPUs) out of the value sums
    const F16 shifted = pr[kg] - row_max;
    const F16 p = where_greater(shifted, -87.0f, vec_exp<false>(shifted), F16{});  // (shifted <= 0)
    pr[kg] = p;
    sum += p;
  }
  return lane_sum(sum);
}

// Key j of a group of n in a key-by-key score pass: past the last key, zero the rows' partial sums
// (the slot may hold anything, never read it) and say so; else ask for the key kL1Ahead on.
template <int NV, int R, typename T>
inline bool key_in_group(F16 (&parts)[R][kKeys], const T* const* keys, int64_t j, int64_t n) {
  if (j >= n) {
    for (int r = 0; r < R; ++r) parts[r][j] = F16{};
    return false;
  }
  if (j + kL1Ahead < n)
    for (int c = 0; c < NV; c += kVectorsPerLine<T>) prefetch_l1(keys[j + kL1Ahead] + 16 * c);
  return true;
}

// score_keys_few where an F16 is two registers (AVX2): each key's products as two 8-lane halves,
// the queries read from L1. GCC's F16 code kept the key and the partial sums on the
// stack and stored them in 16-byte pieces that sum_each's 32-byte loads then waited on. Lane for
// lane the same products and sums: the same bits.
template <int NV, int R, typename T>
void score_keys_few_halves(const F16* q, const T* const* keys, int64_t n, F16* scores) {
  const float* qf = reinterpret_cast<const float*>(q);
  F16 parts[R][kKeys];
  for (int64_t j = 0; j < kKeys; ++j) {
    if (!key_in_group<NV>(parts, keys, j, n)) continue;
    for (int h = 0; h < 2; ++h) {  // lanes 8h .. 8h + 7
      F8 k[NV];
      for (int c = 0; c < NV; ++c) k[c] = load8(keys[j] + 16 * c + 8 * h);
      for (int r = 0; r < R; ++r) {
        F8 part = k[0] * load8(qf + r * NV * 16 + 8 * h);
        for (int c = 1; c < NV; ++c) part += k[c] * load8(qf + (r * NV + c) * 16 + 8 * h);
        std::memcpy(reinterpret_cast<float*>(&parts[r][j]) + 8 * h, &part, sizeof(F8));
      }
    }
  }
  for (int r = 0; r < R; ++r) scores[r] = sum_each(parts[r]);
}

// Value sums where an F16 is two registers (AVX2): dims dim0 .. dim0 + 15 of n value
// rows, weighed by R rows' probabilities (p[i][j]: row i, key j), into acc[i] as two 8-lane halves.
// GCC's F16 sums here lived on the stack, each passed through general registers on every key. Lane
// for lane the same FMAs in the same key order: the same bits.
template <int64_t R, typename T>
inline void weigh_block_halves(const T* const* values, int64_t n, int64_t dim0, const float* const* p,
                               F8 (&acc)[R][2]) {
  for (int64_t j = 0; j < n; ++j) {
    const F8 v0 = load8(values[j] + dim0), v1 = load8(values[j] + dim0 + 8);
    for (int64_t i = 0; i < R; ++i) {
      const float pij = p[i][j];
      acc[i][0] += v0 * pij;
      acc[i][1] += v1 * pij;
    }
  }
}

// score_keys for a compile-time R < 6 rows: key by key, each key's vectors loaded once for all rows
// and the rows' queries held in registers (the row-by-row loop reloaded both for every product).
template <int NV, int R, typename T>
void score_keys_few(const F16* q, const T* const* keys, int64_t n, F16* scores) {
  if constexpr (kF16IsTwoRegisters) return score_keys_few_halves<NV, R>(q, keys, n, scores);
  F16 held[R][NV];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NV; ++c) held[r][c] = q[r * NV + c];
  F16 parts[R][kKeys];
  for (int64_t j = 0; j < kKeys; ++j) {
    if (!key_in_group<NV>(parts, keys, j, n)) continue;
    F16 k[NV];
    for (int c = 0; c < NV; ++c) k[c] = load16(keys[j] + 16 * c);
    for (int r = 0; r < R; ++r) {
      F16 part = k[0] * held[r][0];
      for (int c = 1; c < NV; ++c) part += k[c] * held[r][c];
      parts[r][j] = part;
    }
  }
  for (int r = 0; r < R; ++r) scores[r] = sum_each(parts[r]);
}

// score_keys_few's arithmetic for any number of rows, kByKeyRows at a time: each row's scores are
// bit for bit those of the same row in a decode-sized item.
constexpr int64_t kByKeyRows = 5;
template <int NV, typename T>
void score_rows_by_key(const F16* q, int64_t rows, const T* const* keys, int64_t n, F16* scores) {
  for (int64_t r0 = 0; r0 < rows; r0 += kByKeyRows)
    with_row_count<kByKeyRows>(std::min(kByKeyRows, rows - r0), [&](auto R) {
      score_keys_few<NV, decltype(R)::value>(q + r0 * NV, keys, n, scores + r0);
    });
}

// One item, kv head by kv head, in two passes over that head's keys: all scores first (then one
// max, one exp and one sum per row: no running rescale), then the probability-weighted values,
// several rows at a time so each value row is loaded once for all of them. NV = head_dim / 16.
// Rows are ordered (tile token, q head of this kv head's group). by_key: scores as decode rows sum
// them (batch invariant); else against transposed keys.
template <int NV, typename T>
void run_item(const WorkItem& w, const Geometry& g, const T* q, const T* k_cache, const T* v_cache,
              const int32_t* table, int64_t token0, int64_t new_tokens, int64_t context, T* out, bool by_key) {
  const int64_t tile = w.q_end - w.q_begin, group = g.group, rows = tile * group;
  // rows and 16-dim blocks per sweep over the values: their R x blocks sums stay in registers (6 x 4
  // at head_dim 64 beat 4 rows on a prompt-chunk layer; on AVX2, 6 rows x one block)
  constexpr int64_t kSweepBlocks = kF16IsTwoRegisters ? 1 : NV;
  constexpr int64_t kSweepRows = std::max<int64_t>(1, std::min<int64_t>(6, 24 / kSweepBlocks));
  const int64_t key_stride = g.num_kv_heads * NV * 16;
  const int64_t first_pos = context - new_tokens;  // position of new token 0
  const int64_t num_keys = first_pos + w.q_end;    // the tile's last token sees keys 0 .. num_keys-1
  const int64_t key_groups = (num_keys + kKeys - 1) / kKeys;
  // causal: row r sees only the key groups up to its own token's; the tile's later rows see more, so
  // each pass skips the groups no row of its block sees (a prompt's tiles skip ~1 group in 8); with a
  // window, the groups before row r's first key too (row 0's is the item's earliest)
  auto row_pos = [&](int64_t r) { return first_pos + w.q_begin + r / group; };
  auto groups_seen = [&](int64_t r) { return row_pos(r) / kKeys + 1; };
  auto first_group = [&](int64_t r) { return g.first_key(row_pos(r)) / kKeys; };
  const int64_t item_first_group = first_group(0);

  thread_local std::vector<F16> buffer;
  const int64_t padded_rows = (rows + kRowBlock - 1) / kRowBlock * kRowBlock;
  buffer.assign(padded_rows * NV + rows * key_groups + rows, F16{});
  F16* q_rows = buffer.data();              // [padded_rows][NV], pre-scaled; pad rows stay 0
  F16* probs = q_rows + padded_rows * NV;   // [rows][key_groups]: scores, then probabilities
  F16* group_scores = probs + rows * key_groups;  // [rows]: one key group's scores
  std::vector<float> row_sum(rows);
  // + kv head * head_dim selects a head
  const int64_t* offsets = key_row_offsets(table, g.block_size, num_keys, key_stride);
  auto rows_of = [&](const T* cache, int64_t kvh, int64_t key0, int64_t n, const T** out_rows) {
    for (int64_t j = 0; j < n; ++j) out_rows[j] = cache + offsets[key0 + j] + kvh * NV * 16;
  };
  // ask for the next group's rows now, so they arrive while this group computes
  auto prefetch_group = [&](const T* cache, int64_t kvh, int64_t key0) {
    const int64_t n = std::min(kKeys, num_keys - key0);
    const T* next[kKeys];
    rows_of(cache, kvh, key0, n, next);
    for (int64_t j = 0; j < n; ++j)
      for (int c = 0; c < NV; c += kVectorsPerLine<T>) prefetch_l1(next[j] + 16 * c);
  };

  // rows r0 .. r0+R-1 of kv head kvh: out = probs . values / row_sum, R rows per sweep over the values
  // (R a compile-time constant, so the R x NV accumulators stay in registers)
  auto weigh_values = [&](auto rows_per_sweep, int64_t r0, int64_t kvh) {
    constexpr int64_t R = decltype(rows_per_sweep)::value, B = kSweepBlocks;
    const int64_t sweep_groups = groups_seen(r0 + R - 1);
    for (int64_t c0 = 0; c0 < NV; c0 += B) {  // dims 16 c0 .. 16 (c0 + B) - 1
      F16 acc[R][B] = {};
      F8 halves[R][2] = {};  // acc's sums on AVX2 (weigh_block_halves)
      for (int64_t kg = first_group(r0); kg < sweep_groups; ++kg) {
        const int64_t key0 = kg * kKeys, n = std::min(kKeys, num_keys - key0);
        const T* values[kKeys];
        rows_of(v_cache, kvh, key0, n, values);
        if (c0 == 0 && kg + 1 < sweep_groups) prefetch_group(v_cache, kvh, key0 + kKeys);
        const float* p[R];  // row r0 + i's probabilities of this group, read a lane at a time
        for (int64_t i = 0; i < R; ++i) p[i] = reinterpret_cast<const float*>(probs + (r0 + i) * key_groups + kg);
        if constexpr (kF16IsTwoRegisters) {
          weigh_block_halves<R>(values, n, 16 * c0, p, halves);
          continue;
        }
        for (int64_t j = 0; j < n; ++j) {  // j < n: slots past the last key are never read
          F16 v[B];
          for (int c = 0; c < B; ++c) v[c] = load16(values[j] + 16 * (c0 + c));
          for (int64_t i = 0; i < R; ++i)
            for (int c = 0; c < B; ++c) acc[i][c] += v[c] * p[i][j];
        }
      }
      for (int64_t i = 0; i < R; ++i) {
        const int64_t r = r0 + i, token = w.q_begin + r / group, h = kvh * group + r % group;
        T* dst = out + (token0 + token) * g.out_stride_token + h * g.out_stride_head;
        const float inv = 1.f / row_sum[r];
        if constexpr (kF16IsTwoRegisters) {
          F16 sums;
          std::memcpy(&sums, halves[i], sizeof(sums));
          store16(dst + 16 * c0, sums * inv);
          continue;
        }
        for (int c = 0; c < B; ++c) store16(dst + 16 * (c0 + c), acc[i][c] * inv);
      }
    }
  };

  for (int64_t kvh = 0; kvh < g.num_kv_heads; ++kvh) {
    for (int64_t i = 0, r = 0; i < tile; ++i)
      for (int64_t h = 0; h < group; ++h, ++r) {
        const T* src = q + (token0 + w.q_begin + i) * g.q_stride_token + (kvh * group + h) * g.q_stride_head;
        for (int c = 0; c < NV; ++c) q_rows[r * NV + c] = load16(src + 16 * c) * g.scale;
      }
    // pass 1: scores, masked (a masked lane's probability is exactly 0)
    for (int64_t kg = item_first_group; kg < key_groups; ++kg) {
      const int64_t key0 = kg * kKeys;
      const int64_t n = std::min(kKeys, num_keys - key0);
      const T* keys[kKeys];
      rows_of(k_cache, kvh, key0, n, keys);
      if (kg + 1 < key_groups) prefetch_group(k_cache, kvh, key0 + kKeys);
      // rows before the first token that sees key0 are all masked here: start at its row block
      const int64_t first_token = std::max<int64_t>(0, key0 - first_pos - w.q_begin);
      const int64_t r_start = first_token * group / kRowBlock * kRowBlock;
      if (by_key) score_rows_by_key<NV>(q_rows + r_start * NV, rows - r_start, keys, n, group_scores + r_start);
      else score_keys<NV>(q_rows + r_start * NV, rows - r_start, keys, n, group_scores + r_start);
      cap_scores(group_scores + r_start, rows - r_start, g.softcap);
      for (int64_t r = r_start; r < rows; ++r)
        probs[r * key_groups + kg] = mask_keys(group_scores[r], key0, g.first_key(row_pos(r)), row_pos(r));
    }
    for (int64_t r = 0; r < rows; ++r)
      row_sum[r] = softmax_row(probs + r * key_groups, first_group(r), groups_seen(r), key_groups,
                               g.sink(kvh * group + r % group));
    // pass 2: out = probs . values, kSweepRows rows per sweep over the values
    for (int64_t r0 = 0; r0 < rows; r0 += kSweepRows)
      with_row_count<kSweepRows>(std::min(kSweepRows, rows - r0), [&](auto R) { weigh_values(R, r0, kvh); });
  }
}

// Decode-sized items (fewer than 6 rows per kv head): too little work per key for the keys to stay
// in cache between kv heads, so both passes walk the keys once, all kv heads of each key row together:
// a key row holds every kv head side by side, so a block of keys is one contiguous run of memory that
// the hardware prefetcher streams, instead of three strided walks over it. The value sums of every
// (kv head, row) live in a small buffer between key groups. Scores are 16 dot products summed by one
// shuffle tree (score_keys_few); softmax and value sums are run_item's.
template <int NV, int R, typename T>
void run_item_few(const WorkItem& w, const Geometry& g, const T* q, const T* k_cache, const T* v_cache,
                  const int32_t* table, int64_t token0, int64_t new_tokens, int64_t context, T* out) {
  const int64_t group = g.group, heads = g.num_kv_heads;
  const int64_t head_floats = NV * 16, key_stride = heads * head_floats;
  const int64_t first_pos = context - new_tokens;
  const int64_t num_keys = first_pos + w.q_end;
  const int64_t key_groups = (num_keys + kKeys - 1) / kKeys;
  const int64_t all_rows = heads * R;  // row (kvh, r): token q_begin + r / group, q head kvh * group + r % group

  thread_local std::vector<F16> buffer;
  buffer.assign(all_rows * NV * 2 + all_rows * key_groups + R, F16{});
  F16* q_rows = buffer.data();              // [heads][R][NV], pre-scaled
  F16* acc = q_rows + all_rows * NV;        // [heads][R][NV]: value sums
  F16* probs = acc + all_rows * NV;         // [heads * R][key_groups]
  F16* group_scores = probs + all_rows * key_groups;  // [R]
  std::vector<float> row_sum(all_rows);
  // + kv head * head_dim selects a head
  const int64_t* offsets = key_row_offsets(table, g.block_size, num_keys, key_stride);
  auto row_pos = [&](int64_t r) { return first_pos + w.q_begin + r / group; };  // r: row within a kv head
  // with a window, the key groups before the item's earliest first key are never read
  const int64_t first_group = g.first_key(row_pos(0)) / kKeys;
  // the next group's whole key rows, into L2 (a burst of L1 prefetches stalls on L1's few miss
  // buffers: 0.97 ms a layer against 0.68 here), a share of the keys per kv head visited
  auto prefetch_rows = [&](const T* cache, int64_t key0, int64_t part, int64_t parts) {
    const int64_t n = std::min(kKeys, num_keys - key0);
    for (int64_t j = part; j < n; j += parts)
      for (int64_t f = 0; f < key_stride; f += 16 * kVectorsPerLine<T>) prefetch_l2(cache + offsets[key0 + j] + f);
  };

  prefetch_rows(k_cache, first_group * kKeys, 0, 1);  // the first group, while the queries are gathered
  for (int64_t kvh = 0; kvh < heads; ++kvh)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t token = w.q_begin + r / group, h = kvh * group + r % group;
      const T* src = q + (token0 + token) * g.q_stride_token + h * g.q_stride_head;
      for (int c = 0; c < NV; ++c) q_rows[(kvh * R + r) * NV + c] = load16(src + 16 * c) * g.scale;
    }
  // pass 1: scores, masked
  for (int64_t kg = first_group; kg < key_groups; ++kg) {
    const int64_t key0 = kg * kKeys, n = std::min(kKeys, num_keys - key0);
    for (int64_t kvh = 0; kvh < heads; ++kvh) {
      // the next group of keys, or after the last one the first group of values
      if (kg + 1 < key_groups) prefetch_rows(k_cache, key0 + kKeys, kvh, heads);
      else prefetch_rows(v_cache, first_group * kKeys, kvh, heads);
      const T* keys[kKeys];
      for (int64_t j = 0; j < n; ++j) keys[j] = k_cache + offsets[key0 + j] + kvh * head_floats;
      score_keys_few<NV, R>(q_rows + kvh * R * NV, keys, n, group_scores);
      cap_scores(group_scores, R, g.softcap);
      for (int64_t r = 0; r < R; ++r)
        probs[(kvh * R + r) * key_groups + kg] =
            mask_keys(group_scores[r], key0, g.first_key(row_pos(r)), row_pos(r));
    }
  }
  for (int64_t kvh = 0; kvh < heads; ++kvh)
    for (int64_t r = 0; r < R; ++r)
      row_sum[kvh * R + r] = softmax_row(probs + (kvh * R + r) * key_groups, first_group, key_groups, key_groups,
                                         g.sink(kvh * group + r % group));
  // pass 2: out = probs . values
  for (int64_t kg = first_group; kg < key_groups; ++kg) {
    const int64_t key0 = kg * kKeys, n = std::min(kKeys, num_keys - key0);
    for (int64_t kvh = 0; kvh < heads; ++kvh) {
      if (kg + 1 < key_groups) prefetch_rows(v_cache, key0 + kKeys, kvh, heads);
      if constexpr (kF16IsTwoRegisters) {
        // AVX2: one 16-dim block of every row's sums at a time, in registers (weigh_block_halves)
        const T* values[kKeys];
        const float* p[R];
        for (int64_t j = 0; j < n; ++j) values[j] = v_cache + offsets[key0 + j] + kvh * head_floats;
        for (int64_t i = 0; i < R; ++i) p[i] = reinterpret_cast<const float*>(probs + (kvh * R + i) * key_groups + kg);
        for (int c = 0; c < NV; ++c) {
          F8 a[R][2];
          for (int64_t i = 0; i < R; ++i)
            for (int h = 0; h < 2; ++h) a[i][h] = load8(reinterpret_cast<const float*>(acc + (kvh * R + i) * NV + c) + 8 * h);
          weigh_block_halves<R>(values, n, 16 * c, p, a);
          for (int64_t i = 0; i < R; ++i)
            std::memcpy(acc + (kvh * R + i) * NV + c, a[i], sizeof(F16));
        }
        continue;
      }
      F16 a[R][NV], p[R];
      for (int64_t i = 0; i < R; ++i) {
        p[i] = probs[(kvh * R + i) * key_groups + kg];
        for (int c = 0; c < NV; ++c) a[i][c] = acc[(kvh * R + i) * NV + c];
      }
      for (int64_t j = 0; j < n; ++j) {
        const T* vj = v_cache + offsets[key0 + j] + kvh * head_floats;
        if (j + kL1Ahead < n)
          for (int c = 0; c < NV; c += kVectorsPerLine<T>) prefetch_l1(v_cache + offsets[key0 + j + kL1Ahead] + kvh * head_floats + 16 * c);
        F16 v[NV];
        for (int c = 0; c < NV; ++c) v[c] = load16(vj + 16 * c);
        for (int64_t i = 0; i < R; ++i)
          for (int c = 0; c < NV; ++c) a[i][c] += v[c] * p[i][j];
      }
      for (int64_t i = 0; i < R; ++i)
        for (int c = 0; c < NV; ++c) acc[(kvh * R + i) * NV + c] = a[i][c];
    }
  }
  for (int64_t kvh = 0; kvh < heads; ++kvh)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t token = w.q_begin + r / group, h = kvh * group + r % group;
      T* dst = out + (token0 + token) * g.out_stride_token + h * g.out_stride_head;
      const float inv = 1.f / row_sum[kvh * R + r];
      for (int c = 0; c < NV; ++c) store16(dst + 16 * c, acc[(kvh * R + r) * NV + c] * inv);
    }
}

}  // namespace
}  // namespace bulkrun_cpu

#include "attention_dpbf16.h"  // run_item_dpbf16: every bf16 item on AVX512-BF16 dot products
#include "attention_amx.h"     // run_item_amx: every bf16 item on AMX tiles where the CPU has them

namespace bulkrun_cpu {
namespace {

// The path every bf16 item of a call takes, whatever its rows (each computes a row alike in any
// tile, so prompt chunks keep many rows per item and stay batch invariant): AMX tiles, AVX512-BF16
// dot products, or neither (decode-sized items on run_item_few, prompt chunks on run_item; fp32 too).
enum class Bf16Path { kAmx, kDotProducts, kFma };

template <int NV, typename T>
void run_all(const std::vector<WorkItem>& items, const Geometry& g, const T* q, const T* k, const T* v,
             const int32_t* tables, const int32_t* starts, const int32_t* lens, T* out, Bf16Path path,
             bool batch_invariant) {
  std::atomic<int64_t> next{0};
  const int64_t count = static_cast<int64_t>(items.size());
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
#ifdef BULKRUN_AMX
    if (path == Bf16Path::kAmx) configure_tiles();  // once per thread: a decode step has hundreds of items
#endif
    // one item claimed ahead: its keys can stream in while this one computes
    for (int64_t i = next.fetch_add(1), ahead = i < count ? next.fetch_add(1) : count; i < count;
         i = ahead, ahead = i < count ? next.fetch_add(1) : count) {
      const WorkItem& w = items[i];
      const int32_t* table = tables + w.seq * g.max_blocks;
      const int64_t token0 = starts[w.seq], new_tokens = starts[w.seq + 1] - starts[w.seq];
      const int64_t rows = (w.q_end - w.q_begin) * g.group;  // rows per kv head
      if constexpr (std::is_same_v<T, bf16>) {
#ifdef BULKRUN_AMX
        if constexpr (NV % 2 == 0)
          if (path == Bf16Path::kAmx) {
            run_item_amx<NV>(w, g, q, k, v, table, token0, new_tokens, lens[w.seq], out);
            continue;
          }
#endif
#ifdef BULKRUN_DPBF16_ATTENTION
        if (path == Bf16Path::kDotProducts) {
          if (ahead < count) {
            const int64_t key_stride = g.num_kv_heads * NV * 16;
            NextItemKeys<bf16> next_keys = first_keys_of(items[ahead], g, k, tables, starts, lens, key_stride);
            run_item_dpbf16<NV>(w, g, q, k, v, table, token0, new_tokens, lens[w.seq], out, &next_keys);
          } else {
            run_item_dpbf16<NV>(w, g, q, k, v, table, token0, new_tokens, lens[w.seq], out, nullptr);
          }
          continue;
        }
#endif
      }
      switch (rows) {
#define BULKRUN_FEW(R) \
  case R: run_item_few<NV, R, T>(w, g, q, k, v, table, token0, new_tokens, lens[w.seq], out); break;
        BULKRUN_FEW(1) BULKRUN_FEW(2) BULKRUN_FEW(3) BULKRUN_FEW(4) BULKRUN_FEW(5)
#undef BULKRUN_FEW
        default: run_item<NV, T>(w, g, q, k, v, table, token0, new_tokens, lens[w.seq], out, batch_invariant);
      }
    }
#ifdef BULKRUN_AMX
    if (path == Bf16Path::kAmx) _tile_release();
#endif
  });
}

template <typename T>
void dispatch_head_dim(const std::vector<WorkItem>& items, const Geometry& g, const at::Tensor& q,
                       const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables,
                       const int32_t* starts, const int32_t* lens, at::Tensor& out, int64_t head_dim,
                       Bf16Path path, bool batch_invariant) {
  const T* qp = static_cast<const T*>(q.data_ptr());
  const T* kp = static_cast<const T*>(k_cache.data_ptr());
  const T* vp = static_cast<const T*>(v_cache.data_ptr());
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  T* op = static_cast<T*>(out.data_ptr());
  switch (head_dim / 16) {  // head sizes 16 .. 128, and 256
#define BULKRUN_CASE(NV) \
  case NV: run_all<NV, T>(items, g, qp, kp, vp, tables, starts, lens, op, path, batch_invariant); break;
    BULKRUN_CASE(1) BULKRUN_CASE(2) BULKRUN_CASE(3) BULKRUN_CASE(4) BULKRUN_CASE(5) BULKRUN_CASE(6)
    BULKRUN_CASE(7) BULKRUN_CASE(8) BULKRUN_CASE(16)
#undef BULKRUN_CASE
    default: TORCH_CHECK(false, "head_dim ", head_dim, " is not supported by the CPU kernel");
  }
}

}  // namespace


bool attention_amx();

void paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                     const at::Tensor& seq_lens, double scale, int64_t window,
                     const c10::optional<at::Tensor>& sinks, double softcap, bool batch_invariant,
                     at::Tensor& out) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "q must be float32 or bfloat16");
  TORCH_CHECK(k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype && out.scalar_type() == dtype,
              "q, the KV cache and out must share a dtype");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [T, Hq, D] with contiguous heads");
  TORCH_CHECK(out.sizes() == q.sizes() && out.stride(2) == 1, "out must match q");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the KV cache must be contiguous");
  TORCH_CHECK(block_tables.is_contiguous() && query_start_loc.is_contiguous() && seq_lens.is_contiguous(),
              "block_tables, query_start_loc and seq_lens must be contiguous");
  const int64_t head_dim = q.size(2);
  Geometry g;
  g.num_q_heads = q.size(1);
  g.block_size = k_cache.size(1);
  g.num_kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim, "head_dim of q and the cache differ");
  TORCH_CHECK(head_dim % 16 == 0 && head_dim <= 256, "head_dim must be a multiple of 16, at most 256");
  TORCH_CHECK(g.num_q_heads % g.num_kv_heads == 0, "q heads must be a multiple of kv heads");
  g.group = g.num_q_heads / g.num_kv_heads;
  g.max_blocks = block_tables.size(1);
  g.q_stride_token = q.stride(0);
  g.q_stride_head = q.stride(1);
  g.out_stride_token = out.stride(0);
  g.out_stride_head = out.stride(1);
  g.scale = static_cast<float>(scale);
  TORCH_CHECK(window >= 0 && softcap >= 0, "window and softcap must be >= 0 (0: off)");
  g.window = window;
  g.softcap = static_cast<float>(softcap);
  g.sinks = nullptr;
  if (sinks.has_value()) {
    TORCH_CHECK(sinks->scalar_type() == at::kFloat && sinks->is_contiguous() && sinks->numel() == g.num_q_heads,
                "sinks must be a contiguous float32 tensor of one logit per query head");
    g.sinks = sinks->data_ptr<float>();
  }

  // bf16: AMX tiles where the CPU has them (head_dim a multiple of 32), else AVX512-BF16 dot
  // products; both compute a row alike in any tile. Otherwise (fp32; bf16 on neither) prompt items
  // score key by key when batch invariant, as decode items do (the same sums whatever a row's chunk,
  // its batch or a recompute).
  Bf16Path path = Bf16Path::kFma;
  if (dtype == at::kBFloat16 && head_dim % 32 == 0 && attention_amx()) path = Bf16Path::kAmx;
#ifdef BULKRUN_DPBF16_ATTENTION
  else if (dtype == at::kBFloat16) path = Bf16Path::kDotProducts;
#endif
  const int64_t tile_tokens = path == Bf16Path::kAmx ? kAmxQueryTile : kQueryTile;
  const int64_t num_seqs = seq_lens.size(0);
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  std::vector<WorkItem> items;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t n = starts[s + 1] - starts[s];
    TORCH_CHECK(n <= lens[s], "a sequence has more new tokens than context");
    const int64_t needed = (lens[s] + g.block_size - 1) / g.block_size;
    TORCH_CHECK(needed <= g.max_blocks, "block table too short");
    const int32_t* row = block_tables.data_ptr<int32_t>() + s * g.max_blocks;
    for (int64_t b = 0; b < needed; ++b)
      TORCH_CHECK(row[b] >= 0 && row[b] < k_cache.size(0), "block id ", row[b], " is outside the cache");
    for (int32_t q0 = 0; q0 < n; q0 += tile_tokens) {
      const int32_t q1 = std::min<int32_t>(n, q0 + tile_tokens);
      const int64_t keys = lens[s] - n + q1;  // a window bounds the keys the tile reads
      items.push_back({static_cast<int32_t>(s), q0, q1, int64_t(q1 - q0) * (window > 0 ? std::min<int64_t>(keys, window + q1 - q0) : keys)});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });

  if (dtype == at::kBFloat16)
    dispatch_head_dim<bf16>(items, g, q, k_cache, v_cache, block_tables, starts, lens, out, head_dim, path,
                            batch_invariant);
  else
    dispatch_head_dim<float>(items, g, q, k_cache, v_cache, block_tables, starts, lens, out, head_dim, path,
                             batch_invariant);
}

}  // namespace bulkrun_cpu

namespace bulkrun_cpu {
// Whether bf16 prompt chunks run on AMX tiles here (built for a CPU with AMX, and the OS grants it).
bool attention_amx() {
#ifdef BULKRUN_AMX
  return amx_ready();
#else
  return false;
#endif
}
}  // namespace bulkrun_cpu

TORCH_LIBRARY_FRAGMENT(bulkrun_cpu, m) { m.def("attention_amx() -> bool", &bulkrun_cpu::attention_amx); }
