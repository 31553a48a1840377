#!/usr/bin/env bash
# Issue 12 on one GPU in one script (MLX staged as ../shared/device/README.md says): where the
# memory goes, activation checkpointing, the largest batch under 16 GiB, CUDA graphs on/off in
# interleaved pairs, and both sides of every comparison (mlx-lm's own trainer, PyTorch eager and
# torch.compile) in the same call, with a GPU-vs-CPU loss-curve check.
#
#   bash benchmarks/gpu.sh [OUT_DIR]          # both parts (about 15 minutes on an H200)
#   PART=1 bash benchmarks/gpu.sh $OUT        # speed: breakdowns, CUDA graphs, mlx-lm, torch
#   PART=2 bash benchmarks/gpu.sh $OUT        # memory: checkpointing, loss chunks, batch, curves
#   GPU_SH_TINY=1 DEVICE=cpu bash benchmarks/gpu.sh /tmp/gpu-sh   # the logic, tiny, on a CPU
#
# A device call may last 10 minutes: run PART=1 and PART=2 as two calls on the warm machine.
# Each part stops starting steps when the next would pass DEADLINE_S (default 500 s after its
# start) and still writes what it has: $OUT/gpu-part<P>.json (every step's figures and the
# summary: ratios to torch.compile, the CUDA-graphs pairs, checkpointing's activation and time
# ratios, the largest batches, the loss curves) and $OUT/gpu-part<P>.log (the same as tables).
# mlx-lm: installed from .gpu-mlx-lm/ (or .gpu-b/) mlx_lm-*.whl into /tmp/site when it is not
# importable (its wheel: pip download --no-deps mlx-lm==0.32.2).
# Knobs: MODEL (model flags), BATCH (16), UPDATES, WARMUP, PYTHON, DEVICE (cpu: PyTorch on the CPU too), FIT_GB (16),
# LOSS_CHUNK (4096), DEADLINE_S, WORK (scratch folder; per-step JSON and stderr).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/fleet-gpu}}
part=${PART:-all}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
device=${DEVICE:-gpu}
if [ -n "${GPU_SH_TINY:-}" ]; then  # every configuration shrunk: checks the script, not the GPU
  model=${MODEL:-"--depth 2 --width 64 --heads 2 --vocab 512 --seq-len 64"} batch=${BATCH:-4}
  curve="--depth 2 --width 64 --heads 2 --seq-len 32 --vocab 256 --local-batch 2 --updates 4"
  updates=${UPDATES:-3} warmup=${WARMUP:-2} fit_gb=${FIT_GB:-0.05} chunk=${LOSS_CHUNK:-64}
else  # issue 12's configuration: 135.3M parameters, 16 x 1024 tokens a microstep
  model=${MODEL:-"--depth 12 --width 768 --heads 12 --vocab 32768 --seq-len 1024"} batch=${BATCH:-16}
  curve="--depth 4 --width 256 --heads 4 --seq-len 256 --vocab 512 --local-batch 8 --updates 12"
  updates=${UPDATES:-20} warmup=${WARMUP:-3} fit_gb=${FIT_GB:-16} chunk=${LOSS_CHUNK:-4096}
fi
config="$model --local-batch $batch --accum 1"
torch_device=$([ "$device" = cpu ] && echo "--device cpu" || echo "")
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"

lm_wheel=$(ls .gpu-mlx-lm/mlx_lm-*.whl .gpu-b/mlx_lm-*.whl 2> /dev/null | head -1)
if ! "$py" -c "import mlx_lm" 2> /dev/null && [ -n "$lm_wheel" ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$lm_wheel"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

run_part() {  # part number: the steps of that part, then its report
  local p=$1 t0=$SECONDS deadline=${DEADLINE_S:-500}
  local steps="$work/steps-$p.jsonl"
  : > "$steps"
  # step LABEL ESTIMATE_S COMMAND...: runs unless it would end past the deadline; its stdout's
  # last line is its JSON figures.
  step() {
    local label=$1 est=$2; shift 2
    local start=$SECONDS rc=0
    if [ $((SECONDS - t0 + est)) -gt "$deadline" ]; then
      echo "== $(date +%T) $label: skipped (deadline)" >&2
      printf '{"label": "%s", "ok": false, "skipped": true}\n' "$label" >> "$steps"
      return
    fi
    echo "== $(date +%T) $label: $*" >&2
    timeout $((deadline - (SECONDS - t0) + 5)) "$@" > "$work/$label.out" 2> "$work/$label.err" || rc=$?
    "$py" benchmarks/gpu_report.py step "$label" "$rc" $((SECONDS - start)) \
      "$work/$label.out" "$work/$label.err" >> "$steps"
    [ $rc -eq 0 ] || echo "   failed ($rc): $(tail -3 "$work/$label.err")" >&2
  }
  local thr="$py -m fleet.cli bench throughput $config --updates $updates --warmup $warmup --json"
  local lm="$py benchmarks/mlx_lm_reference.py $config --updates $updates --warmup $warmup --json"
  local torch="$py benchmarks/torch_reference.py $config --updates $updates --warmup 5 --json"
  # shellcheck disable=SC2086  # the configurations are word lists on purpose
  if [ "$p" = 1 ]; then  # the comparisons first, so that a deadline skips the least
    step mlx-mixed 200 $thr --precision mixed  # the first run compiles MLX's kernels (NVRTC)
    step torch-compile 150 $torch $torch_device --compile
    step mlx-lm-bf16 60 $lm --precision bf16
    step mlx-bf16 60 $thr --precision bf16
    for pair in 1 2 3; do  # interleaved, the order turned each pair: on off, off on, on off
      if [ $((pair % 2)) = 1 ]; then order="on off"; else order="off on"; fi
      for g in $order; do
        step "graphs-$g-$pair" 40 $thr --precision mixed --no-breakdown --cuda-graphs "$g"
      done
    done
    step mlx-mixed-chunk 60 $thr --precision mixed --loss-chunk "$chunk"
    step torch-eager 60 $torch $torch_device
  else  # in the order of what matters most, so that a deadline skips the least
    step mlx-mixed 200 $thr --precision mixed
    step mlx-mixed-ckpt 60 $thr --precision mixed --grad-checkpoint
    local fit="$py benchmarks/largest_batch.py --memory-limit-gb $fit_gb --start $batch -- $model"
    step fit-mixed 90 $fit --precision mixed
    step fit-mixed-ckpt 90 $fit --precision mixed --grad-checkpoint
    step mlx-bf16 60 $thr --precision bf16
    step mlx-bf16-ckpt 60 $thr --precision bf16 --grad-checkpoint
    local train="$py -m fleet.cli train --synthetic $curve --precision mixed --telemetry-port-base 0"
    step curve-gpu 60 $train --run-dir "$work/curve-gpu"
    # The CPU side as far as 90 s take it (timeout ends it; the curve compares what it printed).
    step curve-cpu 95 timeout 90 $train --run-dir "$work/curve-cpu" --device cpu
    step levers 90 env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
      $py benchmarks/mlx_levers.py $model --local-batch "$batch" --precision mixed --loss-chunk "$chunk" --json
    step mlx-lm-bf16-ckpt 60 $lm --precision bf16 --grad-checkpoint
    step mlx-bf16-chunk 60 $thr --precision bf16 --loss-chunk "$chunk"
    step mlx-mixed-chunk-ckpt 60 $thr --precision mixed --loss-chunk "$chunk" --grad-checkpoint
    step fit-mixed-chunk-ckpt 90 $fit --precision mixed --loss-chunk "$chunk" --grad-checkpoint
  fi
  "$py" benchmarks/gpu_report.py report "$p" "$steps" "$out/gpu-part$p.json" \
    --elapsed $((SECONDS - t0)) --config "$config" | tee "$out/gpu-part$p.log"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  "$py" -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" 2>&1
} > "$work/machine.txt"
export GPU_SH_MACHINE="$work/machine.txt"
case "$part" in
  1 | 2) run_part "$part" ;;
  all) run_part 1; run_part 2 ;;
  *) echo "PART must be 1, 2 or all" >&2; exit 2 ;;
esac
