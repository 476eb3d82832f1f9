// How fast one core reads memory laid out like the KV cache: runs of `chunk` bytes visited in a
// random order (a sequence's blocks) against one sequential stream, with and without software
// prefetches a distance ahead. What decode attention can hope for from DRAM on this box.
//
//   g++ -O2 -march=native -pthread bench/kv_read_probe.cpp -o /tmp/kv_read_probe
//   /tmp/kv_read_probe [threads=1] [chunk bytes=6144] [huge pages 0/1=0]
//
// Prints GB/s (all threads together) for each prefetch setting, first for the chunks in random
// order, then for one sequential stream. 512 MiB a thread.

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

struct Setting {
  const char* name;
  int hint;  // -1: no software prefetch
  int64_t lines_ahead;
};

// A walk over the chunks' lines in visiting order, one line at a time (no division per line: the
// walk's own arithmetic must stay well below the memory's time).
struct Cursor {
  const char* buf;
  const std::vector<int64_t>& order;
  int64_t chunk, next_chunk = 0;
  const char *line = nullptr, *end = nullptr;
  const char* advance() {  // the next line, or null past the last
    if (line == end) {
      if (next_chunk == static_cast<int64_t>(order.size())) return nullptr;
      line = buf + order[next_chunk++] * chunk;
      end = line + chunk;
    }
    const char* at = line;
    line += 64;
    return at;
  }
};

double read_all(const char* buf, const std::vector<int64_t>& order, int64_t chunk, Setting s) {
  Cursor reader{buf, order, chunk}, ahead{buf, order, chunk};
  for (int64_t i = 0; s.hint >= 0 && i < s.lines_ahead; ++i) ahead.advance();
  __m512 acc = _mm512_setzero_ps();
  const auto t0 = std::chrono::steady_clock::now();
  while (const char* at = reader.advance()) {
    if (s.hint >= 0)
      if (const char* p = ahead.advance()) {
        if (s.hint == 0) _mm_prefetch(p, _MM_HINT_T0);
        else if (s.hint == 1) _mm_prefetch(p, _MM_HINT_T1);
        else _mm_prefetch(p, _MM_HINT_NTA);
      }
    acc = _mm512_add_ps(acc, _mm512_load_ps(reinterpret_cast<const float*>(at)));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float sink = _mm512_reduce_add_ps(acc);
  (void)sink;
  return seconds;
}

void report(const std::vector<char*>& bufs, const std::vector<std::vector<int64_t>>& orders, int64_t chunk,
            int64_t bytes) {
  const Setting settings[] = {{"hardware only", -1, 0}, {"T0, 32 lines ahead", 0, 32}, {"T1, 32 lines ahead", 1, 32},
                              {"T1, 128 lines ahead", 1, 128}, {"NTA, 32 lines ahead", 2, 32}};
  for (const Setting& s : settings) {
    std::vector<double> seconds(bufs.size());
    std::vector<std::thread> threads;
    for (size_t t = 0; t < bufs.size(); ++t)
      threads.emplace_back([&, t] { seconds[t] = read_all(bufs[t], orders[t], chunk, s); });
    for (auto& th : threads) th.join();
    const double slowest = *std::max_element(seconds.begin(), seconds.end());
    std::printf("  %-22s %6.1f GB/s\n", s.name, bufs.size() * bytes / slowest / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const int64_t chunk = argc > 2 ? std::atoll(argv[2]) : 6144;
  const bool huge = argc > 3 && std::atoi(argv[3]) != 0;
  const int64_t bytes = int64_t{512} << 20;
  if (threads < 1 || chunk < 64 || chunk % 64 != 0) {
    std::fprintf(stderr, "usage: kv_read_probe [threads >= 1] [chunk bytes, a multiple of 64] [huge 0/1]\n");
    return 2;
  }
  std::vector<char*> bufs(threads);
  std::vector<std::vector<int64_t>> shuffled(threads), sequential(threads);
  for (int t = 0; t < threads; ++t) {
    bufs[t] = static_cast<char*>(std::aligned_alloc(2 << 20, bytes));
    if (huge) madvise(bufs[t], bytes, MADV_HUGEPAGE);
    std::memset(bufs[t], 1, bytes);
    const int64_t chunks = bytes / chunk;
    sequential[t].resize(chunks);
    for (int64_t i = 0; i < chunks; ++i) sequential[t][i] = i;
    shuffled[t] = sequential[t];
    std::shuffle(shuffled[t].begin(), shuffled[t].end(), std::mt19937(t));
  }
  std::printf("%d thread(s), %lld-byte chunks in random order%s:\n", threads, static_cast<long long>(chunk),
              huge ? " (huge pages asked for)" : "");
  report(bufs, shuffled, chunk, bytes);
  std::printf("one sequential stream:\n");
  report(bufs, sequential, chunk, bytes);
  return 0;
}
