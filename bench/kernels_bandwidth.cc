// Memory bandwidth of the fused shard-optimizer step against a plain copy in the same run.
//
// The AdamW step is memory-bound: per element it reads param, grad, exp_avg, exp_avg_sq and
// writes param, exp_avg, exp_avg_sq, 7 * 4 bytes; a copy moves 2 * 4. Each figure is the median
// of --repeat runs over --elements floats: the CPU loop (kernels::adamStep, split across
// --threads threads) against memcpy split the same way, then, when built with the CUDA kernels
// and a device is present, the CUDA kernel against cudaMemcpy device to device. Prints bytes
// moved per second and the ratio (1.0: the step runs at copy speed); asserts nothing.
//
// usage: kernels_bench [--elements 67108864] [--threads N] [--repeat 5]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/command_line.h"
#include "runtime/kernels/cpu/optimizers.h"
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
#include "runtime/kernels/cuda/device.h"
#include "runtime/kernels/cuda/optimizers.h"
#endif

namespace {

namespace k = cxxlaunch::runtime::kernels;
using Clock = std::chrono::steady_clock;

struct Options {
  int64_t elements = int64_t{64} << 20;
  int threads = std::max(1u, std::thread::hardware_concurrency());
  int repeat = 5;
};

Options parse(int argc, char** argv) {
  Options o;
  CLI::App app("Memory bandwidth of the fused AdamW step against a copy of the same bytes.",
               "kernels_bench");
  cxxlaunch::cli::useConventions(app);
  app.add_option(cxxlaunch::cli::spellings("elements"), o.elements, "floats per buffer")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("threads"), o.threads, "CPU threads")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("repeat"), o.repeat, "runs; the median is printed")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cxxlaunch::cli::parseOrExit(app, argc, argv);
  return o;
}

// Runs body(begin, end) over [0, n) in `threads` contiguous chunks, one std::thread each.
void parallelChunks(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& body) {
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    const int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    if (begin < end) pool.emplace_back(body, begin, end);
  }
  for (auto& thread : pool) thread.join();
}

// The median seconds of `repeat` timed runs of fn, after one untimed warm-up run.
double medianSeconds(int repeat, const std::function<void()>& fn) {
  fn();
  std::vector<double> seconds;
  for (int r = 0; r < repeat; ++r) {
    const auto start = Clock::now();
    fn();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

k::AdamScalars adamWScalars() {
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, weight_decay = 0.01;
  const int t = 10;
  k::AdamScalars s;
  s.decay = static_cast<float>(1 - lr * weight_decay);
  s.l2 = 0;
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(beta2, t)));
  s.eps = 1e-8f;
  s.step_size = static_cast<float>(lr / (1 - std::pow(beta1, t)));
  return s;
}

void report(const char* what, const char* peer, double bytes_step, double step_s, double bytes_copy,
            double copy_s) {
  const double step_bw = bytes_step / step_s / 1e9, copy_bw = bytes_copy / copy_s / 1e9;
  std::printf("%-5s adamw %8.1f GB/s (%.2f ms)   %-10s %8.1f GB/s (%.2f ms)   ratio %.2f\n", what,
              step_bw, step_s * 1e3, peer, copy_bw, copy_s * 1e3, step_bw / copy_bw);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int64_t n = o.elements;
  const auto count = static_cast<size_t>(n);
  const double step_bytes = 7.0 * sizeof(float) * static_cast<double>(n);
  const double copy_bytes = 2.0 * sizeof(float) * static_cast<double>(n);
  std::printf("kernels_bench: %lld floats (%.0f MiB per array), %d CPU threads, median of %d\n",
              static_cast<long long>(n), static_cast<double>(n) * 4 / (1 << 20), o.threads,
              o.repeat);

  // Arrays first touched by the threads that will use them (their pages on those threads' node).
  std::vector<float> param(count), grad(count), exp_avg(count), exp_avg_sq(count);
  std::vector<float> src(count), dst(count);
  parallelChunks(n, o.threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float x = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
      param[i] = x, grad[i] = 0.1f * x, exp_avg[i] = 0.01f * x, exp_avg_sq[i] = 1e-4f * x * x;
      src[i] = x, dst[i] = 0;
    }
  });

  const k::AdamScalars s = adamWScalars();
  const double cpu_step = medianSeconds(o.repeat, [&] {
    parallelChunks(n, o.threads, [&](int64_t begin, int64_t end) {
      k::adamStep(param.data() + begin, grad.data() + begin, exp_avg.data() + begin,
                  exp_avg_sq.data() + begin, end - begin, s);
    });
  });
  const double cpu_copy = medianSeconds(o.repeat, [&] {
    parallelChunks(n, o.threads, [&](int64_t begin, int64_t end) {
      std::memcpy(dst.data() + begin, src.data() + begin,
                  static_cast<size_t>(end - begin) * sizeof(float));
    });
  });
  report("cpu", "memcpy", step_bytes, cpu_step, copy_bytes, cpu_copy);

#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
  namespace kc = cxxlaunch::runtime::kernels::cuda;
  if (kc::deviceCount() == 0) {
    std::printf("cuda  no CUDA device: skipped\n");
    return 0;
  }
  const size_t bytes = count * sizeof(float);
  kc::DeviceBuffer d_param(bytes), d_grad(bytes), d_m(bytes), d_v(bytes), d_src(bytes),
      d_dst(bytes);
  kc::copyToDevice(d_param.data(), param.data(), bytes);
  kc::copyToDevice(d_grad.data(), grad.data(), bytes);
  kc::copyToDevice(d_m.data(), exp_avg.data(), bytes);
  kc::copyToDevice(d_v.data(), exp_avg_sq.data(), bytes);
  kc::copyToDevice(d_src.data(), src.data(), bytes);
  const double gpu_step = medianSeconds(o.repeat, [&] {
    kc::adamStep(static_cast<float*>(d_param.data()), static_cast<const float*>(d_grad.data()),
                 static_cast<float*>(d_m.data()), static_cast<float*>(d_v.data()), n, s, nullptr);
    kc::synchronize(nullptr);
  });
  const double gpu_copy = medianSeconds(o.repeat, [&] {
    kc::copyDeviceToDevice(d_dst.data(), d_src.data(), bytes, nullptr);
    kc::synchronize(nullptr);
  });
  report("cuda", "cudaMemcpy", step_bytes, gpu_step, copy_bytes, gpu_copy);
#else
  std::printf("cuda  not built with the CUDA kernels\n");
#endif
  return 0;
}
