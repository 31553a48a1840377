#!/usr/bin/env bash
# The GPU comparison in one command: the trainer's update (MLX on CUDA) against the same model
# in PyTorch, eager and torch.compile, on the same machine in the same run; prints one table.
#
#   bash benchmarks/gpu.sh [OUT_DIR]        # MLX installed (see ../shared/device/README.md)
#
# Configuration of issue 6 unless overridden: CONFIG="--depth 12 --width 768 ..." bash ...
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/fleet-gpu}}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
config=${CONFIG:-"--depth 12 --width 768 --heads 12 --vocab 32768 --seq-len 1024 --local-batch 16 --accum 1"}
updates=${UPDATES:-20}
py=${PYTHON:-python3}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
: > "$out/results.jsonl"
run() {  # label, command...
  local label=$1; shift
  echo "== $label: $*" >&2
  if "$@" > "$out/$label.json" 2> "$out/$label.err"; then
    $py -c "import json,sys; d=json.load(open(sys.argv[1])); d['label']=sys.argv[2]; print(json.dumps(d))" \
      "$out/$label.json" "$label" >> "$out/results.jsonl"
  else
    echo "   failed: $(tail -3 "$out/$label.err")" >&2
  fi
}
# shellcheck disable=SC2086
run mlx-mixed $py -m fleet.cli bench throughput $config --precision mixed --updates "$updates" --warmup 3 --json
# shellcheck disable=SC2086
run torch-eager $py benchmarks/torch_reference.py $config --updates "$updates" --warmup 5 --json
# shellcheck disable=SC2086
run torch-compile $py benchmarks/torch_reference.py $config --updates "$updates" --warmup 5 --compile --json
for extra in ${EXTRA_MLX:-}; do  # optional variants, e.g. EXTRA_MLX="bf16"
  # shellcheck disable=SC2086
  run "mlx-$extra" $py -m fleet.cli bench throughput $config --precision "$extra" --updates "$updates" --warmup 3 --json
done
$py benchmarks/table.py "$out/results.jsonl" | tee "$out/table.txt"
