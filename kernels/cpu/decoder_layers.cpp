// Consecutive Llama-style decoder layers in one call, registered as torch.ops.bulkrun_cpu.decoder_layers:
// per layer add-and-norm, the fused q/k/v projection, rotary and the KV write (one amx_gemm_qkv where
// the qkv weights are packed for it: qkv_rotary), paged attention, o, add-and-norm, the fused gate/up
// projection and the gated activation (one amx_gemm_gated where the gate_up weights are packed for
// it: gate_up_gated), and down, each the very op the
// Python layer calls (looked up in the dispatcher once), on the same inputs in the same order, so
// the bits are the Python path's.
//
// Why: a decode step of a small model spends ~90 us a layer in Python between its ~11 ops (module
// calls, the wrappers' checks, allocations), about 3 ms a step for 30 layers, as long as a fifth of
// the step's compute; here that is a C++ loop. The caller (bulkrun/model/layer_stack.py) sends only
// layers that are exactly this recipe (no q/k norms, window, soft-cap, sinks; every linear on the
// fixed-order bf16 GEMM).

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string_view>
#include <tuple>

namespace bulkrun_cpu {
namespace {

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using Optional = c10::optional<at::Tensor>;
using GemmOp = void(const at::Tensor&, const at::Tensor&, const Optional&, at::Tensor&);
using NormOp = void(const at::Tensor&, const Optional&, const at::Tensor&, double, at::Tensor&, at::Tensor&);
using RotaryOp = void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                      at::Tensor&);
using WriteKvOp = void(const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, const at::Tensor&);
using AttentionOp = void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const at::Tensor&, double, int64_t, const Optional&, double, bool,
                         at::Tensor&);
using ActivationOp = void(const at::Tensor&, at::Tensor&);
using GatedGemmOp = void(const at::Tensor&, const at::Tensor&, const Optional&, c10::string_view, at::Tensor&);
using QkvGemmOp = void(const at::Tensor&, const at::Tensor&, const Optional&, int64_t, int64_t, int64_t, const at::Tensor&,
                       const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&);

// x, residual: the stream entering the first layer (x: the previous layer's output, overwritten);
// per layer l: norms[2l], norms[2l+1] (input, post-attention), weights / biases[4l + 0..3] (qkv, o,
// gate_up, down, packed for `gemm`; qkv_rotary: qkv's for amx_gemm_qkv; gate_up_gated: gate_up's for
// amx_gemm_gated), out_features[0..3] (the same for every layer), its caches.
// Returns the last layer's output and the residual stream.
std::tuple<at::Tensor, at::Tensor> decoder_layers(
    at::Tensor& x, at::Tensor& residual, at::TensorList norms, at::TensorList weights,
    const c10::List<Optional>& biases, at::IntArrayRef out_features, at::TensorList k_caches,
    at::TensorList v_caches, c10::string_view gemm_kernel, c10::string_view activation, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_dim, double eps, double scale, const at::Tensor& positions,
    const at::Tensor& cos_sin_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
    const at::Tensor& query_start_loc, const at::Tensor& seq_lens, bool batch_invariant, bool qkv_rotary, bool gate_up_gated) {
  static const auto amx = find_op<GemmOp>("bulkrun_cpu::amx_gemm");
  static const auto dpbf16 = find_op<GemmOp>("bulkrun_cpu::dpbf16_gemm");
  static const auto rms_norm = find_op<NormOp>("bulkrun_cpu::rms_norm");
  static const auto rotary = find_op<RotaryOp>("bulkrun_cpu::rotary");
  static const auto write_kv = find_op<WriteKvOp>("bulkrun_cpu::write_kv");
  static const auto attention = find_op<AttentionOp>("bulkrun_cpu::paged_attention");
  static const auto silu = find_op<ActivationOp>("bulkrun_cpu::silu_and_mul");
  static const auto gelu_tanh = find_op<ActivationOp>("bulkrun_cpu::gelu_tanh_and_mul");
  static const auto amx_gated = find_op<GatedGemmOp>("bulkrun_cpu::amx_gemm_gated");
  static const auto amx_qkv = find_op<QkvGemmOp>("bulkrun_cpu::amx_gemm_qkv");

  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(v_caches.size() == k_caches.size() && norms.size() == 2 * k_caches.size() &&
                  weights.size() == 4 * k_caches.size() && biases.size() == 4 * k_caches.size(),
              "decoder_layers: per layer 2 norms, 4 weights, 4 biases and both caches");
  TORCH_CHECK(out_features.size() == 4, "decoder_layers: out_features of qkv, o, gate_up, down");
  TORCH_CHECK(gemm_kernel == "amx" || gemm_kernel == "dpbf16", "decoder_layers: gemm is amx or dpbf16");
  TORCH_CHECK(activation == "silu" || activation == "gelu_tanh", "decoder_layers: activation is silu or gelu_tanh");
  TORCH_CHECK((!gate_up_gated && !qkv_rotary) || gemm_kernel == "amx",
              "decoder_layers: gated gate_up and rotary qkv weights run on amx");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "decoder_layers: x must be contiguous bf16 [T, hidden]");
  const auto& gemm = gemm_kernel == "amx" ? amx : dpbf16;
  const auto& act = activation == "silu" ? silu : gelu_tanh;
  const int64_t tokens = x.size(0), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  TORCH_CHECK(out_features[0] == q_size + 2 * kv_size && out_features[2] % 2 == 0,
              "decoder_layers: qkv must be q | k | v and gate_up even");
  const auto bf16 = x.options();
  auto linear = [&](const at::Tensor& input, int64_t i, int64_t which) {
    at::Tensor y = at::empty({tokens, out_features[which]}, bf16);
    gemm.call(input, weights[i], biases.get(i), y);
    return y;
  };
  at::Tensor h = x;
  for (int64_t l = 0; l < layers; ++l) {
    rms_norm.call(h, residual, norms[2 * l], eps, h, residual);  // h = norm(h + residual), in place
    at::Tensor k_cache = k_caches[l], v_cache = v_caches[l], q;
    if (qkv_rotary) {
      q = at::empty({tokens, num_heads, head_dim}, bf16);
      amx_qkv.call(h, weights[4 * l], biases.get(4 * l), num_heads, num_kv_heads, head_dim, positions, cos_sin_cache,
                   slot_mapping, q, k_cache, v_cache);
    } else {
      at::Tensor qkv = linear(h, 4 * l, 0);
      q = qkv.narrow(1, 0, q_size).view({tokens, num_heads, head_dim});
      at::Tensor k = qkv.narrow(1, q_size, kv_size).view({tokens, num_kv_heads, head_dim});
      at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, num_kv_heads, head_dim});
      rotary.call(q, k, positions, cos_sin_cache, q, k);
      write_kv.call(k, v, k_cache, v_cache, slot_mapping);
    }
    at::Tensor attended = at::empty({tokens, num_heads, head_dim}, bf16);
    attention.call(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, 0, c10::nullopt, 0.0,
                   batch_invariant, attended);
    at::Tensor o = linear(attended.view({tokens, q_size}), 4 * l + 1, 1);
    rms_norm.call(o, residual, norms[2 * l + 1], eps, o, residual);
    at::Tensor gated = at::empty({tokens, out_features[2] / 2}, bf16);
    if (gate_up_gated) {
      amx_gated.call(o, weights[4 * l + 2], biases.get(4 * l + 2), activation, gated);
    } else {
      at::Tensor gate_up = linear(o, 4 * l + 2, 2);
      act.call(gate_up, gated);
    }
    h = linear(gated, 4 * l + 3, 3);
  }
  return {h, residual};
}

}  // namespace
}  // namespace bulkrun_cpu

TORCH_LIBRARY_FRAGMENT(bulkrun_cpu, m) {
  m.def("decoder_layers(Tensor(a!) x, Tensor(b!) residual, Tensor[] norms, Tensor[] weights, Tensor?[] biases, "
        "int[] out_features, Tensor[] k_caches, Tensor[] v_caches, str gemm, str activation, int num_heads, "
        "int num_kv_heads, int head_dim, float eps, float scale, Tensor positions, Tensor cos_sin_cache, "
        "Tensor slot_mapping, Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, bool batch_invariant, "
        "bool qkv_rotary, bool gate_up_gated) "
        "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(bulkrun_cpu, CPU, m) { m.impl("decoder_layers", &bulkrun_cpu::decoder_layers); }
