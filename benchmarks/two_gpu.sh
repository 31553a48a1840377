#!/usr/bin/env bash
# Issue 7 in one command on a host with two GPUs (MLX staged as ../shared/device/README.md says):
#   1. the same update: 2 GPUs on split 10,6 against 1 GPU on the whole batch of 16;
#   2. a live 10,6 run at the throughput configuration, watched by `fleet console --once --json`
#      and summarized by `fleet report`;
#   3. scaling 1 -> 2 GPUs (`fleet bench balance --scaling`), with the trainer's all-reduce
#      bandwidth;
#   4. the same buffer all-reduced by MLX directly and by NCCL through PyTorch.
#
#   bash benchmarks/two_gpu.sh [OUT_DIR]
#
# On a CPU-only machine the same script checks itself: BACKEND=ring DEVICE=cpu CONFIG=... SMALL=...
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/fleet-2gpu}}
mkdir -p "$out"
# NVLink multicast stays off (a shared host's rule); the ranks inherit these too.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
backend=${BACKEND:-nccl}
device=${DEVICE:-gpu}
config=${CONFIG:-"--depth 12 --width 768 --heads 12 --vocab 32768 --seq-len 1024 --precision mixed"}
small=${SMALL:-"--depth 4 --width 256 --heads 4 --vocab 32768 --seq-len 512 --precision mixed"}
updates=${UPDATES:-12}
runs=$(mktemp -d)
fleet() { "$py" -m fleet.cli "$@"; }
free_base() {  # a base port with the next 3 free too (telemetry and ring ports)
  "$py" -c "
import random, socket
while True:
    base, socks = random.randrange(41000, 59000), []
    try:
        for i in range(4):
            socks.append(socket.socket())
            socks[-1].bind(('127.0.0.1', base + i))
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    break"
}
ports() { echo --starting-port "$(free_base)"; }
step() { echo "== $(date +%T) $*" >&2; }
failed=0
check() { local rc=$?; [ $rc -eq 0 ] || { echo "   FAILED ($rc): $1" >&2; failed=1; }; }

step "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m; } > "$out/machine.txt" 2>&1
"$py" -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" >> "$out/machine.txt" 2>&1

step "1. same update: 1 rank on 16 vs 2 ranks on 10,6"
# shellcheck disable=SC2086
common="--synthetic $small --updates 1 --checkpoint-every 1 --telemetry-port-base 0 --device $device --seed 3"
# shellcheck disable=SC2086
timeout 300 "$py" -m fleet.cli train $common --local-batch 16 --run-dir "$runs/one" > "$out/same-one.log" 2>&1
check "one-rank run"
# shellcheck disable=SC2086
timeout 300 "$py" -m fleet.cli launch -n 2 --backend "$backend" $(ports) -- train $common --local-batches 10,6 \
  --run-dir "$runs/two" > "$out/same-two.log" 2>&1
check "two-rank run"
"$py" benchmarks/compare_runs.py "$runs/one" "$runs/two" --json > "$out/same-update.json"
check "same update"
cat "$out/same-update.json" >&2

step "2. live 10,6 run at the throughput configuration; console and report"
port=$(free_base)
# shellcheck disable=SC2086
"$py" -m fleet.cli launch -n 2 --backend "$backend" $(ports) -- train --synthetic $config --local-batches 10,6 \
  --updates 2000 --run-dir "$runs/live" --telemetry-port-base "$port" --checkpoint-every 0 \
  --log-every 20 --device "$device" > "$out/live.log" 2>&1 &
live=$!
for _ in $(seq 180); do  # until rank 0 has printed two progress lines (40 updates)
  lines=$(grep -c '^step ' "$out/live.log" 2>/dev/null || true)
  [ "${lines:-0}" -ge 2 ] && break
  sleep 1
done
fleet console --local -n 2 --run-dir "$runs/live" --port-base "$port" --once --json --timeout 60 \
  > "$out/console.json" 2> "$out/console.err"
check "console --once"
fleet telemetry send --run-dir "$runs/live" --port-base "$port" stop > "$out/stop.txt" 2>&1 || kill "$live"
wait "$live"
check "live run"
fleet report --json "$runs/live" > "$out/report.json" 2> "$out/report.err"
check "report"

step "3. scaling 1 -> 2 ranks at the throughput configuration (the backend's buckets, then 32 MiB)"
for buckets in default 32; do
  name=balance; extra=""
  [ "$buckets" = default ] || { name=balance-$buckets; extra="--allreduce-bucket-mb $buckets"; }
  # shellcheck disable=SC2086
  timeout 400 "$py" -m fleet.cli bench balance -n 2 --variant 16,16 --scaling $config \
    --updates "$updates" --warmup 3 --device "$device" --backend "$backend" \
    --starting-port "$(free_base)" --train-args="$extra" \
    --run-dir "$runs/$name" --json > "$out/$name.json" 2> "$out/$name.err"
  check "bench balance ($buckets)"
done

step "4. the gradient buffer all-reduced by MLX and by NCCL from PyTorch"
nbytes=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['variants'][0]['allreduce']['bytes'])" \
  "$out/balance.json" 2>/dev/null || echo 541065216)
timeout 120 "$py" -c "from mlx._distributed_utils.launch import main; main()" -n 2 --backend "$backend" $(ports) --python "$py" \
  --env "FLEET_BACKEND=$backend" benchmarks/allreduce.py --framework mlx --bytes "$nbytes" \
  > "$out/allreduce-mlx.json" 2> "$out/allreduce-mlx.err"
check "mlx all-reduce"
if [ "$device" = gpu ]; then
  timeout 120 "$py" -m torch.distributed.run --nproc-per-node 2 benchmarks/allreduce.py \
    --framework torch --bytes "$nbytes" > "$out/allreduce-torch.json" 2> "$out/allreduce-torch.err"
  check "torch all-reduce"
fi

if [ "$device" = gpu ]; then
  step "5. one GPU, bench throughput: MLX's CUDA graphs on (default) and off"
  for graphs in 1 0; do
    # shellcheck disable=SC2086
    MLX_USE_CUDA_GRAPHS=$graphs timeout 200 "$py" -m fleet.cli bench throughput $config \
      --local-batch 16 --updates 20 --warmup 3 --json > "$out/throughput-graphs$graphs.json" \
      2> "$out/throughput-graphs$graphs.err"
    check "throughput (graphs $graphs)"
  done
fi

step "summary"
"$py" benchmarks/two_gpu_table.py "$out" | tee "$out/summary.txt"
exit $failed
