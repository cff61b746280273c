#!/usr/bin/env python3
"""The cost of a data-parallel training step at cluster scale (docs/DISTRIBUTED.md), from figures
measured on the development machine: each recipe's training speed on one core (2 ranks x 1 thread,
`mpirun -np 2 tessera train RECIPE --set runtime.threads=1 --set train.max_steps=40 ...`, examples/s
over 2) and its gradient size, and the allreduce's latency and bandwidth (build/bench_allreduce).

Per step with N ranks:
  allreduce = 2 (N - 1) alpha + 2 (N - 1) / N * bytes / beta
(what a ring, or this project's reduce-scatter + allgather, moves), against the compute of
  strong scaling: the recipe's global batch B cut N ways, ceil(B / N) examples a rank;
  weak scaling:   each rank keeps the B / 2 examples it has on 2 ranks (a global batch of N B / 2);
at one core a rank. Efficiency: compute / (compute + allreduce), the allreduce not overlapped.
Standard library only; no arguments.
"""

# recipe: (parameters, global batch, examples/s on 2 ranks x 1 thread, measured 2026-12-05)
RECIPES = {
    "fashion_mnist_vit (bf16)": (803_338, 128, 2818.5),
    "spoken_digits_frames": (431_114, 32, 923.0),
    "spoken_digits_ast": (447_498, 32, 514.7),
    "multitask (bf16)": (676_545, 32, 743.1),
    "kjv_char_gpt (bf16)": (1_854_144, 32, 215.2),
    "protein_families_mlm": (616_097, 16, 57.5),
}

# network: (alpha in s, beta in bytes/s, what it is)
NETWORKS = {
    "shared memory (measured)": (3e-6, 4.6e9, "2 ranks on this machine: 4 KiB in 3 us, 1 MiB at 4.6 GB/s bus bandwidth"),
    "25 GbE (assumed)": (25e-6, 3.1e9, "a common cluster Ethernet: 25 Gbit/s, 25 us a message"),
    "InfiniBand HDR100 (assumed)": (2e-6, 12.0e9, "100 Gbit/s, 2 us a message"),
}

RANKS = [8, 64, 512]


def allreduce_s(n, nbytes, alpha, beta):
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / beta


def main():
    for net, (alpha, beta, what) in NETWORKS.items():
        print(f"\n**{net}**: {what}.\n")
        print("| recipe | gradient | compute a step, strong: 8 / 64 / 512 ranks | weak (all N) | "
              + " | ".join(f"{n} ranks: allreduce, efficiency strong / weak" for n in RANKS) + " |")
        print("|---|---|---|---|" + "---|" * len(RANKS))
        for name, (params, batch, eps2) in RECIPES.items():
            rate = eps2 / 2  # examples/s on one core
            nbytes = 4 * params
            strong = [-(-batch // n) / rate for n in RANKS]
            weak = (batch / 2) / rate
            cells = []
            for n, comp in zip(RANKS, strong):
                ar = allreduce_s(n, nbytes, alpha, beta)
                cells.append(f"{ar * 1e3:.2f} ms, {comp / (comp + ar):.0%} / {weak / (weak + ar):.0%}")
            print(f"| {name} | {nbytes / 2**20:.1f} MiB | " + " / ".join(f"{c * 1e3:.2f}" for c in strong)
                  + f" ms | {weak * 1e3:.1f} ms | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
