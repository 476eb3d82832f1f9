"""What this box can do at most, to read the engine's figures against: the bf16 dot-product peak of
one core and of all of them (a register-only vdpbf16ps loop), DRAM read bandwidth (a sum over 1 GiB,
one thread and all), and oneDNN's bf16 GEMM rate at 2048^3 (the figure the other benches divide by).

    python bench/box_ceilings.py

The two loops are C, compiled here with the native kernels' compiler ($CXX, default c++) and
-march=native; where there is no compiler, or the CPU lacks AVX512-BF16 (AVX-512 for the read
loop), that line says so and the rest still runs. Best of 5 runs each: noise only slows.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import torch
from workload import matmul_gflops

from bulkrun_kernels import cpu_build

# 12 independent accumulators: more than a dot product's latency times its issue rate, so the loop
# runs at the issue rate; the loop count comes first on the command line
PEAK = r"""
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
static double run(long n) {
  auto t0 = std::chrono::steady_clock::now();
  __asm__ volatile(
      "vpxord %%zmm0, %%zmm0, %%zmm0\n"
      "1:\n"
      "vdpbf16ps %%zmm0, %%zmm0, %%zmm1\n vdpbf16ps %%zmm0, %%zmm0, %%zmm2\n"
      "vdpbf16ps %%zmm0, %%zmm0, %%zmm3\n vdpbf16ps %%zmm0, %%zmm0, %%zmm4\n"
      "vdpbf16ps %%zmm0, %%zmm0, %%zmm5\n vdpbf16ps %%zmm0, %%zmm0, %%zmm6\n"
      "vdpbf16ps %%zmm0, %%zmm0, %%zmm7\n vdpbf16ps %%zmm0, %%zmm0, %%zmm8\n"
      "vdpbf16ps %%zmm0, %%zmm0, %%zmm9\n vdpbf16ps %%zmm0, %%zmm0, %%zmm10\n"
      "vdpbf16ps %%zmm0, %%zmm0, %%zmm11\n vdpbf16ps %%zmm0, %%zmm0, %%zmm12\n"
      "dec %0\n jnz 1b\n"
      : "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "cc");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
int main(int argc, char** argv) {
  const long n = atol(argv[1]);
  const int threads = atoi(argv[2]);
  std::vector<double> secs(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { secs[t] = run(n); });
  for (auto& th : pool) th.join();
  double slowest = 0;
  for (double s : secs) slowest = s > slowest ? s : slowest;
  printf("%f\n", threads * n * 12.0 * 64.0 / slowest / 1e9);  // 64 flops per vdpbf16ps zmm
}
"""

READ = r"""
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
int main(int argc, char** argv) {
  const size_t n = size_t(1) << 28;  // floats: 1 GiB
  const int threads = atoi(argv[1]);
  float* a = static_cast<float*>(aligned_alloc(64, n * 4));
  for (size_t i = 0; i < n; ++i) a[i] = 1.0f;
  double best = 1e9;
  std::vector<float> sums(threads);
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (size_t i = n / threads * t; i < n / threads * (t + 1); i += 64) {
          s0 = _mm512_add_ps(s0, _mm512_load_ps(a + i));
          s1 = _mm512_add_ps(s1, _mm512_load_ps(a + i + 16));
          s2 = _mm512_add_ps(s2, _mm512_load_ps(a + i + 32));
          s3 = _mm512_add_ps(s3, _mm512_load_ps(a + i + 48));
        }
        sums[t] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
      });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = s < best ? s : best;
  }
  printf("%f %f\n", n * 4.0 / best / 1e9, sums[0]);
}
"""


def build(source: str, name: str, tmp: Path) -> Path:
    src, exe = tmp / f"{name}.cpp", tmp / name
    src.write_text(source)
    cmd = [cpu_build.compiler(), "-O2", "-march=native", "-pthread", str(src), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True)
    return exe


def best_of(cmd: list[str], runs: int = 5) -> float:
    return max(float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()[0])
               for _ in range(runs))  # fmt: skip


def main() -> None:
    cores = os.cpu_count() or 1
    print(f"box: {cores} CPUs")
    if not cpu_build.compiler_available():
        print("bf16 dot-product peak and DRAM read: not measured (no C++ compiler; set CXX)")
    else:
        flags = cpu_build.cpu_flags()
        with tempfile.TemporaryDirectory() as tmp:
            if "avx512_bf16" in flags:
                peak = build(PEAK, "peak", Path(tmp))
                one = best_of([str(peak), "100000000", "1"])
                every = best_of([str(peak), "100000000", str(cores)])
                print(f"bf16 dot-product peak: {one:6.1f} GFLOP/s on one core, {every:6.1f} on {cores}")
            else:
                print("bf16 dot-product peak: not measured (no avx512_bf16 here)")
            if "avx512f" in flags:
                read = build(READ, "read", Path(tmp))
                one = best_of([str(read), "1"], runs=1)
                every = best_of([str(read), str(cores)], runs=1)
                print(f"DRAM read (1 GiB sum):  {one:6.1f} GB/s on one thread, {every:6.1f} on {cores}")
            else:
                print("DRAM read: not measured (the loop needs AVX-512)")
    gemm = matmul_gflops(n=2048, dtype=torch.bfloat16)
    print(f"oneDNN bf16 GEMM 2048^3: {gemm:6.1f} GFLOP/s (best of 15)")


if __name__ == "__main__":
    main()
