// The CPU native ops, registered as torch.ops.bulkrun_cpu.*: paged attention (paged_attention.cpp)
// and the small fused ops around it. Each replaces several PyTorch ops that would each make a full
// pass over memory; all take fp32 and write into tensors the Python wrappers allocate.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>

#include "vec_math.h"

namespace bulkrun_cpu {

void paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                     const at::Tensor& seq_lens, double scale, at::Tensor& out);

namespace {

constexpr int64_t kRowGrain = 16;  // rows per parallel task: small tensors stay on one thread

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32");
  TORCH_CHECK(t.dim() >= 2 && t.stride(-1) == 1, name, " must have contiguous rows");
}

// (x + residual) -> residual_out; weight * normalised(x + residual) -> out. residual may be undefined.
void rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
              double eps, at::Tensor& out, at::Tensor& residual_out) {
  check_rows(x, "x");
  check_rows(out, "out");
  check_rows(residual_out, "residual_out");
  TORCH_CHECK(weight.is_contiguous() && weight.scalar_type() == at::kFloat, "weight must be float32");
  const int64_t rows = x.size(0), h = x.size(1);
  const bool add = residual.has_value() && residual->defined();
  const float* xp = x.data_ptr<float>();
  const float* rp = add ? residual->data_ptr<float>() : nullptr;
  const int64_t xs = x.stride(0), rs = add ? residual->stride(0) : 0;
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float* rop = residual_out.data_ptr<float>();
  const int64_t os = out.stride(0), ros = residual_out.stride(0);
  const float epsf = static_cast<float>(eps);
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xi = xp + i * xs;
      float* ri = rop + i * ros;
      float sum = 0.f;
      if (add) {
        const float* res = rp + i * rs;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < h; ++j) {
          const float v = xi[j] + res[j];
          ri[j] = v;
          sum += v * v;
        }
      } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < h; ++j) {
          ri[j] = xi[j];
          sum += xi[j] * xi[j];
        }
      }
      const float inv = 1.f / std::sqrt(sum / static_cast<float>(h) + epsf);
      float* oi = op + i * os;
#pragma omp simd
      for (int64_t j = 0; j < h; ++j) oi[j] = wp[j] * (ri[j] * inv);
    }
  });
}

// x [T, 2I] = gate | up  ->  out [T, I] = silu(gate) * up
void silu_and_mul(const at::Tensor& x, at::Tensor& out) {
  check_rows(x, "x");
  check_rows(out, "out");
  const int64_t rows = x.size(0), inter = out.size(1);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xs = x.stride(0), os = out.stride(0);
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* gate = xp + i * xs;
      const float* up = gate + inter;
      float* oi = op + i * os;
#pragma omp simd
      for (int64_t j = 0; j < inter; ++j) oi[j] = gate[j] / (1.f + vec_exp(-gate[j])) * up[j];
    }
  });
}

// Rotate-half rotary embedding: out[t, h] = rotate(x[t, h]) by cache[positions[t]] = cos | sin.
// out may be x itself (each element is read before it is written).
void rotate(const float* x, float* out, int64_t x_head_stride, int64_t out_head_stride, int64_t heads,
            int64_t half, const float* cos, const float* sin) {
  for (int64_t hd = 0; hd < heads; ++hd) {
    const float* x1 = x + hd * x_head_stride;
    const float* x2 = x1 + half;
    float* o1 = out + hd * out_head_stride;
    float* o2 = o1 + half;
#pragma omp simd
    for (int64_t j = 0; j < half; ++j) {
      const float a = x1[j], b = x2[j];
      o1[j] = a * cos[j] - b * sin[j];
      o2[j] = b * cos[j] + a * sin[j];
    }
  }
}

void rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& positions,
            const at::Tensor& cos_sin_cache, at::Tensor& q_out, at::Tensor& k_out) {
  for (const at::Tensor* t : {&q, &k, static_cast<const at::Tensor*>(&q_out), static_cast<const at::Tensor*>(&k_out)})
    check_rows(*t, "q/k");
  TORCH_CHECK(cos_sin_cache.is_contiguous() && cos_sin_cache.scalar_type() == at::kFloat, "bad rotary cache");
  TORCH_CHECK(positions.is_contiguous() && positions.scalar_type() == at::kLong, "positions must be int64");
  const int64_t tokens = q.size(0), half = q.size(2) / 2, width = cos_sin_cache.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float* cache = cos_sin_cache.data_ptr<float>();
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  float* qo = q_out.data_ptr<float>();
  float* ko = k_out.data_ptr<float>();
  at::parallel_for(0, tokens, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = cache + pos[t] * width;
      const float* sin = cos + half;
      rotate(qp + t * q.stride(0), qo + t * q_out.stride(0), q.stride(1), q_out.stride(1), q.size(1), half, cos, sin);
      rotate(kp + t * k.stride(0), ko + t * k_out.stride(0), k.stride(1), k_out.stride(1), k.size(1), half, cos, sin);
    }
  });
}

// k_cache.view(-1, Hk, D)[slot_mapping[t]] = k[t] (and v); slots < 0 are skipped (padding).
void write_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping) {
  TORCH_CHECK(k.stride(2) == 1 && k.stride(1) == k.size(2), "k rows must be contiguous");
  TORCH_CHECK(v.stride(2) == 1 && v.stride(1) == v.size(2), "v rows must be contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the KV cache must be contiguous");
  TORCH_CHECK(k.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(slot_mapping.is_contiguous() && slot_mapping.scalar_type() == at::kLong, "slots must be int64");
  const int64_t tokens = k.size(0), row = k.size(1) * k.size(2);
  const int64_t slots = k_cache.numel() / row;
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(slot[t] < slots, "slot out of range");
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slot[t] < 0) continue;
      std::memcpy(kc + slot[t] * row, kp + t * k.stride(0), row * sizeof(float));
      std::memcpy(vc + slot[t] * row, vp + t * v.stride(0), row * sizeof(float));
    }
  });
}

}  // namespace
}  // namespace bulkrun_cpu

TORCH_LIBRARY(bulkrun_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor query_start_loc, Tensor seq_lens, float scale, Tensor(a!) out) -> ()");
  m.def("rms_norm(Tensor x, Tensor? residual, Tensor weight, float eps, Tensor(a!) out, "
        "Tensor(b!) residual_out) -> ()");
  m.def("silu_and_mul(Tensor x, Tensor(a!) out) -> ()");
  m.def("rotary(Tensor q, Tensor k, Tensor positions, Tensor cos_sin_cache, Tensor(a!) q_out, "
        "Tensor(b!) k_out) -> ()");
  m.def("write_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(bulkrun_cpu, CPU, m) {
  m.impl("paged_attention", &bulkrun_cpu::paged_attention);
  m.impl("rms_norm", &bulkrun_cpu::rms_norm);
  m.impl("silu_and_mul", &bulkrun_cpu::silu_and_mul);
  m.impl("rotary", &bulkrun_cpu::rotary);
  m.impl("write_kv", &bulkrun_cpu::write_kv);
}
