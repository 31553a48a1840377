#!/usr/bin/env bash
# Issues 20 and 23's closing figures on one GPU in one call (MLX staged as
# ../shared/device/README.md says): the speed levers against torch.compile (gpu_speed.py's
# levers: issue 12's update, today's defaults, the defaults without --overlap), then
# three interleaved pairs of `fleet bench throughput` processes, the default (auto memory
# limit, trainer/run_ahead.py's 10 kernels a batch) against MLX's own unlimited behaviour (no
# limit, MLX_MAX_OPS_PER_BUFFER=100), at issue 12's configuration, mixed; then the live sets
# (the peak under a tight limit) of ours (bf16, mixed) and of mlx-lm's trainer (bf16) at
# both run-aheads (mlx-lm from .gpu-b/ as gpu_memory.sh installs it).
#
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/gpu_policy.sh OUT_DIR       # about 6-7 minutes
#   GPU_SH_TINY=1 DEVICE=cpu bash benchmarks/gpu_policy.sh /tmp/gpu-policy   # the logic, CPU
#
# PARTS (default "speed pairs live"; "ops" compares run-ahead settings, "slope" the peak
# per sample against mlx-lm's) picks the parts;
# PAIR_ARMS="default unlimited torch" adds torch.compile's process to each pair's round.
# Writes OUT/speed/ (gpu_speed.sh's files), OUT/pair-N-ARM.json (`fleet bench throughput
# --json`'s figures, torch_reference.py's for torch) and OUT/live-*.json, each with its .err.
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
parts=${PARTS:-speed pairs live}
variants=product,defaults,defaults-no-overlap
if [[ " $parts " == *" speed "* ]]; then
  DEADLINE_S=${SPEED_DEADLINE_S:-200} EXTRA="--sections levers --profile-s 0 --variants $variants" \
    bash benchmarks/gpu_speed.sh "$out/speed" > "$out/speed.log" 2>&1
  tail -12 "$out/speed/gpu-speed.log" 2> /dev/null
fi

thr="$py -m fleet.cli bench throughput --updates 10 --warmup 3 --json --no-breakdown --precision mixed"
# One `fleet bench throughput` process an arm: "default" (auto limit, run_ahead.py's setting),
# "unlimited" (MLX's own: no limit, 100 kernels a batch) or N (N kernels a batch, auto limit);
# or "torch" (torch_reference.py --compile, the same model and update).
run_arm() {
  case $1 in
    # shellcheck disable=SC2086
    torch) $py benchmarks/torch_reference.py $config --compile --updates 10 --warmup 5 --json \
      > "$2.json" 2> "$2.err" ;;
    # shellcheck disable=SC2086  # word lists on purpose
    default) $thr $config > "$2.json" 2> "$2.err" ;;
    # shellcheck disable=SC2086
    unlimited) MLX_MAX_OPS_PER_BUFFER=100 $thr $config --memory-limit-gb 0 > "$2.json" 2> "$2.err" ;;
    # shellcheck disable=SC2086
    *) MLX_MAX_OPS_PER_BUFFER=$1 $thr $config > "$2.json" 2> "$2.err" ;;
  esac
}

# rounds PREFIX COUNT ARM...: COUNT rounds of every arm, the order rotating by one each round
# (two arms: interleaved pairs); OUT/PREFIX-ROUND-ARM.json.
rounds() {
  local prefix=$1 count=$2 round i arm
  shift 2
  local arms=("$@")
  for round in $(seq 1 "$count"); do
    for i in "${!arms[@]}"; do
      arm=${arms[$(((i + round - 1) % ${#arms[@]}))]}
      run_arm "$arm" "$out/$prefix-$round-$arm"
      echo "$prefix $round $arm: exit $?" >&2
    done
  done
}

if [[ " $parts " == *" pairs "* || " $parts " == *" ops "* ]]; then
  run_arm default "$out/warm" # a first process warms the GPU and the caches: not counted
fi
# PAIR_ARMS (default "default unlimited"; "default unlimited torch" adds torch.compile's
# process to each round)
# shellcheck disable=SC2086  # PAIR_ARMS is a word list
[[ " $parts " == *" pairs "* ]] && rounds pair 3 ${PAIR_ARMS:-default unlimited}
# Run-ahead settings under the auto limit against MLX unlimited (OPS_LIST, default "10 20 30";
# ROUNDS, default 3).
# shellcheck disable=SC2086  # OPS_LIST is a word list
[[ " $parts " == *" ops "* ]] && rounds ops "${ROUNDS:-3}" unlimited ${OPS_LIST:-10 20 30}

[[ " $parts " == *" live "* || " $parts " == *" slope "* ]] || exit 0
lm_wheel=$(ls .gpu-b/mlx_lm-*.whl 2> /dev/null | head -1)
if ! "$py" -c "import mlx_lm" 2> /dev/null && [ -n "$lm_wheel" ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$lm_wheel"
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
lm="$py benchmarks/mlx_lm_reference.py --updates 6 --warmup 2 --json --precision bf16"
[ -n "${GPU_SH_TINY:-}" ] && lm="$lm --device cpu"
# The peak per sample: ours (the default, mixed) and mlx-lm's trainer (bf16, no limit: its
# default) at each of SLOPE_BATCHES (default "4 8 16"); OUT/slope-{ours,lm}-B.json.
if [[ " $parts " == *" slope "* ]]; then
  for b in ${SLOPE_BATCHES:-4 8 16}; do
    # shellcheck disable=SC2086  # the later --local-batch wins
    $thr $config --local-batch "$b" > "$out/slope-ours-$b.json" 2> "$out/slope-ours-$b.err"
    echo "slope ours $b: exit $?" >&2
    # shellcheck disable=SC2086
    $lm $config --local-batch "$b" > "$out/slope-lm-$b.json" 2> "$out/slope-lm-$b.err"
    echo "slope mlx-lm $b: exit $?" >&2
  done
fi
[[ " $parts " == *" live "* ]] || exit 0
for ops in 10 100; do
  # shellcheck disable=SC2086
  MLX_MAX_OPS_PER_BUFFER=$ops $lm $config --memory-limit-gb tight > "$out/live-lm-bf16-ops$ops.json" 2> "$out/live-lm-bf16-ops$ops.err"
  echo "mlx-lm bf16 tight, ops $ops: exit $?" >&2
done
# shellcheck disable=SC2086
$thr $config --precision bf16 > "$out/live-ours-bf16.json" 2> "$out/live-ours-bf16.err"
echo "ours bf16 default: exit $?" >&2
