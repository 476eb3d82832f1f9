// AMX's tile state, for the kernels that run on it (amx_gemm.cpp, attention_amx.h): the OS's
// permission to use it and the one tile shape they all use. Defines BULKRUN_AMX_TILES where the
// compiler targets AMX.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#define BULKRUN_AMX_TILES 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace bulkrun_cpu {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl: ask the kernel for a state component
constexpr int kXfeatureXtiledata = 18;     // ... the AMX tile data

// Whether this process may run AMX: Linux hands out the 8 KB tile state only on request (oneDNN
// asks too; asking twice is fine). BULKRUN_CPU_AMX=0 turns the AMX paths off (A/B measurements).
inline bool amx_ready() {
  static const bool ready = [] {
    const char* env = std::getenv("BULKRUN_CPU_AMX");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ready;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// All eight tiles 16 rows x 64 bytes: C = 16 x 16 fp32, A = 16 x 32 bf16, B = 16 pairs x 16 x 2 bf16.
// Once per thread and call, not per item or block.
inline void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // GCC 12 does not count ldtilecfg as a read of all 64 bytes: where this function is not inlined it
  // drops the stores of colsb and rows as dead, and ldtilecfg faults on the empty shape. The barrier
  // makes the whole struct live.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

}  // namespace bulkrun_cpu
#endif
