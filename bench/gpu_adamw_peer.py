"""The peer of kernels_bench's CUDA line (scripts/gpu-check.sh): torch.optim.AdamW(fused=True)
stepping one parameter of --elements floats on the GPU, counted as kernels_bench counts its
fused shard AdamW (read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq:
7 x 4 bytes an element). Prints "torch fused adamw X GB/s (Y ms)", the median of --repeat steps.
"""
import argparse
import statistics

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--elements", type=int, default=64 << 20)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    param = torch.nn.Parameter(torch.randn(a.elements, device="cuda"))
    param.grad = torch.randn_like(param)
    opt = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.01, fused=True)
    opt.step()  # the state's allocation and the kernel's first launch, untimed
    times = []
    for _ in range(a.repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        opt.step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    t = statistics.median(times)
    print(f"torch fused adamw {7 * 4 * a.elements / t / 1e9:.1f} GB/s ({t * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
