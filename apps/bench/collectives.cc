// collectives: an nccl-tests style table for the backend cxxlaunch gives this worker.
//
//   cxxlaunch run --nproc_per_node=4 build/bin/collectives [--op all] [--min_bytes 1024]
//       [--max_bytes 67108864] [--iters 20] [--warmup 3] [--check] [--backend gloo]
//
// For each collective and size (x4 steps) rank 0 prints the mean time per call, the algorithm
// bandwidth (bytes / time) and the bus bandwidth (algbw x the collective's factor: allreduce
// 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1), as nccl-tests does. With
// --check every element of every result is compared with its closed form (rank-derived data,
// exact in fp32) and the program exits 1 on the first wrong value. Exit 2: bad flags.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "common/error.h"
#include "runtime/world.h"

using namespace cxxlaunch;
using namespace cxxlaunch::runtime;

namespace {

struct Flags {
  std::string op = "all";
  size_t min_bytes = 1024;
  size_t max_bytes = 64u << 20;
  int iters = 20;
  int warmup = 3;
  bool check = false;
  std::string backend;
};

Flags parse(int argc, char** argv) {
  Flags f;
  CLI::App app(
      "A per-size table of each collective's time and bus bandwidth, as nccl-tests prints.",
      "collectives");
  cli::useConventions(app);
  app.add_option(cli::spellings("op"), f.op,
                 "all, allreduce, all_gather, reduce_scatter or broadcast")
      ->capture_default_str();
  app.add_option(cli::spellings("min_bytes"), f.min_bytes, "smallest message")
      ->capture_default_str();
  app.add_option(cli::spellings("max_bytes"), f.max_bytes, "largest message")
      ->capture_default_str();
  app.add_option(cli::spellings("iters"), f.iters, "timed iterations per size")
      ->capture_default_str();
  app.add_option(cli::spellings("warmup"), f.warmup, "untimed iterations first")
      ->capture_default_str();
  app.add_flag(cli::spellings("check"), f.check, "check every element; exit 1 on a wrong result");
  app.add_option(cli::spellings("backend"), f.backend, "gloo or nccl (default: the launcher's)");
  cli::parseOrExit(app, argc, argv);
  if (f.op != "all" && f.op != "allreduce" && f.op != "all_gather" && f.op != "reduce_scatter" &&
      f.op != "broadcast") {
    throw InvalidArgument("--op must be all, allreduce, all_gather, reduce_scatter or broadcast");
  }
  if (f.min_bytes < 4 || f.max_bytes < f.min_bytes || f.iters < 1 || f.warmup < 0) {
    throw InvalidArgument("need 4 <= --min_bytes <= --max_bytes, --iters >= 1, --warmup >= 0");
  }
  return f;
}

// Rank r's element i: small integers, so every sum below is exact in fp32.
float value(int rank, size_t i) {
  return static_cast<float>((rank + 1) + static_cast<int>(i % 13));
}

struct Result {
  double seconds = 0;
  size_t wrong = 0;
  std::string first_wrong;
};

// The input and output of every size: registered once with the backend (Backend::sharedBuffer:
// shared memory the collectives read in place, when every rank is on this host), else 64-byte
// aligned as LibTorch allocates tensors (Gloo's vectorised reductions are faster on aligned
// memory, and the peers we compare with, torch.distributed, use aligned tensors).
class Buffer {
 public:
  Buffer(Backend& backend, size_t bytes)
      : memory_(backend.sharedBuffer(bytes)), registered_(memory_ != nullptr) {
    if (!memory_) memory_.reset(std::aligned_alloc(64, (bytes + 63) / 64 * 64), std::free);
  }
  float* data() const { return static_cast<float*>(memory_.get()); }
  bool registered() const { return registered_; }

 private:
  std::shared_ptr<void> memory_;
  bool registered_;
};

// A view of the first `n` floats of a Buffer.
class Floats {
 public:
  Floats(const Buffer& buffer, size_t n) : n_(n), data_(buffer.data()) {}
  float* data() const { return data_; }
  size_t size() const { return n_; }
  float& operator[](size_t i) const { return data_[i]; }

 private:
  size_t n_;
  float* data_;
};

Result runOne(Backend& backend, const std::string& op, size_t count, const Flags& flags,
              const Buffer& input, const Buffer& output) {
  const int n = backend.worldSize(), r = backend.rank();
  const size_t total =
      op == "allreduce" || op == "broadcast" ? count : count * static_cast<size_t>(n);
  Floats in(input, total), out(output, total);
  auto fill = [&] {
    for (size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
  };
  auto call = [&]() -> WorkPtr {
    if (op == "allreduce")
      return backend.allreduce(in.data(), count, DType::kFloat32, ReduceOp::kSum);
    if (op == "broadcast") return backend.broadcast(in.data(), count, DType::kFloat32, 0);
    if (op == "all_gather") return backend.allGather(in.data(), out.data(), count, DType::kFloat32);
    return backend.reduceScatter(in.data(), out.data(), count, DType::kFloat32, ReduceOp::kSum);
  };
  Result result;
  for (int w = 0; w < flags.warmup; ++w) {
    fill();
    call()->wait();
  }
  backend.barrier()->wait();
  double busy = 0;
  for (int it = 0; it < flags.iters; ++it) {
    fill();  // outside the timing: in-place collectives overwrite the input
    const auto start = std::chrono::steady_clock::now();
    call()->wait();
    busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  result.seconds = busy / flags.iters;
  if (!flags.check) return result;
  // Closed forms: sum over ranks of (k+1) is n(n+1)/2; the (i % 13) part is added n times.
  const float rank_sum = static_cast<float>(n * (n + 1) / 2);
  auto expect = [&](size_t i) -> float {
    if (op == "allreduce") return rank_sum + static_cast<float>(n) * static_cast<float>(i % 13);
    if (op == "broadcast") return value(0, i);
    if (op == "all_gather") return value(static_cast<int>(i / count), i % count);
    const size_t global = static_cast<size_t>(r) * count + i;  // reduce_scatter: my chunk
    return rank_sum + static_cast<float>(n) * static_cast<float>(global % 13);
  };
  const Floats& got = op == "allreduce" || op == "broadcast" ? in : out;
  const size_t checked = op == "reduce_scatter" ? count : got.size();
  for (size_t i = 0; i < checked; ++i) {
    if (got[i] != expect(i)) {
      if (result.wrong++ == 0) {
        result.first_wrong = "element " + std::to_string(i) + ": got " + std::to_string(got[i]) +
                             ", expected " + std::to_string(expect(i));
      }
    }
  }
  return result;
}

double busFactor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {
    flags = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "collectives: " << e.what() << "\n";
    return 2;
  }
  try {
    WorkerEnv env = readWorkerEnv();
    if (!flags.backend.empty()) env.backend = flags.backend;
    auto store = storeFromEnv(env);
    auto backend = backendFromEnv(env, store);
    const int n = backend->worldSize();
    // Large enough for every size: at most max_bytes, rounded up to whole elements per rank.
    const size_t largest = flags.max_bytes + sizeof(float) * static_cast<size_t>(n);
    const Buffer input(*backend, largest), output(*backend, largest);
    if (backend->rank() == 0) {
      std::printf("# %s, %d ranks, float32, %d iterations%s, over %s%s\n", backend->name().c_str(),
                  n, flags.iters, flags.check ? ", every element checked" : "",
                  backend->transport().c_str(),
                  input.registered() ? ", buffers registered once (zero-copy)" : "");
      std::printf("%-15s %12s %12s %12s %12s %8s\n", "collective", "bytes", "time us", "algbw GB/s",
                  "busbw GB/s", "wrong");
    }
    const std::vector<std::string> ops =
        flags.op == "all"
            ? std::vector<std::string>{"allreduce", "all_gather", "reduce_scatter", "broadcast"}
            : std::vector<std::string>{flags.op};
    size_t wrong = 0;
    for (const auto& op : ops) {
      for (size_t bytes = flags.min_bytes; bytes <= flags.max_bytes; bytes *= 4) {
        // Sizes are per rank's contribution for all_gather/reduce_scatter, as in nccl-tests'
        // totals: the buffer a rank sends or receives in full.
        const size_t count = std::max<size_t>(
            1, bytes / sizeof(float) / (op == "allreduce" || op == "broadcast" ? 1 : n));
        Result r = runOne(*backend, op, count, flags, input, output);
        wrong += r.wrong;
        const double total_bytes = static_cast<double>(
            (op == "allreduce" || op == "broadcast" ? count : count * n) * sizeof(float));
        const double algbw = total_bytes / r.seconds / 1e9;
        if (backend->rank() == 0) {
          std::printf("%-15s %12.0f %12.1f %12.3f %12.3f %8zu\n", op.c_str(), total_bytes,
                      r.seconds * 1e6, algbw, algbw * busFactor(op, n), r.wrong);
        }
        if (r.wrong > 0) {
          std::fprintf(stderr,
                       "collectives: rank %d: %s of %.0f bytes: %zu wrong values; first: %s\n",
                       backend->rank(), op.c_str(), total_bytes, r.wrong, r.first_wrong.c_str());
        }
      }
    }
    if (wrong > 0) return 1;
    backend->barrier()->wait();
    return 0;
  } catch (const InvalidArgument& e) {
    std::cerr << "collectives: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "collectives: " << e.what() << "\n";
    return 3;
  }
}
