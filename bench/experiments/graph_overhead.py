"""What a CUDA-graph replay of n tiny kernels costs between two CUDA events: the fixed cost and the
gap per extra kernel that bench.gpu_model assumes (``graph_replay_fixed_us``, ``graph_kernel_gap_us``).

    python -m bench.experiments.graph_overhead     # on a CUDA machine; prints one line per n
"""

from __future__ import annotations

import statistics

import torch


def replay_us(kernels: int, replays: int = 300) -> float:
    """Median µs between events around one replay of a graph of ``kernels`` one-element adds."""
    x = torch.zeros(1, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(kernels):
            x.add_(1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            x.add_(1)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main() -> None:
    rows = {n: replay_us(n) for n in (1, 2, 3, 4, 8)}
    for n, us in rows.items():
        print(f"graph replay of {n} one-element kernels: median {us:.2f} us between events")
    print(f"fit: fixed {rows[1]:.2f} us, per extra kernel {(rows[8] - rows[1]) / 7:.2f} us ({torch.cuda.get_device_name(0)}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
