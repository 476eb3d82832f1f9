// The gated activations of a fused gate_up projection, act(gate) * up: one definition for the
// standalone ops (ops.cpp) and the GEMM that applies them to its own output (amx_gemm.cpp), so the
// two give the same bits. Each takes a float or an F16 and computes each lane as it would the float.
#pragma once

#include "vec_math.h"

namespace bulkrun_cpu {

// SwiGLU: silu(g) = g / (1 + e^-g)
struct Silu {
  template <typename V>
  V operator()(V g) const {
    return g / (1.f + vec_exp(-g));
  }
};

// GeGLU (Gemma): gelu with the tanh approximation, 0.5 g (1 + tanh(y)), y = sqrt(2/pi) (g + 0.044715 g^3),
// written as g / (1 + e^-2y): no cancellation in the negative tail (1 + tanh(y) would lose it)
struct GeluTanh {
  template <typename V>
  V operator()(V g) const {
    const V y = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    return g / (1.f + vec_exp(-2.f * y));
  }
};

}  // namespace bulkrun_cpu
