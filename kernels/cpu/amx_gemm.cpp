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
// Columns past N are zeros. Threads own column-block pairs. Two loop orders, the same bits (a C tile
// is the same tile instructions over K in order, from zero; where the K steps come in chunks, the
// fp32 tile is stored and loaded back between them, exactly):
// - fewer than kGroupedRows rows (decode steps): per pair, all rows in blocks of 32 over the whole of K;
//   each panel streams from memory once and the other row blocks reuse it from cache.
// - more rows (prompt steps): per group of pairs whose panels fit L2, per 32-row block, K in chunks
//   whose A part stays in L1 while the group's pairs walk it (per pair over the whole of K, a block's
//   A and B parts, 36 KB each at K = 576, both come from L2, and the tile loads, not the products,
//   set the rate).
//
// amx_gemm_gated: a fused gate_up projection with the gated activation applied to its own output,
// y = act(gate) * up, [M, N / 2]. Its weight is packed with the gate and up column blocks interleaved
// (gate block j, up block j, ...: cpu_gemm.interleave_gate_up), so each thread's column-block pair is
// the gate and up of the same 16 columns of y. Each is rounded to bf16 as the plain GEMM's output
// would be, then act(gate) * up as silu_and_mul / gelu_tanh_and_mul compute it from that output:
// the same bits as the two ops, without writing the [M, N] bf16 product and reading it back (at a
// prompt step's 2,048 rows, 19 MB of traffic a layer, and the activation's own pass).
//
// amx_gemm_qkv: a fused q/k/v projection with the rotate-half rotary and the KV write in its
// epilogue. Its weight has each q and k head's column blocks reordered (cpu_gemm.rotary_qkv_blocks:
// the block of dims 16j .. 16j + 15, then the one of half + 16j .., j = 0 .. half / 16 - 1), so each
// column-block pair holds the two halves the rotation mixes. Each is rounded to bf16 as the plain
// GEMM's output, rotated by the row's position as ops.cpp's rotary rotates it, and written: q to
// q_out, k straight into its row's cache slot, v copied into it. The bits of amx_gemm, rotary and
// write_kv, without the passes of the two over a step's q/k/v (~0.8 ms a layer at 2,048 rows).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_tiles.h"
#include "bf16_gemm_args.h"
#include "epilogue_math.h"
#include "vec_math.h"

namespace bulkrun_cpu {
namespace {

constexpr int64_t kCols = 16;  // columns per tile (16 fp32 of C, 16 pairs of B)
constexpr int64_t kStep = 32;  // K per tile instruction
constexpr int64_t kTileRows = 16;
constexpr int64_t kBlockFloats = 2 * kTileRows * 2 * kCols;  // one 32 x 32 fp32 C block
// From this many rows the grouped order runs. The default model's 30 layers' linears (K = 576 and
// 1536, weights cold as in an engine step; bench/linear_bench.py, AMX box): 1,024 rows 101-105
// against 119-124 ms; 512 rows even; 128 rows 23 against 18.5 ms (the grouped order reads each
// group's panels once per row block).
constexpr int64_t kGroupedRows = 768;
constexpr int64_t kGroupBytes = 1 << 20;  // a group's panels: about half of L2
constexpr int64_t kChunkSteps = 12;       // at most: 32 rows x 384 K of A, 24 KB, stay in L1

#ifdef BULKRUN_AMX_TILES
// C (32 x 32 fp32 in c, rows 128 bytes apart) += rows a0, a1 (16 each) times column blocks b0, b1
// over `steps` K steps, from zero where `first`, else from c; a second row block or column block
// only where `two_rows` / `two_cols`. The branches are per call, not per step: each row's tile
// instructions are the same.
void block(const bf16* a0, int64_t a0_stride, const bf16* a1, int64_t a1_stride, const bf16* b0, const bf16* b1,
           int64_t steps, bool two_rows, bool two_cols, bool first, float* c) {
  constexpr int64_t ld = 2 * kCols * sizeof(float);
  float* c2 = c + kTileRows * 2 * kCols;
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c, ld);
    _tile_loadd(1, c + kCols, ld);
    _tile_loadd(2, c2, ld);
    _tile_loadd(3, c2 + kCols, ld);
  }
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
  _tile_stored(0, c, ld);
  _tile_stored(1, c + kCols, ld);
  _tile_stored(2, c2, ld);
  _tile_stored(3, c2 + kCols, ld);
}
#endif

// rows x cols of the 32 x 32 fp32 block c (+ bias) -> y, rounded once to Y
template <typename Y>
void write_block(const float* c, int64_t rows, int64_t cols, const float* bias, Y* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = c + r * 2 * kCols;
    Y* dst = y + r * ldy;
    if (cols == 2 * kCols) {
      for (int h = 0; h < 2; ++h) store16(dst + 16 * h, load16(src + 16 * h) + (bias ? load16(bias + 16 * h) : F16{}));
    } else {
      for (int64_t j = 0; j < cols; ++j) dst[j] = from_float<Y>(src[j] + (bias ? bias[j] : 0.f));
    }
  }
}

// Row r of a 32 x 32 fp32 block (+ bias) as the plain GEMM's bf16 output holds it (write_block's
// rounding), in `rounded`; returns its two 16-column halves widened again, the fused ops' inputs.
inline void round_row(const float* c, int64_t r, const float* bias, bf16 (&rounded)[2 * kCols], F16& first,
                      F16& second) {
  const float* src = c + r * 2 * kCols;
  for (int h = 0; h < 2; ++h) store16(rounded + 16 * h, load16(src + 16 * h) + (bias ? load16(bias + 16 * h) : F16{}));
  first = load16(rounded);
  second = load16(rounded + kCols);
}

// The gated activation of a 32 x 32 fp32 block whose columns 0-15 are gate and 16-31 up (+ bias) ->
// 16 columns of y: act(gate) * up of the rounded halves, rounded as gated_activation (ops.cpp) rounds it.
template <typename Act>
void write_gated_block(const float* c, int64_t rows, const float* bias, bf16* y, int64_t ldy, Act act) {
  alignas(64) bf16 rounded[2 * kCols];
  for (int64_t r = 0; r < rows; ++r) {
    F16 gate, up;
    round_row(c, r, bias, rounded, gate, up);
    bf16* dst = y + r * ldy;
    store_row_nearest([&](auto&& store) { store(dst, act(gate) * up); });
  }
}

// x W^T on the tiles, block by block; finish(c, m, p) takes each finished 32 x 32 fp32 block (rows
// m .. m + 31, column-block pair p, rows 128 bytes apart) and writes it wherever its op writes.
template <typename Finish>
void gemm(const at::Tensor& x, const at::Tensor& wp, Finish finish) {
#ifdef BULKRUN_AMX_TILES
  const int64_t M = x.size(0), K = x.size(1), NB = wp.size(0), steps = K / kStep;
  const bf16* xp = static_cast<const bf16*>(x.data_ptr());
  const bf16* w = static_cast<const bf16*>(wp.data_ptr());
  const int64_t ldx = x.stride(0);
  // the last partial 16-row block, zero-padded: a tile load must not read past x (its rows do not
  // touch the others': each C row comes from its own A row)
  const int64_t full = M / kTileRows * kTileRows;
  std::vector<bf16> tail(M > full ? kTileRows * K : 0, 0);
  for (int64_t r = full; r < M; ++r) std::memcpy(&tail[(r - full) * K], xp + r * ldx, K * sizeof(bf16));
  auto rows_at = [&](int64_t m) { return m < full ? xp + m * ldx : tail.data(); };
  auto stride_at = [&](int64_t m) { return static_cast<int64_t>((m < full ? ldx : K) * sizeof(bf16)); };
  const int64_t pairs = (NB + 1) / 2, panel = steps * kTileRows * kStep;
  // C block (m, pair p) over K steps [k0, k1), then finished where k1 is the last step
  auto run_block = [&](int64_t m, int64_t p, int64_t k0, int64_t k1, float* c) {
    const int64_t nb = 2 * p;
    const bool two_rows = m + kTileRows < M;
    const int64_t m1 = two_rows ? m + kTileRows : m;
    const bf16* b0 = w + nb * panel + k0 * kTileRows * kStep;
    block(rows_at(m) + k0 * kStep, stride_at(m), rows_at(m1) + k0 * kStep, stride_at(m1), b0, b0 + panel, k1 - k0,
          two_rows, nb + 1 < NB, k0 == 0, c);
    if (k1 == steps) finish(c, m, p);
  };
  if (M < kGroupedRows || steps == 0) {  // K = 0: nothing to chunk, y = the bias
    at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
      configure_tiles();
      alignas(64) float c[kBlockFloats];
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t m = 0; m < M; m += 2 * kTileRows) run_block(m, p, 0, steps, c);
      _tile_release();
    });
    return;
  }
  const int64_t group = std::max<int64_t>(1, kGroupBytes / (2 * panel * static_cast<int64_t>(sizeof(bf16))));
  const int64_t chunks = (steps + kChunkSteps - 1) / kChunkSteps;  // of even size: K = 576 is 9 + 9
  at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
    configure_tiles();
    std::vector<float> partial(std::min(group, p1 - p0) * kBlockFloats + 16);
    float* c = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(partial.data()) + 63) & ~uintptr_t{63});
    for (int64_t g0 = p0; g0 < p1; g0 += group)
      for (int64_t m = 0; m < M; m += 2 * kTileRows)
        for (int64_t ch = 0; ch < chunks; ++ch)
          for (int64_t p = g0; p < std::min(p1, g0 + group); ++p)
            run_block(m, p, ch * steps / chunks, (ch + 1) * steps / chunks, c + (p - g0) * kBlockFloats);
    _tile_release();
  });
#else
  TORCH_CHECK(false, "amx_gemm: built without AMX");
#endif
}

// y = x W^T (+ bias), rounded once to Y
template <typename Y>
void plain_gemm(const at::Tensor& x, const at::Tensor& wp, const float* bias, at::Tensor& y) {
  const int64_t M = x.size(0), N = y.size(1), ldy = y.stride(0);
  Y* yp = static_cast<Y*>(y.data_ptr());
  gemm(x, wp, [&](const float* c, int64_t m, int64_t p) {
    const int64_t n0 = 2 * p * kCols;
    write_block(c, std::min(2 * kTileRows, M - m), std::min(2 * kCols, N - n0), bias ? bias + n0 : nullptr,
                yp + m * ldy + n0, ldy);
  });
}

void amx_gemm(const at::Tensor& x, const at::Tensor& wp, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  const float* b = check_bf16_gemm_args("amx_gemm", x, wp, bias, y);
#ifdef BULKRUN_AMX_TILES
  // a tile instruction before the OS grants the tile state kills the process (SIGILL)
  TORCH_CHECK(amx_ready(), "amx_gemm: AMX is off here (BULKRUN_CPU_AMX=0, or the OS does not grant it)");
#endif
  if (y.scalar_type() == at::kBFloat16)
    plain_gemm<bf16>(x, wp, b, y);
  else
    plain_gemm<float>(x, wp, b, y);
}

// y [M, N/2] = act(gate) * up of x times the interleaved gate/up weight wp (2 * N/2 / 16 column blocks)
void amx_gemm_gated(const at::Tensor& x, const at::Tensor& wp, const c10::optional<at::Tensor>& bias,
                    c10::string_view activation, at::Tensor& y) {
  TORCH_CHECK(activation == "silu" || activation == "gelu_tanh", "amx_gemm_gated: activation is silu or gelu_tanh");
  TORCH_CHECK(y.scalar_type() == at::kBFloat16 && y.dim() == 2, "amx_gemm_gated: y must be bfloat16 [M, N / 2]");
  TORCH_CHECK(wp.dim() == 4 && wp.size(0) == 2 * (y.size(1) / kCols) && y.size(1) % kCols == 0,
              "amx_gemm_gated: y has ", y.size(1), " columns: the weight must be twice as many, in whole blocks of 16");
  TORCH_CHECK(y.size(0) == x.size(0) && y.stride(1) == 1, "amx_gemm_gated: y must be [M, N / 2] with contiguous rows");
  const float* b = check_bf16_gemm_inputs("amx_gemm_gated", x, wp, bias, wp.size(0) * kCols);
#ifdef BULKRUN_AMX_TILES
  TORCH_CHECK(amx_ready(), "amx_gemm_gated: AMX is off here (BULKRUN_CPU_AMX=0, or the OS does not grant it)");
#endif
  const int64_t M = x.size(0), ldy = y.stride(0);
  bf16* yp = static_cast<bf16*>(y.data_ptr());
  auto run = [&](auto act) {
    gemm(x, wp, [&](const float* c, int64_t m, int64_t p) {
      write_gated_block(c, std::min(2 * kTileRows, M - m), b ? b + 2 * p * kCols : nullptr, yp + m * ldy + p * kCols,
                        ldy, act);
    });
  };
  if (activation == "silu")
    run(Silu{});
  else
    run(GeluTanh{});
}

// q_out [M, H, D] and k / v into the caches [*, Hk * D] at slot_mapping's rows (< 0: not written)
void amx_gemm_qkv(const at::Tensor& x, const at::Tensor& wp, const c10::optional<at::Tensor>& bias, int64_t num_heads,
                  int64_t num_kv_heads, int64_t head_dim, const at::Tensor& positions, const at::Tensor& cos_sin_cache,
                  const at::Tensor& slot_mapping, at::Tensor& q_out, at::Tensor& k_cache, at::Tensor& v_cache) {
  const int64_t M = x.size(0), H = num_heads, Hk = num_kv_heads, D = head_dim, half = D / 2;
  TORCH_CHECK(H > 0 && Hk > 0 && D > 0 && D % (2 * kCols) == 0, "amx_gemm_qkv: head_dim must be a multiple of 32");
  const float* b = check_bf16_gemm_inputs("amx_gemm_qkv", x, wp, bias, (H + 2 * Hk) * D);
  TORCH_CHECK(wp.size(0) * kCols == (H + 2 * Hk) * D, "amx_gemm_qkv: the weight must be q | k | v heads");
  TORCH_CHECK(cos_sin_cache.scalar_type() == at::kFloat && cos_sin_cache.is_contiguous() && cos_sin_cache.dim() == 2 &&
                  cos_sin_cache.size(1) == D,
              "amx_gemm_qkv: the rotary cache must be float32 [positions, head_dim] (the rotation over the whole head)");
  for (const at::Tensor* t : {&positions, &slot_mapping})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->numel() == M,
                "amx_gemm_qkv: positions and slots must be int64, one per row");
  TORCH_CHECK(q_out.scalar_type() == at::kBFloat16 && q_out.is_contiguous() && q_out.numel() == M * H * D,
              "amx_gemm_qkv: q_out must be contiguous bf16 [M, H, D]");
  for (const at::Tensor* t : {&k_cache, &v_cache})
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->numel() % (Hk * D) == 0,
                "amx_gemm_qkv: the KV cache must be contiguous bf16 rows of num_kv_heads * head_dim");
  TORCH_CHECK(k_cache.numel() == v_cache.numel(), "amx_gemm_qkv: the K and V caches differ in size");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  const int64_t slots = k_cache.numel() / (Hk * D), positions_held = cos_sin_cache.size(0);
  for (int64_t t = 0; t < M; ++t) {
    TORCH_CHECK(slot[t] < slots, "slot out of range");
    TORCH_CHECK(pos[t] >= 0 && pos[t] < positions_held, "position out of the rotary cache");
  }
#ifdef BULKRUN_AMX_TILES
  TORCH_CHECK(amx_ready(), "amx_gemm_qkv: AMX is off here (BULKRUN_CPU_AMX=0, or the OS does not grant it)");
#endif
  const float* table = cos_sin_cache.data_ptr<float>();
  bf16* q = static_cast<bf16*>(q_out.data_ptr());
  bf16* kc = static_cast<bf16*>(k_cache.data_ptr());
  bf16* vc = static_cast<bf16*>(v_cache.data_ptr());
  const int64_t per_head = half / kCols, q_pairs = H * per_head, k_pairs = Hk * per_head;
  gemm(x, wp, [&](const float* c, int64_t m, int64_t p) {
    const float* bp = b ? b + 2 * p * kCols : nullptr;
    const int64_t rows = std::min(2 * kTileRows, M - m);
    alignas(64) bf16 rounded[2 * kCols];
    F16 first, second;
    if (p >= q_pairs + k_pairs) {  // v: 32 columns of each row's cache slot
      const int64_t col = (p - q_pairs - k_pairs) * 2 * kCols;
      for (int64_t r = 0; r < rows; ++r) {
        if (slot[m + r] < 0) continue;  // a padding row's k and v go nowhere
        round_row(c, r, bp, rounded, first, second);
        std::memcpy(vc + slot[m + r] * Hk * D + col, rounded, sizeof(rounded));
      }
      return;
    }
    const bool is_q = p < q_pairs;
    const int64_t pair = is_q ? p : p - q_pairs, head = pair / per_head, j = kCols * (pair % per_head);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = m + r;
      if (!is_q && slot[t] < 0) continue;
      round_row(c, r, bp, rounded, first, second);
      bf16* dst = is_q ? q + (t * H + head) * D : kc + (slot[t] * Hk + head) * D;
      const float* cos = table + pos[t] * D;
      F16 r1, r2;
      rotate_half(first, second, load16(cos + j), load16(cos + half + j), r1, r2);
      store16_nearest(dst + j, r1);
      store16_nearest(dst + half + j, r2);
    }
  });
}

bool amx_gemm_available() {
#ifdef BULKRUN_AMX_TILES
  return amx_ready();
#else
  return false;
#endif
}

}  // namespace
}  // namespace bulkrun_cpu

TORCH_LIBRARY_FRAGMENT(bulkrun_cpu, m) {
  m.def("amx_gemm(Tensor x, Tensor wp, Tensor? bias, Tensor(a!) y) -> ()");
  m.def("amx_gemm_available() -> bool", &bulkrun_cpu::amx_gemm_available);
  m.def("amx_gemm_gated(Tensor x, Tensor wp, Tensor? bias, str activation, Tensor(a!) y) -> ()");
  m.def("amx_gemm_qkv(Tensor x, Tensor wp, Tensor? bias, int num_heads, int num_kv_heads, int head_dim, "
        "Tensor positions, Tensor cos_sin_cache, Tensor slot_mapping, Tensor(a!) q_out, Tensor(b!) k_cache, "
        "Tensor(c!) v_cache) -> ()");
}

TORCH_LIBRARY_IMPL(bulkrun_cpu, CPU, m) {
  m.impl("amx_gemm", &bulkrun_cpu::amx_gemm);
  m.impl("amx_gemm_gated", &bulkrun_cpu::amx_gemm_gated);
  m.impl("amx_gemm_qkv", &bulkrun_cpu::amx_gemm_qkv);
}
