// Peak memory of one step's causal-LM loss and backward, the plain path
// (causalLmLoss(matmul(h, W^T), labels): the [tokens, vocab] logits in fp32) against the chunked
// one (models/chunked_loss.h), in the same run. Each path runs in a child process of its own (this
// program again, with --path), which allocates the hidden states [1, tokens, hidden] and the head
// [vocab, hidden] in fp32, resets its peak RSS, runs the loss and its backward, and reports its
// peak RSS (VmHWM) over what it held before (VmRSS): the step's own memory, the head's gradient
// included. Exits 1 when the two losses or gradients differ (1e-4 relative), or a child fails.
//
//   chunked_loss_bench [--vocab 151936] [--tokens 2048] [--hidden 896] [--threads 1]
//                      [--chunk_mib 128]

#include "models/chunked_loss.h"

#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "models/llama.h"

namespace {

struct Settings {
  int64_t vocab = 151936, tokens = 2048, hidden = 896, threads = 1, chunk_mib = 128;
  std::string path;  // set in a child: plain | chunked
};

// A field of /proc/self/status in KiB (VmRSS, VmHWM).
int64_t statusKib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (status >> key) {
    if (key == std::string(field) + ":") {
      status >> value;
      return value;
    }
  }
  return -1;
}

// One path's step; prints "<peak over before, KiB> <before, KiB> <ms> <loss> <|grad h|> <|grad
// W|>".
int child(const Settings& s) {
  torch::set_num_threads(static_cast<int>(s.threads));
  torch::manual_seed(0);
  torch::Tensor hidden = torch::randn({1, s.tokens, s.hidden}).requires_grad_(true);
  torch::Tensor weight = (torch::randn({s.vocab, s.hidden}) * 0.02).requires_grad_(true);
  torch::Tensor labels = torch::randint(s.vocab, {1, s.tokens});
  labels[0][0] = -100;
  // Resets VmHWM to the present RSS (Linux >= 4.0), so that the peak is this step's.
  std::ofstream("/proc/self/clear_refs") << "5";
  const int64_t before = statusKib("VmRSS");
  const auto start = std::chrono::steady_clock::now();
  {
    const torch::Tensor loss =
        s.path == "plain"
            ? cxxlaunch::models::causalLmLoss(torch::matmul(hidden, weight.t()), labels)
            : cxxlaunch::models::chunkedCausalLmLoss(hidden, weight, labels,
                                                     {.chunk_bytes = s.chunk_mib << 20});
    loss.backward();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const int64_t peak = statusKib("VmHWM");
    std::printf("%lld %lld %.0f %.9g %.9g %.9g\n", static_cast<long long>(peak - before),
                static_cast<long long>(before), ms, loss.item<double>(),
                hidden.grad().norm().item<double>(), weight.grad().norm().item<double>());
  }
  return 0;
}

struct Result {
  double extra_mib = 0, before_mib = 0, ms = 0, loss = 0, grad_h = 0, grad_w = 0;
};

bool runChild(const char* self, const Settings& s, const std::string& path, Result& r) {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    const std::vector<std::string> args = {self,
                                           "--path",
                                           path,
                                           "--vocab",
                                           std::to_string(s.vocab),
                                           "--tokens",
                                           std::to_string(s.tokens),
                                           "--hidden",
                                           std::to_string(s.hidden),
                                           "--threads",
                                           std::to_string(s.threads),
                                           "--chunk_mib",
                                           std::to_string(s.chunk_mib)};
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  std::array<char, 256> buf;
  ssize_t n;
  while ((n = ::read(fds[0], buf.data(), buf.size())) > 0) out.append(buf.data(), n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  long long extra = 0, before = 0;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      std::sscanf(out.c_str(), "%lld %lld %lf %lf %lf %lf", &extra, &before, &r.ms, &r.loss,
                  &r.grad_h, &r.grad_w) != 6) {
    std::fprintf(stderr, "error: the %s child failed (status %d)\n", path.c_str(), status);
    return false;
  }
  r.extra_mib = static_cast<double>(extra) / 1024.0;
  r.before_mib = static_cast<double>(before) / 1024.0;
  return true;
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-4 * std::abs(b); }

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--path") {
      s.path = value;
    } else if (flag == "--vocab") {
      s.vocab = std::atoll(value.c_str());
    } else if (flag == "--tokens") {
      s.tokens = std::atoll(value.c_str());
    } else if (flag == "--hidden") {
      s.hidden = std::atoll(value.c_str());
    } else if (flag == "--threads") {
      s.threads = std::atoll(value.c_str());
    } else if (flag == "--chunk_mib") {
      s.chunk_mib = std::atoll(value.c_str());
    } else {
      std::fprintf(stderr, "error: unknown flag %s (see the comment atop bench/chunked_loss.cc)\n",
                   flag.c_str());
      return 2;
    }
  }
  if (!s.path.empty()) return child(s);

  const double logits_mib = static_cast<double>(s.tokens * s.vocab * 4) / (1 << 20);
  std::printf(
      "vocab %lld, tokens %lld, hidden %lld, fp32, CPU, %lld thread(s); fp32 logits %.0f MiB; "
      "chunk %lld tokens (%lld MiB)\n",
      static_cast<long long>(s.vocab), static_cast<long long>(s.tokens),
      static_cast<long long>(s.hidden), static_cast<long long>(s.threads), logits_mib,
      static_cast<long long>(
          cxxlaunch::models::chunkTokens(s.vocab, {.chunk_bytes = s.chunk_mib << 20})),
      static_cast<long long>(s.chunk_mib));
  std::printf("%-8s %14s %14s %10s %14s\n", "path", "step peak MiB", "held MiB", "step ms", "loss");
  Result plain, chunked;
  if (!runChild(argv[0], s, "plain", plain) || !runChild(argv[0], s, "chunked", chunked)) return 1;
  for (const auto& [name, r] : {std::pair{"plain", plain}, std::pair{"chunked", chunked}}) {
    std::printf("%-8s %14.0f %14.0f %10.0f %14.7f\n", name, r.extra_mib, r.before_mib, r.ms,
                r.loss);
  }
  std::printf("step peak: plain / chunked = %.2fx; with what was held: %.2fx\n",
              plain.extra_mib / chunked.extra_mib,
              (plain.extra_mib + plain.before_mib) / (chunked.extra_mib + chunked.before_mib));
  if (!near(chunked.loss, plain.loss) || !near(chunked.grad_h, plain.grad_h) ||
      !near(chunked.grad_w, plain.grad_w)) {
    std::fprintf(stderr,
                 "error: the chunked path's loss or gradients differ from the plain one's\n");
    return 1;
  }
  return 0;
}
