// The share of a thread's next weight panel that one pass over its current panel pulls into cache,
// spread evenly over the pass's inner loop: at decode-sized M a panel's first pass would otherwise
// wait on DRAM with the dot products idle. For dpbf16_gemm.cpp and head_vnni.h's screen.
#pragma once

#include <algorithm>
#include <cstdint>

namespace bulkrun_cpu {

struct PanelPrefetch {
  const char* begin = nullptr;  // the share's first byte
  int64_t lines = 0;            // 64-byte lines in the share

  // Pass `pass` of `passes` over the current panel: its share of the `bytes` at `next` (null: none),
  // every line in exactly one pass's share.
  static PanelPrefetch share(const void* next, int64_t bytes, int64_t pass, int64_t passes) {
    const int64_t all = next ? (bytes + 63) / 64 : 0, first = all * pass / passes;
    return {static_cast<const char*>(next) + first * 64, all * (pass + 1) / passes - first};
  }

  // 256 x the lines per iteration of a loop of `iterations`, rounded up (0: an empty loop)
  int64_t step(int64_t iterations) const {
    return iterations == 0 ? 0 : (lines * 256 + iterations - 1) / iterations;
  }

  // iteration i's lines, [i step >> 8, (i + 1) step >> 8): each line once over the loop
  void issue(int64_t i, int64_t step) const {
    for (int64_t line = (i * step) >> 8, end = std::min(lines, ((i + 1) * step) >> 8); line < end; ++line)
      __builtin_prefetch(begin + line * 64, 0, 2);
  }
};

}  // namespace bulkrun_cpu
