// kv_prefill: the prefill side of a KV-cache hand-off, as its own process.
//
// It allocates a block-indexed KV pool with orbite::Allocation::shared_host
// (orbite_host_allocate_shared: the only host memory a decode process on this
// host can reach over SHM; a heap pool would only ever go over TCP), fills
// every block, registers the pool for peers to READ and WRITE, prints its
// endpoint and serves. When a line "verify" arrives on stdin (or stdin
// closes) it checks every block — the blocks the decode writes back (the same
// plan as kv_decode: --seed, --writes) hold the decode's bytes, all others the
// prefill's — then closes the engine and frees the pool.
//
//   kv_prefill [--blocks 4096] [--block-size 65536] [--seed 1] [--writes 64] [--decodes 1]
//              [--config JSON]
//
// --decodes N: N decodes share the pool, each writing back its own --writes
// blocks (kv_decode --decodes N --index I); each written block is checked
// against the bytes of the decode that writes it.
//
// stdout: "endpoint IP:PORT", then one "verified: ..." line. Exit status 0
// when every byte is right, the close was orderly and the pool was freed.
#include <orbite.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "kv_pool.hpp"

int main(int argc, char **argv) {
  kv::Args args(argc, argv);
  kv::Geometry g{args.number("--blocks", 4096), args.number("--block-size", 64 * 1024)};
  std::uint64_t decodes = args.number("--decodes", 1);
  kv::Plan plan(g, args.number("--seed", 1), args.number("--writes", 64), 0, decodes);
  std::string config = args.value("--config", kv::recipe_config(g.bytes()));
  try {
    orbite::Engine engine(config);
    // The pool is library shared memory, co-owned by its registration: it is
    // freed after the region is unregistered, never while a peer maps it.
    orbite::Registration pool =
        engine.register_memory(orbite::Allocation::shared_host(g.bytes()), orbite::Access::read_write);
    for (std::uint64_t b = 0; b < g.blocks; b++)
      kv::fill_block(pool.bytes() + b * g.block_size, b, g.block_size, kv::prefill);
    std::cout << "endpoint " << engine.endpoint() << std::endl;

    std::string line;
    while (std::getline(std::cin, line) && line != "verify") {
    }

    std::vector<std::byte> scratch;
    std::uint64_t wrong = 0, written = 0;
    for (std::uint64_t b = 0; b < g.blocks; b++) {
      std::uint64_t who = plan.writer_of(b);
      written += who != kv::prefill;
      if (!kv::block_is(pool.bytes() + b * g.block_size, b, g.block_size, who, scratch)) wrong++;
    }
    // The orderly close: waits for requests being served and for the close
    // receipt of every SHM export of the pool (an export to a process that
    // died is reclaimed).
    orbite::Result<void> closed = engine.close(std::chrono::seconds(10));
    if (!closed) std::cerr << "kv_prefill: " << closed.error().describe() << "\n";
    pool = orbite::Registration();  // unregistered by the close; frees the pool
    bool freed = orbite::retained_allocation_count() == 0;
    std::string by = decodes == 1 ? "the decode" : std::to_string(decodes) + " decodes";
    std::cout << "verified: " << g.blocks << " blocks, " << written << " written back by " << by << ", " << wrong
              << " wrong; close " << orbite::status_name(closed.status()) << "; pool " << (freed ? "freed" : "retained")
              << std::endl;
    return wrong == 0 && closed.ok() && freed ? 0 : 1;
  } catch (const orbite::Error &e) {
    std::cerr << "kv_prefill: " << e.what() << "\n";
    return 1;
  }
}
