#!/usr/bin/python3
"""torch.optim.AdamW over N fp32 parameters on T threads: the reference beside
bench/host_adamw_kernels_bench.cc (ZeroTrain's host optimizer step).

The parameters are split into param groups of at most --chunk elements: torch 1.13's foreach
AdamW allocates two temporaries the size of a group (sqrt(v) and the denominator), so one
1 B-element group would need 24 GB; groups of 128 M keep the temporaries at 1 GB and change
nothing else (each group is stepped with the same foreach kernels, one after another).

Usage: /usr/bin/python3 bench/torch_adamw_reference.py [--params N] [--threads T]
       [--iterations I] [--foreach|--for-loop]
Prints the best step (after one untimed step) in seconds and parameters/s.
"""
import argparse
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=1_000_000_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=128 * 1024 * 1024)
    parser.add_argument("--for-loop", action="store_true",
                        help="foreach=False (the per-tensor loop) instead of foreach")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    groups = []
    left = args.params
    while left > 0:
        n = min(left, args.chunk)
        p = torch.nn.Parameter(torch.empty(n).uniform_(-0.02, 0.02))
        p.grad = torch.empty(n).uniform_(-1e-3, 1e-3)
        groups.append({"params": [p]})
        left -= n
    foreach = not args.for_loop
    # ZeroTrain's bench: lr 1e-4, weight decay 0.01, betas (0.9, 0.999), eps 1e-8.
    opt = torch.optim.AdamW(groups, lr=1e-4, weight_decay=0.01, foreach=foreach)
    best = float("inf")
    for i in range(args.iterations + 1):
        t0 = time.perf_counter()
        opt.step()
        dt = time.perf_counter() - t0
        if i > 0:
            best = min(best, dt)
    print(f"torch {torch.__version__} AdamW foreach={foreach}, {args.params} parameters in "
          f"{len(groups)} groups, {args.threads} threads: {best:.3f} s a step, "
          f"{args.params / best:.3g} parameters/s")


if __name__ == "__main__":
    main()
