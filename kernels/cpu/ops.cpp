// The CPU native ops, registered as torch.ops.bulkrun_cpu.*: paged attention (paged_attention.cpp)
// and the small fused ops around it. Each replaces several PyTorch ops that would each make a full
// pass over memory; all take float32 or bfloat16 (computing in float32) and write into tensors the
// Python wrappers allocate.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "epilogue_math.h"
#include "vec_math.h"

namespace bulkrun_cpu {

void paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                     const at::Tensor& seq_lens, double scale, int64_t window,
                     const c10::optional<at::Tensor>& sinks, double softcap, bool batch_invariant,
                     at::Tensor& out);

namespace {

constexpr int64_t kRowGrain = 16;  // rows per parallel task: small tensors stay on one thread

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16");
  TORCH_CHECK(t.dim() >= 2 && t.stride(-1) == 1, name, " must have contiguous rows");
}

// The element pointer of a float32 or bfloat16 tensor (bf16 = its bits); null for an undefined one.
template <typename T>
T* elements(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  return static_cast<T*>(t.data_ptr());
}

// f(T{}) with T = float or bf16 as t's dtype says
template <typename F>
void with_type(const at::Tensor& t, F&& f) {
  if (t.scalar_type() == at::kBFloat16) return f(bf16{});
  return f(float{});
}

// (x + residual) -> residual_out; weight * normalised(x + residual) -> out, in float32 throughout
// (each output rounded once). residual may be undefined. x/out, residual/residual_out and weight may
// each be float32 or bfloat16, so a bf16 model can keep its residual stream in float32.
// 16 columns at a time (the compiler's own vectorizing of the scalar loops ran at 8 lanes, with
// masked stores, ~5x slower); the sum of squares in 16 lanes, column j into lane j % 16, then
// lane_sum's fixed tree, then the columns past the last 16 in order: the same bits for a row
// whatever its batch.
template <typename X, typename R, typename W>
void rms_norm_typed(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, float eps,
                    at::Tensor& out, at::Tensor& residual_out) {
  const int64_t rows = x.size(0), h = x.size(1), h16 = h / 16 * 16;
  const X* xp = elements<X>(x);
  const R* rp = elements<R>(residual);
  const int64_t xs = x.stride(0), rs = rp ? residual.stride(0) : 0;
  const W* wp = elements<W>(weight);
  X* op = elements<X>(out);
  R* rop = elements<R>(residual_out);
  const int64_t os = out.stride(0), ros = residual_out.stride(0);
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> sum_row(h);  // x + residual before any rounding to R
    float* v = sum_row.data();
    for (int64_t i = begin; i < end; ++i) {
      const X* xi = xp + i * xs;
      const R* res = rp ? rp + i * rs : nullptr;
      R* ri = rop + i * ros;
      F16 squares = F16{};
      if constexpr (kF16IsTwoRegisters && std::is_same_v<X, float> && std::is_same_v<R, float>) {
        // AVX2 fp32 (its default dtype): the same sums as two 8-lane halves in registers; GCC kept
        // the F16 ones on the stack and stored them in 16-byte pieces
        F8 square_halves[2] = {};
        for (int64_t j = 0; j < h16; j += 8) {
          F8 vj = load8(xi + j);
          if (res) vj += load8(res + j);
          store8(v + j, vj);
          store8(ri + j, vj);
          square_halves[(j / 8) % 2] += vj * vj;
        }
        std::memcpy(&squares, square_halves, sizeof(F16));
      } else {
        for (int64_t j = 0; j < h16; j += 16) {
          const F16 sum = res ? load16(xi + j) + load16(res + j) : load16(xi + j);
          const F16 vj = round_to(sum, R{});
          store16(v + j, vj);
          store16_nearest(ri + j, vj);
          squares += vj * vj;
        }
      }
      float total = lane_sum(squares);
      for (int64_t j = h16; j < h; ++j) {
        v[j] = to_float(from_float<R>(res ? to_float(xi[j]) + to_float(res[j]) : to_float(xi[j])));
        ri[j] = from_float<R>(v[j]);
        total += v[j] * v[j];
      }
      const float inv = 1.f / std::sqrt(total / static_cast<float>(h) + eps);
      X* oi = op + i * os;
      store_row_nearest([&](auto&& store) {
        for (int64_t j = 0; j < h16; j += 16) store(oi + j, load16(wp + j) * (load16(v + j) * inv));
      });
      for (int64_t j = h16; j < h; ++j) oi[j] = from_float<X>(to_float(wp[j]) * (v[j] * inv));
    }
  });
}

void rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
              double eps, at::Tensor& out, at::Tensor& residual_out) {
  check_rows(x, "x");
  check_rows(out, "out");
  check_rows(residual_out, "residual_out");
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), "out must have x's dtype");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1), "weight must be contiguous, one per column");
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16, "bad weight dtype");
  const at::Tensor res = residual.has_value() ? *residual : at::Tensor();
  if (res.defined()) {
    check_rows(res, "residual");
    TORCH_CHECK(res.scalar_type() == residual_out.scalar_type(), "residual and residual_out dtypes differ");
  }
  with_type(x, [&](auto xt) {
    with_type(residual_out, [&](auto rt) {
      with_type(weight, [&](auto wt) {
        rms_norm_typed<decltype(xt), decltype(rt), decltype(wt)>(x, res, weight, static_cast<float>(eps), out,
                                                                residual_out);
      });
    });
  });
}

// out = act(gate) * up for x = [gate | up] per row (a fused gate_up projection's output), 16
// columns at a time; act (epilogue_math.h) takes a float or an F16 and computes each lane as it would the float.
template <typename Act>
void gated_activation(const at::Tensor& x, at::Tensor& out, Act act) {
  check_rows(x, "x");
  check_rows(out, "out");
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), "out must have x's dtype");
  with_type(x, [&](auto type) {
    using T = decltype(type);
    const int64_t rows = x.size(0), inter = out.size(1), inter16 = inter / 16 * 16;
    const T* xp = elements<T>(x);
    T* op = elements<T>(out);
    const int64_t xs = x.stride(0), os = out.stride(0);
    at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const T* gate = xp + i * xs;
        const T* up = gate + inter;
        T* oi = op + i * os;
        store_row_nearest([&](auto&& store) {
          for (int64_t j = 0; j < inter16; j += 16) store(oi + j, act(load16(gate + j)) * load16(up + j));
        });
        for (int64_t j = inter16; j < inter; ++j) oi[j] = from_float<T>(act(to_float(gate[j])) * to_float(up[j]));
      }
    });
  });
}

void silu_and_mul(const at::Tensor& x, at::Tensor& out) { gated_activation(x, out, Silu{}); }

void gelu_tanh_and_mul(const at::Tensor& x, at::Tensor& out) { gated_activation(x, out, GeluTanh{}); }

// Rotate-half rotary embedding: out[t, h] = rotate(x[t, h]) by cache[positions[t]] = cos | sin over
// the first 2 * half dims of each head; the `rest` dims after them pass through (partial rotary).
// out may be x itself (each element is read before it is written).
template <typename T, typename C>
void rotate(const T* x, T* out, int64_t x_head_stride, int64_t out_head_stride, int64_t heads,
            int64_t half, int64_t rest, const C* cos, const C* sin) {
  const int64_t half16 = half / 16 * 16;
  for (int64_t hd = 0; hd < heads; ++hd) {
    const T* x1 = x + hd * x_head_stride;
    const T* x2 = x1 + half;
    T* o1 = out + hd * out_head_stride;
    T* o2 = o1 + half;
    for (int64_t j = 0; j < half16; j += 16) {
      F16 r1, r2;
      rotate_half(load16(x1 + j), load16(x2 + j), load16(cos + j), load16(sin + j), r1, r2);
      store16_nearest(o1 + j, r1);
      store16_nearest(o2 + j, r2);
    }
    for (int64_t j = half16; j < half; ++j) {
      float r1, r2;
      rotate_half(to_float(x1[j]), to_float(x2[j]), to_float(cos[j]), to_float(sin[j]), r1, r2);
      o1[j] = from_float<T>(r1);
      o2[j] = from_float<T>(r2);
    }
    if (rest > 0 && o1 != x1) std::memcpy(o1 + 2 * half, x1 + 2 * half, rest * sizeof(T));
  }
}

void rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& positions,
            const at::Tensor& cos_sin_cache, at::Tensor& q_out, at::Tensor& k_out) {
  for (const at::Tensor* t : {&q, &k, static_cast<const at::Tensor*>(&q_out), static_cast<const at::Tensor*>(&k_out)}) {
    check_rows(*t, "q/k");
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "q, k and their outputs must share a dtype");
  }
  check_rows(cos_sin_cache, "cos_sin_cache");
  TORCH_CHECK(cos_sin_cache.is_contiguous(), "bad rotary cache");
  TORCH_CHECK(positions.is_contiguous() && positions.scalar_type() == at::kLong, "positions must be int64");
  const int64_t tokens = q.size(0), width = cos_sin_cache.size(1), half = width / 2;
  const int64_t rest = q.size(2) - width;
  TORCH_CHECK(width % 2 == 0 && width > 0 && rest >= 0 && k.size(2) == q.size(2),
              "the rotary cache needs an even number of columns, at most head_dim");
  const int64_t* pos = positions.data_ptr<int64_t>();
  with_type(q, [&](auto qt) {
    with_type(cos_sin_cache, [&](auto ct) {
      using T = decltype(qt);
      using C = decltype(ct);
      const C* cache = elements<C>(cos_sin_cache);
      const T* qp = elements<T>(q);
      const T* kp = elements<T>(k);
      T* qo = elements<T>(q_out);
      T* ko = elements<T>(k_out);
      at::parallel_for(0, tokens, kRowGrain, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const C* cos = cache + pos[t] * width;
          const C* sin = cos + half;
          rotate(qp + t * q.stride(0), qo + t * q_out.stride(0), q.stride(1), q_out.stride(1), q.size(1), half,
                 rest, cos, sin);
          rotate(kp + t * k.stride(0), ko + t * k_out.stride(0), k.stride(1), k_out.stride(1), k.size(1), half,
                 rest, cos, sin);
        }
      });
    });
  });
}

// k_cache.view(-1, Hk, D)[slot_mapping[t]] = k[t] (and v); slots < 0 are skipped (padding). A byte
// copy: k, v and the cache share one dtype (float32 or bfloat16).
void write_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping) {
  TORCH_CHECK(k.stride(2) == 1 && k.stride(1) == k.size(2), "k rows must be contiguous");
  TORCH_CHECK(v.stride(2) == 1 && v.stride(1) == v.size(2), "v rows must be contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the KV cache must be contiguous");
  const auto dtype = k_cache.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "the KV cache must be float32 or bfloat16");
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype && v_cache.scalar_type() == dtype,
              "k, v and the KV cache must share a dtype");
  TORCH_CHECK(slot_mapping.is_contiguous() && slot_mapping.scalar_type() == at::kLong, "slots must be int64");
  const int64_t tokens = k.size(0), row = k.size(1) * k.size(2), item = k.element_size();
  const int64_t slots = k_cache.numel() / row;
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(slot[t] < slots, "slot out of range");
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  const int64_t row_bytes = row * item, ks = k.stride(0) * item, vs = v.stride(0) * item;
  at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slot[t] < 0) continue;
      std::memcpy(kc + slot[t] * row_bytes, kp + t * ks, row_bytes);
      std::memcpy(vc + slot[t] * row_bytes, vp + t * vs, row_bytes);
    }
  });
}

}  // namespace
}  // namespace bulkrun_cpu

TORCH_LIBRARY(bulkrun_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor query_start_loc, Tensor seq_lens, float scale, int window, Tensor? sinks, float softcap, "
        "bool batch_invariant, Tensor(a!) out) -> ()");
  m.def("rms_norm(Tensor x, Tensor? residual, Tensor weight, float eps, Tensor(a!) out, "
        "Tensor(b!) residual_out) -> ()");
  m.def("silu_and_mul(Tensor x, Tensor(a!) out) -> ()");
  m.def("gelu_tanh_and_mul(Tensor x, Tensor(a!) out) -> ()");
  m.def("rotary(Tensor q, Tensor k, Tensor positions, Tensor cos_sin_cache, Tensor(a!) q_out, "
        "Tensor(b!) k_out) -> ()");
  m.def("write_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(bulkrun_cpu, CPU, m) {
  m.impl("paged_attention", &bulkrun_cpu::paged_attention);
  m.impl("rms_norm", &bulkrun_cpu::rms_norm);
  m.impl("silu_and_mul", &bulkrun_cpu::silu_and_mul);
  m.impl("gelu_tanh_and_mul", &bulkrun_cpu::gelu_tanh_and_mul);
  m.impl("rotary", &bulkrun_cpu::rotary);
  m.impl("write_kv", &bulkrun_cpu::write_kv);
}
