#!/usr/bin/env bash
# Issues 20 and 23's closing figures on one GPU in one call (MLX staged as
# ../shared/device/README.md says): the speed levers against torch.compile (gpu_speed.py's
# levers: today's defaults, the flat step as it first landed, the head's chunk sizes), then
# three interleaved pairs of `fleet bench throughput` processes, the default (auto memory
# limit, trainer/run_ahead.py's 10 kernels a batch) against MLX's own unlimited behaviour (no
# limit, MLX_MAX_OPS_PER_BUFFER=100), at issue 12's configuration, mixed.
#
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/gpu_policy.sh OUT_DIR       # about 6-7 minutes
#   GPU_SH_TINY=1 DEVICE=cpu bash benchmarks/gpu_policy.sh /tmp/gpu-policy   # the logic, CPU
#
# Writes OUT/speed/ (gpu_speed.sh's files) and OUT/pair-N-ARM.json (`fleet bench throughput
# --json`'s figures) with its .err.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD}
if [ -n "${GPU_SH_TINY:-}" ]; then
  config="--depth 2 --width 64 --heads 2 --vocab 4096 --seq-len 64 --local-batch 4 --accum 1"
else
  config="--depth 12 --width 768 --heads 12 --vocab 32768 --seq-len 1024 --local-batch 16 --accum 1"
fi
variants=product,defaults,defaults-repack,defaults-chunk-4096,defaults-chunk-8192
DEADLINE_S=${SPEED_DEADLINE_S:-200} EXTRA="--sections levers --profile-s 0 --variants $variants" \
  bash benchmarks/gpu_speed.sh "$out/speed" > "$out/speed.log" 2>&1
tail -12 "$out/speed/gpu-speed.log" 2> /dev/null

thr="$py -m fleet.cli bench throughput --updates 10 --warmup 3 --json --no-breakdown --precision mixed"
for pair in 1 2 3; do
  if [ $((pair % 2)) = 1 ]; then order="default unlimited"; else order="unlimited default"; fi
  for arm in $order; do
    f="$out/pair-$pair-$arm"
    if [ "$arm" = default ]; then
      # shellcheck disable=SC2086  # word lists on purpose
      $thr $config > "$f.json" 2> "$f.err"
    else
      # shellcheck disable=SC2086
      MLX_MAX_OPS_PER_BUFFER=100 $thr $config --memory-limit-gb 0 > "$f.json" 2> "$f.err"
    fi
    echo "pair $pair $arm: exit $?" >&2
  done
done
