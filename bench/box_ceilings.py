"""What this box can do at most, to read the engine's figures against: the bf16 and int8 dot-product
peaks of one core and of all of them (register-only vdpbf16ps and vpdpbusd loops: the bf16 linears
and the LM head's int8 screen), DRAM read bandwidth (a sum over 1 GiB, one thread and all), and
oneDNN's bf16 GEMM rate at 2048^3 (the figure the other benches divide by).

    python bench/box_ceilings.py

The loops are C, compiled here with the native kernels' compiler ($CXX, default c++) and
-march=native; where there is no compiler, or the CPU lacks AVX512-BF16 (AVX512-VNNI too for the
int8 loop, AVX-512 for the read loop), that line says so and the rest still runs. Best of 5 runs
each: noise only slows.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import torch
from workload import matmul_gflops

from bulkrun_kernels import cpu_build

# 24 independent accumulators: more than a dot product's latency times its issue rate (Zen 5:
# ~6 cycles x 2 a cycle; 12 read 5-10% under it), so the loop runs at the issue rate. argv: loop
# count, threads, and bf16 (vdpbf16ps: 32 products an instruction) or int8 (vpdpbusd: 64 byte
# products). Prints GOP/s, two ops a product.
PEAK = r"""
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
static double run(long n, bool int8) {
  auto t0 = std::chrono::steady_clock::now();
  if (int8)
    __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n1:\n" INT8_LOOP "dec %0\n jnz 1b\n"
                     : "+r"(n)::CLOBBERS, "cc");
  else
    __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n1:\n" BF16_LOOP "dec %0\n jnz 1b\n"
                     : "+r"(n)::CLOBBERS, "cc");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
int main(int argc, char** argv) {
  const long n = atol(argv[1]);
  const int threads = atoi(argv[2]);
  const bool int8 = strcmp(argv[3], "int8") == 0;
  std::vector<double> secs(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { secs[t] = run(n, int8); });
  for (auto& th : pool) th.join();
  double slowest = 0;
  for (double s : secs) slowest = s > slowest ? s : slowest;
  printf("%f\n", threads * n * 24.0 * (int8 ? 128.0 : 64.0) / slowest / 1e9);
}
"""
_DOTS = {"BF16_LOOP": "vdpbf16ps", "INT8_LOOP": "vpdpbusd"}
PEAK = (
    "".join(
        f"#define {name} " + " ".join(f'"{insn} %%zmm0, %%zmm0, %%zmm{i}\\n"' for i in range(1, 25)) + "\n"
        for name, insn in _DOTS.items()
    )
    + "#define CLOBBERS "
    + ", ".join(f'"xmm{i}"' for i in range(25))
    + "\n"
    + PEAK
)

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
            peak = build(PEAK, "peak", Path(tmp)) if "avx512_bf16" in flags else None
            for kind, flag, what in (("bf16", "avx512_bf16", "GFLOP/s"), ("int8", "avx512_vnni", "GOP/s ")):
                if peak is None or flag not in flags:
                    print(f"{kind} dot-product peak: not measured (no {flag} here)")
                    continue
                one = best_of([str(peak), "100000000", "1", kind])
                every = best_of([str(peak), "100000000", str(cores), kind])
                print(f"{kind} dot-product peak: {one:6.1f} {what} on one core, {every:6.1f} on {cores}")
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
