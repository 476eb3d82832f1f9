// The element-wise math both the standalone ops (ops.cpp) and the GEMMs that apply it to their own
// output (amx_gemm.cpp) compute: one definition, so the two give the same bits. Each takes a float
// or an F16 and computes each lane as it would the float.
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

// Rotate-half rotary of one pair of lanes (x1 from a head's first half, x2 the same dims of its
// second) by cos / sin: (x1 c - x2 s, x2 c + x1 s)
template <typename V>
inline void rotate_half(V x1, V x2, V c, V s, V& o1, V& o2) {
  o1 = x1 * c - x2 * s;
  o2 = x2 * c + x1 * s;
}

}  // namespace bulkrun_cpu
