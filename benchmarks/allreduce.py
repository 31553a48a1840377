"""All-reduce bandwidth of one buffer size: MLX's all_sum (as the trainer calls it) next to NCCL
driven from PyTorch, the figure NCCL itself gives for that size (nccl-tests is not installed on
the GPU machine; torch.distributed calls ncclAllReduce directly).

    # MLX, the trainer's backend and bucketing (one rank per GPU):
    python -c "from mlx._distributed_utils.launch import main; main()" -n 2 --backend nccl \\
        --env FLEET_BACKEND=nccl benchmarks/allreduce.py --framework mlx --bytes 541065216
    # PyTorch + NCCL:
    python -m torch.distributed.run --nproc-per-node 2 benchmarks/allreduce.py \\
        --framework torch --bytes 541065216

Rank 0 prints one JSON line: median seconds, algorithm and bus bandwidth (nccl-tests' names:
bus = algorithm x 2(n-1)/n), for the whole buffer in one call and, for MLX, in the trainer's
32 MiB buckets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

BUCKET_BYTES = 32 * 1024**2  # trainer.distributed.BUCKET_BYTES


def figures(nbytes: int, times: list[float], ranks: int) -> dict:
    t = statistics.median(times)
    alg = nbytes / t
    return {
        "time_s": t,
        "algbw_GBps": alg / 1e9,
        "busbw_GBps": alg * 2 * (ranks - 1) / ranks / 1e9,
    }


def mlx_bench(nbytes: int, iters: int, warmup: int) -> tuple[int, int, dict]:
    import mlx.core as mx

    group = mx.distributed.init(backend=os.environ.get("FLEET_BACKEND", "any"))
    x = mx.ones((nbytes // 4,), dtype=mx.float32)
    chunks = [x[i : i + BUCKET_BYTES // 4] for i in range(0, x.size, BUCKET_BYTES // 4)]
    mx.eval(x, *chunks)

    def whole() -> None:
        mx.eval(mx.distributed.all_sum(x, group=group))

    def bucketed() -> None:  # as Cluster.sum_gradients: one eval per bucket
        for c in chunks:
            mx.eval(mx.distributed.all_sum(c, group=group))

    out = {}
    for name, fn in (("whole", whole), ("bucketed_32MiB", bucketed)):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = figures(nbytes, times, group.size())
    check = mx.distributed.all_sum(mx.ones((4,)), group=group)
    out["sum_ok"] = bool(mx.all(check == group.size()).item())
    out["device"] = str(mx.default_device())
    return group.rank(), group.size(), out


def torch_bench(nbytes: int, iters: int, warmup: int) -> tuple[int, int, dict]:
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    for _ in range(warmup):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    out = {"whole": figures(nbytes, times, dist.get_world_size())}
    out["torch"] = torch.__version__
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    return rank, size, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--framework", choices=("mlx", "torch"), required=True)
    p.add_argument("--bytes", type=int, default=BUCKET_BYTES * 16, help="buffer size")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    bench = mlx_bench if args.framework == "mlx" else torch_bench
    rank, size, out = bench(args.bytes, args.iters, args.warmup)
    if rank == 0:
        print(json.dumps({"framework": args.framework, "ranks": size, "bytes": args.bytes, **out}))


if __name__ == "__main__":
    main()
