// kv_decode: the decode side of a KV-cache hand-off, as its own process.
//
// It connects to kv_prefill, finds the pool among the regions the prefill
// publishes, and runs rounds: READ scattered blocks of the pool into local
// memory in one batch, check every byte, WRITE blocks back, READ those again
// and check them. Every submission has a deadline, so a dead prefill never
// hangs it: the failed round reports each request's typed status, and with
// --recover the decode reads "endpoint IP:PORT" of a new prefill from stdin,
// connects, and runs that round again.
//
//   kv_decode --endpoint IP:PORT [--blocks 4096] [--block-size 65536] [--seed 1]
//             [--writes 64] [--reads 512] [--rounds 1] [--transport auto|tcp|shm]
//             [--config JSON] [--step] [--recover] [--decodes 1 --index 0]
//
// --decodes N --index I: this is decode I of N sharing the pool; it writes
// back only its own --writes blocks, with bytes of its own, and the others'
// blocks are never read (kv_prefill --decodes N checks them all).
// --step: after each round but the last, print "round N done" and wait for a
// line on stdin. The prefill must run with the same --blocks, --block-size,
// --seed, --writes and --decodes.
#include <orbite.hpp>

#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "kv_pool.hpp"

namespace {

using std::chrono::milliseconds;

/// The pool among the regions the prefill publishes: shared host memory of
/// the expected size, readable and writable.
orbite::Region find_pool(const orbite::Peer &peer, const kv::Geometry &g) {
  for (const orbite::Region &r : peer.regions())
    if (r.kind == orbite::MemoryKind::shared_host && r.length == g.bytes() && r.readable() && r.writable()) return r;
  throw std::runtime_error("the prefill publishes no read/write shared pool of " + std::to_string(g.bytes()) + " bytes");
}

/// Prints how a failed batch ended, per status and remote effect.
void report(const char *what, const orbite::Batch &b, orbite::Status s) {
  std::map<std::string, std::size_t> counts;
  for (const orbite::RequestResult &r : b.results()) {
    const char *effect = r.remote_effect == orbite::RemoteEffect::none      ? "none"
                         : r.remote_effect == orbite::RemoteEffect::applied ? "applied"
                                                                            : "unknown";
    counts[std::string(orbite::status_name(r.status)) + " (remote effect " + effect + ")"]++;
  }
  std::cout << what << ": " << orbite::status_name(s) << ":";
  for (const auto &c : counts) std::cout << " " << c.second << " x " << c.first;
  std::cout << std::endl;
}

/// Submits `reqs` and waits. Returns Status::ok when every request succeeded;
/// otherwise prints what happened and returns the first failed request's
/// status (or the submit's own).
orbite::Status run(orbite::Peer &peer, const std::vector<orbite::Request> &reqs, const orbite::SubmitOptions &opts,
                   const char *what, orbite::Transport *carried) {
  orbite::Result<orbite::Batch> sub = peer.try_submit(reqs, opts);
  if (!sub) {
    std::cout << what << ": submit failed: " << sub.error().describe() << std::endl;
    return sub.status();
  }
  orbite::Batch &b = *sub;
  orbite::Status s = b.wait(opts.timeout + milliseconds(5000));
  if (s != orbite::Status::ok) {
    report(what, b, s);
    for (const orbite::RequestResult &r : b.results())
      if (!r.ok()) return r.status;
    return s;
  }
  *carried = b.transport(0);
  for (std::size_t i = 1; i < b.size(); i++)
    if (b.transport(i) != *carried) throw std::runtime_error("one submission ran on two transports");
  return orbite::Status::ok;
}

struct Totals {
  double read_seconds = 0;
  std::uint64_t read_bytes = 0;
};

/// One round. Returns Status::ok, or the status that failed it.
orbite::Status round(orbite::Peer &peer, const orbite::Region &pool, const kv::Geometry &g, const kv::Plan &plan,
                     std::uint64_t index, std::uint64_t n, std::vector<std::byte> &local,
                     const orbite::SubmitOptions &opts, Totals &totals) {
  const std::uint64_t bs = g.block_size;
  std::vector<std::byte> scratch;
  orbite::Transport carried = orbite::Transport::automatic;

  // READ scattered blocks, one batch, local slot k <- pool block blocks[k].
  std::vector<std::uint64_t> blocks = plan.round_reads(n);
  std::vector<orbite::Request> reads;
  for (std::size_t k = 0; k < blocks.size(); k++)
    reads.push_back(orbite::read_request(local.data() + k * bs, pool.addr + blocks[k] * bs, bs));
  double t0 = kv::now_s();
  orbite::Status s = run(peer, reads, opts, "READ", &carried);
  double t_read = kv::now_s() - t0;
  if (s != orbite::Status::ok) return s;
  for (std::size_t k = 0; k < blocks.size(); k++)
    if (!kv::block_is(local.data() + k * bs, blocks[k], bs, kv::prefill, scratch))
      throw std::runtime_error("block " + std::to_string(blocks[k]) + " read back wrong");
  totals.read_seconds += t_read;
  totals.read_bytes += blocks.size() * bs;

  // WRITE the decode's blocks back, then READ them again and compare.
  std::vector<std::uint64_t> written = plan.written(index);
  std::uint64_t me = kv::decode_writer(index);
  std::vector<orbite::Request> writes, rereads;
  for (std::size_t j = 0; j < written.size(); j++) {
    kv::fill_block(local.data() + j * bs, written[j], bs, me);
    writes.push_back(orbite::write_request(local.data() + j * bs, pool.addr + written[j] * bs, bs));
    std::byte *again = local.data() + (written.size() + j) * bs;
    rereads.push_back(orbite::read_request(again, pool.addr + written[j] * bs, bs));
  }
  double t1 = kv::now_s();
  if ((s = run(peer, writes, opts, "WRITE", &carried)) != orbite::Status::ok) return s;
  double t_write = kv::now_s() - t1;
  if ((s = run(peer, rereads, opts, "READ again", &carried)) != orbite::Status::ok) return s;
  for (std::size_t j = 0; j < written.size(); j++)
    if (!kv::block_is(local.data() + (written.size() + j) * bs, written[j], bs, me, scratch))
      throw std::runtime_error("block " + std::to_string(written[j]) + " did not keep the decode's bytes");

  std::cout << "round " << n << ": READ " << blocks.size() << " scattered blocks of " << bs / 1024 << " KiB over "
            << orbite::transport_name(carried) << " in " << std::fixed << std::setprecision(2) << t_read * 1e3
            << " ms (" << blocks.size() * bs / t_read / 1e9 << " GB/s); WRITE " << written.size() << " in "
            << t_write * 1e3 << " ms; bytes verified" << std::endl;
  return orbite::Status::ok;
}

orbite::Transport transport_arg(const std::string &name) {
  if (name == "tcp") return orbite::Transport::tcp;
  if (name == "shm") return orbite::Transport::shm;
  if (name == "auto") return orbite::Transport::automatic;
  throw std::runtime_error("--transport is auto, tcp or shm, not \"" + name + "\"");
}

}  // namespace

int main(int argc, char **argv) {
  kv::Args args(argc, argv);
  kv::Geometry g{args.number("--blocks", 4096), args.number("--block-size", 64 * 1024)};
  std::uint64_t reads = args.number("--reads", 512), writes = args.number("--writes", 64);
  std::uint64_t decodes = args.number("--decodes", 1), index = args.number("--index", 0);
  kv::Plan plan(g, args.number("--seed", 1), writes, reads, decodes);
  std::uint64_t rounds = args.number("--rounds", 1);
  std::string endpoint = args.value("--endpoint", "");
  std::string config = args.value("--config", kv::recipe_config(g.bytes()));
  try {
    if (endpoint.empty()) throw std::runtime_error("--endpoint IP:PORT is required (kv_prefill prints it)");
    if (index >= decodes) throw std::runtime_error("--index must be below --decodes");
    if (decodes * writes + reads > g.blocks)
      throw std::runtime_error("--reads plus --decodes x --writes exceed --blocks");
    orbite::SubmitOptions opts{transport_arg(args.value("--transport", "auto")), milliseconds(20000)};

    orbite::Engine engine(config);
    // Local memory may be any host memory (here, the heap): SHM needs the
    // *peer's* memory to be shared. Peers may not touch it (Access::none).
    std::vector<std::byte> local(std::max(reads, 2 * writes) * g.block_size);
    orbite::Registration local_reg = engine.register_memory(local.data(), local.size(), orbite::Access::none);
    orbite::Peer peer = engine.connect(endpoint, milliseconds(10000));
    orbite::Region pool = find_pool(peer, g);

    Totals totals;
    std::uint64_t peers_lost = 0;
    for (std::uint64_t n = 0; n < rounds; n++) {
      orbite::Status s = round(peer, pool, g, plan, index, n, local, opts, totals);
      if (s != orbite::Status::ok) {
        // Gone, or a failure to report? Ask the peer for its regions: a dead
        // one fails at once, even right after the round failed (its
        // connection's end wakes the call; no timeout is waited out), and
        // from then on it has no transport left.
        bool lost = !peer.try_regions().ok() && peer.transports().empty();
        if (!lost || !args.flag("--recover")) {
          std::cout << "round " << n << " failed: " << orbite::status_name(s) << (lost ? " (peer lost)" : "")
                    << std::endl;
          return 1;
        }
        peers_lost++;
        std::cout << "peer lost: " << orbite::status_name(s) << "; waiting for a new prefill endpoint" << std::endl;
        std::string word;
        if (!(std::cin >> word >> endpoint) || word != "endpoint") throw std::runtime_error("no new endpoint on stdin");
        peer = engine.connect(endpoint, milliseconds(10000));
        pool = find_pool(peer, g);
        if ((s = round(peer, pool, g, plan, index, n, local, opts, totals)) != orbite::Status::ok) return 1;
        std::cout << "recovered: round " << n << " ran again on " << endpoint << std::endl;
      }
      if (args.flag("--step") && n + 1 < rounds) {
        std::cout << "round " << n << " done" << std::endl;
        std::string line;
        std::getline(std::cin >> std::ws, line);
      }
    }

    orbite::Stats st = engine.stats();
    std::cout << "total: " << totals.read_bytes / g.block_size << " blocks read in " << std::fixed
              << std::setprecision(2) << totals.read_seconds * 1e3 << " ms ("
              << totals.read_bytes / totals.read_seconds / 1e9 << " GB/s); requests completed: tcp "
              << st.transport(orbite::Transport::tcp).requests_completed << ", shm "
              << st.transport(orbite::Transport::shm).requests_completed << std::endl;
    // The orderly close. A cached SHM import of a prefill that died was
    // released by itself (no receipt is owed to a process that exited):
    // nothing is retained and the close is OK.
    orbite::Result<void> closed = engine.close(milliseconds(10000));
    std::uint64_t retained = engine.stats().ipc_of(orbite::Transport::shm).imports_retained;
    std::cout << "closed: " << orbite::status_name(closed.status()) << "; imports retained: " << retained
              << " (peers lost: " << peers_lost << ")" << std::endl;
    return closed.ok() && retained == 0 ? 0 : 1;
  } catch (const std::exception &e) {
    std::cerr << "kv_decode: " << e.what() << "\n";
    return 1;
  }
}
