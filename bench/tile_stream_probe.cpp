// How fast two cores stream weights from memory the way the decode-order AMX GEMM (amx_gemm.cpp) reads
// them, against plain vector loads, and whether a buffer of a step's weight size stays in the
// last-level cache.
//
//   g++ -O2 -march=native -fopenmp bench/tile_stream_probe.cpp -o /tmp/tile_stream_probe
//   /tmp/tile_stream_probe [threads=2]
//
// Prints GB/s (all threads, mean of passes 2-4 over 1 GiB): vector loads; 1 KB tile loads each
// feeding a tile product; the same staged through an L1 buffer by vector loads; two streams 18 KB
// apart (a column-block pair's panels at K = 576); amx_gemm's decode order at 48 rows (rows 0-31
// against the pair, then rows 32-47 against it from L2); three row blocks against one column block;
// the decode order with the next pair's panels prefetched into L2 during the second pass. Then
// vector loads over buffers of 16 MB to 1 GB read again and again (a size that stays in cache reads
// faster than DRAM).

#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
  asm volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

constexpr size_t kPanel = 18 * 1024;

// one pass of `mode` over [lo, hi) of buf, PF: the decode order's prefetch; returns something the
// compiler cannot drop
template <bool PF>
float pass_t(int mode, const char* buf, size_t lo, size_t hi, const char* a) {
  alignas(64) char stage[2048];
  alignas(64) float c[256];
  __m512i acc = _mm512_setzero_si512();
  _tile_zero(0);
  _tile_zero(1);
  _tile_loadd(4, a, 64);
  if (mode == 0) {
    for (size_t i = lo; i < hi; i += 256)
      for (int l = 0; l < 4; ++l) acc = _mm512_add_epi32(acc, _mm512_load_si512(buf + i + 64 * l));
  } else if (mode == 1) {
    for (size_t i = lo; i < hi; i += 1024) {
      _tile_loadd(5, buf + i, 64);
      _tile_dpbf16ps(0, 4, 5);
    }
  } else if (mode == 2) {
    for (size_t i = lo; i < hi; i += 1024) {
      for (int l = 0; l < 16; ++l) _mm512_store_si512(stage + 64 * l, _mm512_load_si512(buf + i + 64 * l));
      _tile_loadd(5, stage, 64);
      _tile_dpbf16ps(0, 4, 5);
    }
  } else if (mode == 4) {  // amx_gemm's decode order at M = 48: rows 0-31, then rows 32-47 from L2
    for (size_t p = lo; p + 2 * kPanel <= hi; p += 2 * kPanel) {
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (size_t s = 0; s < kPanel; s += 1024) {
        _tile_loadd(4, a + (s & 1023), 64);
        _tile_loadd(6, buf + p + s, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, buf + p + kPanel + s, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a + (s & 1023), 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c, 64); _tile_stored(1, c, 64); _tile_stored(2, c, 64); _tile_stored(3, c, 64);
      _tile_zero(0); _tile_zero(1);
      for (size_t s = 0; s < kPanel; s += 1024) {
        if (PF) for (int l = 0; l < 32; ++l) _mm_prefetch(buf + p + 2 * kPanel + 2 * s + 64 * l, _MM_HINT_T1);
        _tile_loadd(4, a + (s & 1023), 64);
        _tile_loadd(6, buf + p + s, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, buf + p + kPanel + s, 64);
        _tile_dpbf16ps(1, 4, 7);
      }
      _tile_stored(0, c, 64); _tile_stored(1, c, 64);
    }
  } else if (mode == 5) {  // three row blocks x one column block: each B tile once, three products
    for (size_t p = lo; p + kPanel <= hi; p += kPanel) {
      _tile_zero(0); _tile_zero(1); _tile_zero(2);
      for (size_t s = 0; s < kPanel; s += 1024) {
        _tile_loadd(7, buf + p + s, 64);
        _tile_loadd(4, a + (s & 1023), 64);
        _tile_dpbf16ps(0, 4, 7);
        _tile_loadd(5, a + (s & 1023), 64);
        _tile_dpbf16ps(1, 5, 7);
        _tile_loadd(6, a + (s & 1023), 64);
        _tile_dpbf16ps(2, 6, 7);
      }
      _tile_stored(0, c, 64); _tile_stored(1, c, 64); _tile_stored(2, c, 64);
    }
  } else {
    for (size_t p = lo; p + 2 * kPanel <= hi; p += 2 * kPanel)
      for (size_t s = 0; s < kPanel; s += 1024) {
        _tile_loadd(5, buf + p + s, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, buf + p + kPanel + s, 64);
        _tile_dpbf16ps(1, 4, 6);
      }
  }
  _tile_stored(0, c, 64);
  return c[0] + static_cast<float>(_mm512_reduce_add_epi32(acc));
}

// modes 0-5 as printed; 10: mode 4 with the prefetch
float pass(int mode, const char* buf, size_t lo, size_t hi, const char* a) {
  return mode >= 10 ? pass_t<true>(mode - 6, buf, lo, hi, a) : pass_t<false>(mode, buf, lo, hi, a);
}
double rate(int mode, const char* buf, size_t bytes, int threads, const char* a, int passes) {
  double total = 0;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      configure_tiles();
      const size_t share = bytes / threads, lo = share * omp_get_thread_num();
      sink += pass(mode, buf, lo, lo + share, a);
      _tile_release();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (p > 0) total += bytes / s / 1e9;
    if (sink == 1234.5f) std::puts("");
  }
  return total / (passes - 1);
}

}  // namespace

int main(int argc, char** argv) {
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {  // ask Linux for the AMX tile state
    std::puts("no AMX here");
    return 1;
  }
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const size_t bytes = size_t{1} << 30;
  char* buf = static_cast<char*>(std::aligned_alloc(4096, bytes));
  char* a = static_cast<char*>(std::aligned_alloc(64, 1024));
  std::memset(buf, 1, bytes);
  std::memset(a, 0, 1024);
  const char* names[] = {"vector loads", "tile loads", "tile loads staged by vector loads", "tile loads, two streams", "decode order, 48 rows, pair", "3 row blocks x 1 column block"};
  for (int mode = 0; mode < 6; ++mode)
    std::printf("%-36s %5.1f GB/s\n", names[mode], rate(mode, buf, bytes, threads, a, 4));
  std::printf("%-36s %5.1f GB/s\n", "decode order, next pair prefetched", rate(10, buf, bytes, threads, a, 4));
  for (size_t mb : {16u, 64u, 128u, 212u, 480u, 1024u})
    std::printf("vector loads, %4zu MB again and again %5.1f GB/s\n", mb, rate(0, buf, mb << 20, threads, a, 6));
}
