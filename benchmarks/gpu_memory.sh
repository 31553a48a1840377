#!/usr/bin/env bash
# Issue 20 on one GPU in one call (MLX staged as ../shared/device/README.md says; mlx-lm from
# .gpu-mlx-lm/ or .gpu-b/ as gpu.sh): at issue 12's configuration, the default peak and the
# live set, ours (mixed, bf16) against mlx-lm's trainer (no limit, its live set, and under our
# bf16 run's limit), tokens/s, three interleaved pairs default against no limit, the peak's
# slope per sample (batch 4, 8, 16) for ours and mlx-lm's, and the fused loss head against
# the plain one (alone, and in the whole update). Both sides of every comparison in this call.
#
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/gpu_memory.sh [OUT_DIR]     # about 7 minutes
#   GPU_SH_TINY=1 bash benchmarks/gpu_memory.sh /tmp/gpu-mem              # the logic, tiny, CPU
#
# Writes $OUT/gpu-memory.json (every step's figures and the summary: benchmarks/
# memory_report.py) and $OUT/gpu-memory.log. Steps run in the order of what matters most;
# one that would end past DEADLINE_S (default 450 s after the start) is skipped and recorded so.
# Knobs: MODEL, BATCH (16), UPDATES (8), WARMUP (2), PYTHON, DEADLINE_S, WORK (per-step output).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/fleet-gpu-memory}}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:-$PWD}
if [ -n "${GPU_SH_TINY:-}" ]; then  # every configuration shrunk: checks the script, not the GPU
  model=${MODEL:-"--depth 2 --width 64 --heads 2 --vocab 4096 --seq-len 64"} batch=${BATCH:-4}
  small=1 mid=2 updates=${UPDATES:-2} warmup=${WARMUP:-1} heads="--rows 256 --width 64 --vocab 4096"
  lm_device="--device cpu"
else  # issue 12's configuration: 135.3M parameters, 16 x 1024 tokens a microstep
  model=${MODEL:-"--depth 12 --width 768 --heads 12 --vocab 32768 --seq-len 1024"} batch=${BATCH:-16}
  small=4 mid=8 updates=${UPDATES:-8} warmup=${WARMUP:-2}
  heads="--rows 16384 --width 768 --vocab 32768,8192 --chunks 1024,4096,16384"
  lm_device=""
fi
config="$model --local-batch $batch --accum 1"
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
steps="$work/steps.jsonl"
: > "$steps"
t0=$SECONDS
deadline=${DEADLINE_S:-450}

lm_wheel=$(ls .gpu-mlx-lm/mlx_lm-*.whl .gpu-b/mlx_lm-*.whl 2> /dev/null | head -1)
if ! "$py" -c "import mlx_lm" 2> /dev/null && [ -n "$lm_wheel" ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$lm_wheel"
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi

# step LABEL ESTIMATE_S COMMAND...: runs unless it would end past the deadline; its stdout is
# its JSON figures.
step() {
  local label=$1 est=$2; shift 2
  local start=$SECONDS rc=0
  if [ $((SECONDS - t0 + est)) -gt "$deadline" ]; then
    echo "== $(date +%T) $label: skipped (deadline)" >&2
    printf '{"label": "%s", "ok": false, "skipped": true}\n' "$label" >> "$steps"
    return
  fi
  echo "== $(date +%T) $label: $*" >&2
  timeout $((deadline - (SECONDS - t0) + 10)) "$@" > "$work/$label.out" 2> "$work/$label.err" || rc=$?
  "$py" benchmarks/memory_report.py step "$label" "$rc" $((SECONDS - start)) \
    "$work/$label.out" "$work/$label.err" >> "$steps"
  [ $rc -eq 0 ] || echo "   failed ($rc): $(tail -3 "$work/$label.err")" >&2
}
limit_of() {  # the memory limit (GiB) a finished step of ours set: auto's live set + 5%
  "$py" -c "import json,sys; r=json.load(open(sys.argv[1])); print((r.get('memory_limit_bytes') or 0)/2**30)" \
    "$work/$1.out" 2> /dev/null || echo 0
}

thr="$py -m fleet.cli bench throughput --updates $updates --warmup $warmup --json"
lm="$py benchmarks/mlx_lm_reference.py --updates $updates --warmup $warmup --json $lm_device"
# shellcheck disable=SC2086  # the configurations are word lists on purpose
{
  # 1. the default (auto) against mlx-lm's trainer: peaks, live sets, tokens/s
  step ours-mixed 90 $thr $config --precision mixed  # with the breakdown; compiles the kernels
  step ours-bf16 40 $thr $config --precision bf16 --no-breakdown
  step lm-bf16 60 $lm $config --precision bf16
  step lm-bf16-tight 70 $lm $config --precision bf16 --memory-limit-gb tight
  # 2. three interleaved pairs, default against no limit (the order turned each pair)
  for pair in 1 2 3; do
    if [ $((pair % 2)) = 1 ]; then order="default unlimited"; else order="unlimited default"; fi
    for arm in $order; do
      m=$([ "$arm" = default ] && echo auto || echo 0)
      step "pair-$pair-$arm" 25 $thr $config --precision mixed --no-breakdown --memory-limit-gb "$m"
    done
  done
  # 3. the fused head against the plain one in the whole update (the default's speed)
  step ours-bf16-plain-head 30 $thr $config --precision bf16 --no-breakdown --loss-head plain
  # 4. the peak per sample: ours (default) and mlx-lm's (no limit) at two more batches
  for b in $small $mid; do
    step "slope-ours-b$b" 25 $thr $model --local-batch "$b" --accum 1 --precision mixed --no-breakdown
  done
  for b in $small $mid; do
    step "slope-lm-b$b" 45 $lm $model --local-batch "$b" --accum 1 --precision bf16
  done
  # 5. the head alone: plain, the default chunks, other chunk sizes
  step heads 45 env PYTHONPATH="$PYTHONPATH" $py benchmarks/loss_heads.py $heads --dtype bf16 --json
  # 6. mlx-lm under the limit our bf16 run set (its peak held to the same figure)
  step lm-bf16-same 60 $lm $config --precision bf16 --memory-limit-gb "$(limit_of ours-bf16)"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  "$py" -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" 2>&1
} > "$work/machine.txt"
"$py" benchmarks/memory_report.py report "$steps" "$out/gpu-memory.json" \
  --elapsed $((SECONDS - t0)) --config "$config" --machine "$work/machine.txt" | tee "$out/gpu-memory.log"
