// kv_pool.hpp: what the two KV-cache example programs (kv_prefill.cpp and
// kv_decode.cpp) agree on: the pool's geometry, the bytes of each block, which
// blocks the decode writes back and which it reads in each round, the engine
// settings of the KV-cache recipe (docs/getting-started.md), and a few
// command-line helpers. Nothing here talks to liborbite.
#ifndef KV_POOL_HPP
#define KV_POOL_HPP

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace kv {

/// The pool: `blocks` blocks of `block_size` bytes (a multiple of 8).
struct Geometry {
  std::uint64_t blocks = 4096;
  std::uint64_t block_size = 64 * 1024;
  std::uint64_t bytes() const { return blocks * block_size; }
};

/// Who filled a block: the prefill computed it, or a decode wrote it back.
enum Writer : std::uint64_t { prefill = 0x1111, decode = 0x2222 };

/// The writer tag of decode `index` (of several decodes sharing the pool):
/// decode 0 writes as `decode`, each other decode its own bytes.
inline std::uint64_t decode_writer(std::uint64_t index) { return decode + index * 0x10000; }

/// Fills `dst` with block `block`'s contents as `who` writes them.
inline void fill_block(std::byte *dst, std::uint64_t block, std::uint64_t block_size, std::uint64_t who) {
  std::uint64_t x = (block + 1) * 0x9E3779B97F4A7C15ull ^ who;
  for (std::uint64_t off = 0; off < block_size; off += 8) {
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x += off;
    std::memcpy(dst + off, &x, 8);
  }
}

/// Whether `p` holds block `block` as `who` wrote it (`scratch`: block_size bytes).
inline bool block_is(const std::byte *p, std::uint64_t block, std::uint64_t block_size, std::uint64_t who,
                     std::vector<std::byte> &scratch) {
  scratch.resize(block_size);
  fill_block(scratch.data(), block, block_size, who);
  return std::memcmp(p, scratch.data(), block_size) == 0;
}

/// A fixed shuffle of the block indices for `seed`: its first
/// `decodes * writes` entries are the blocks the decodes write back,
/// `writes` each (decode i the i-th run of them, so that no two decodes
/// write one block); the rest are read, in rounds of `reads` (so a round
/// never reads a block a decode wrote).
struct Plan {
  Plan(const Geometry &g, std::uint64_t seed, std::uint64_t writes_, std::uint64_t reads_,
       std::uint64_t decodes_ = 1)
      : order(g.blocks), writes(writes_), reads(reads_), decodes(decodes_) {
    std::iota(order.begin(), order.end(), std::uint64_t{0});
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
  }
  /// The blocks decode `index` writes back.
  std::vector<std::uint64_t> written(std::uint64_t index = 0) const {
    return {order.begin() + index * writes, order.begin() + (index + 1) * writes};
  }
  /// The scattered blocks round `round` reads.
  std::vector<std::uint64_t> round_reads(std::uint64_t round) const {
    std::vector<std::uint64_t> out;
    std::uint64_t first = decodes * writes, pool = order.size() - first;
    for (std::uint64_t k = 0; k < reads; k++) out.push_back(order[first + (round * reads + k) % pool]);
    return out;
  }
  /// Who last wrote `block`: the decode that writes it back, else the prefill.
  std::uint64_t writer_of(std::uint64_t block) const {
    auto end = order.begin() + decodes * writes;
    auto at = std::find(order.begin(), end, block);
    if (at == end) return prefill;
    std::uint64_t position = at - order.begin();
    return decode_writer(position / writes);
  }
  bool is_written(std::uint64_t block) const { return writer_of(block) != prefill; }

  std::vector<std::uint64_t> order;
  std::uint64_t writes, reads, decodes;
};

/// The KV-cache recipe (docs/getting-started.md) for a pool of `pool_bytes`:
/// SHM keeps the mapping of the pool between submissions (the relocation
/// cache, on by default), and the mapping budget holds the whole pool
/// (max_inflight_bytes, on both sides; the pool is charged once however
/// many decodes import it). A scattered submission is one subbatch per
/// remote region whatever its spread. Up to 1 GiB the defaults are enough.
/// The same on both sides.
inline std::string recipe_config(std::uint64_t pool_bytes) {
  std::uint64_t budget = std::uint64_t{1} << 30;  // the default, 1 GiB
  if (pool_bytes <= budget) return "{}";
  while (budget < pool_bytes) budget *= 2;
  return "{\"max_inflight_bytes\": " + std::to_string(budget) + "}";
}

/// Seconds since an arbitrary start.
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// `--name value` options: value(name, fallback).
struct Args {
  Args(int argc, char **argv) : argv_(argv + 1, argv + argc) {}
  std::string value(const std::string &name, const std::string &fallback) const {
    for (std::size_t i = 0; i + 1 < argv_.size(); i++)
      if (argv_[i] == name) return argv_[i + 1];
    return fallback;
  }
  std::uint64_t number(const std::string &name, std::uint64_t fallback) const {
    std::string v = value(name, "");
    if (v.empty()) return fallback;
    char *end = nullptr;
    unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    if (*end != '\0') {
      std::fprintf(stderr, "%s needs a number, got \"%s\"\n", name.c_str(), v.c_str());
      std::exit(2);
    }
    return n;
  }
  bool flag(const std::string &name) const { return std::find(argv_.begin(), argv_.end(), name) != argv_.end(); }

 private:
  std::vector<std::string> argv_;
};

}  // namespace kv

#endif
