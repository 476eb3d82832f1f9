// The argument checks amx_gemm, amx_gemm_gated and dpbf16_gemm share (one weight layout, one
// contract): x [M, K] bf16 with contiguous rows, wp [ceil(N/16), K/32, 16, 32] bf16, an optional fp32
// bias padded to the column blocks, y [M, N] bf16 or fp32 (amx_gemm_gated checks its own y).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace bulkrun_cpu {

// x, wp and bias for a product of N columns; returns the bias pointer (null without one)
inline const float* check_bf16_gemm_inputs(const char* op, const at::Tensor& x, const at::Tensor& wp,
                                           const c10::optional<at::Tensor>& bias, int64_t N) {
  constexpr int64_t kCols = 16, kStep = 32;
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && wp.scalar_type() == at::kBFloat16, op, " takes bfloat16");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [M, K] with contiguous rows");
  TORCH_CHECK(wp.dim() == 4 && wp.size(2) == kCols && wp.size(3) == kStep && wp.is_contiguous(),
              "wp must be [NB, K/32, 16, 32], contiguous");
  const int64_t K = x.size(1);
  TORCH_CHECK(K % kStep == 0 && wp.size(1) * kStep == K, "x has ", K, " columns, the weight ", wp.size(1) * kStep);
  TORCH_CHECK(N <= wp.size(0) * kCols && N > (wp.size(0) - 1) * kCols, "y has ", N, " columns, the weight ",
              wp.size(0), " blocks of 16");
  if (!(bias.has_value() && bias->defined())) return nullptr;
  TORCH_CHECK(bias->is_contiguous() && bias->scalar_type() == at::kFloat && bias->numel() == wp.size(0) * kCols,
              "bias must be float32 padded to the column blocks");
  return bias->data_ptr<float>();
}

inline const float* check_bf16_gemm_args(const char* op, const at::Tensor& x, const at::Tensor& wp,
                                         const c10::optional<at::Tensor>& bias, const at::Tensor& y) {
  TORCH_CHECK(y.scalar_type() == at::kBFloat16 || y.scalar_type() == at::kFloat, "y must be bfloat16 or float32");
  TORCH_CHECK(y.dim() == 2 && y.size(0) == x.size(0) && y.stride(1) == 1, "y must be [M, N] with contiguous rows");
  return check_bf16_gemm_inputs(op, x, wp, bias, y.size(1));
}

}  // namespace bulkrun_cpu
