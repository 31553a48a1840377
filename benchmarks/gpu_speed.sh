#!/usr/bin/env bash
# Issue 23 on one GPU in one call (MLX staged as ../shared/device/README.md says): the fused
# QK-norm + rotary kernel checked against the plain path, each speed lever against its absence
# in three interleaved rounds at issue 12's configuration (depth 12, width 768, 12 heads, vocab
# 32768, seq 1024, batch 16, mixed), ours against torch.compile in the same rounds, and the
# profile's pieces (benchmarks/gpu_speed.py says what each section does).
#
#   bash benchmarks/gpu_speed.sh [OUT_DIR]                         # about 5-8 minutes on an H200
#   GPU_SH_TINY=1 DEVICE=cpu bash benchmarks/gpu_speed.sh /tmp/gpu-speed   # the logic, tiny, CPU
#
# Writes $OUT/gpu-speed.json (every figure; rewritten after each section, so a cut run keeps
# what it measured), $OUT/gpu-speed.log (the tables), $OUT/gpu-speed.err (progress, stderr),
# $OUT/torch.err, $OUT/machine.txt, and $OUT/ptx.tgz (MLX's NVRTC cache: carry it as
# .gpu-ptx/ptx.tgz next time to skip about 100 s of kernel compilation).
# Knobs: DEADLINE_S (480: no new work after it), PYTHON, DEVICE (cpu: MLX and PyTorch on the
# CPU), GPU_SH_TINY, EXTRA (more gpu_speed.py flags, e.g. "--no-torch --rounds 2").
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/fleet-gpu-speed}}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
device=${DEVICE:-gpu}
deadline=${DEADLINE_S:-480}
flags=(--out "$out" --device "$device" --deadline-s "$deadline")
[ -n "${GPU_SH_TINY:-}" ] && flags+=(--tiny)
# shellcheck disable=SC2206  # EXTRA is a word list on purpose
flags+=(${EXTRA:-})

if [ -f .gpu-ptx/ptx.tgz ]; then  # MLX's kernels compiled by an earlier call (same MLX)
  tar xzf .gpu-ptx/ptx.tgz -C /tmp && echo "NVRTC cache from .gpu-ptx/ptx.tgz" >&2
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  "$py" -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" 2>&1
  "$py" -c "import torch; print('torch', torch.__version__)" 2>&1 | tail -1
} > "$out/machine.txt"
cat "$out/machine.txt" >&2

# The driver stops starting work at the deadline; the timeout is for a hang past it.
timeout $((deadline + 90)) "$py" benchmarks/gpu_speed.py "${flags[@]}" 2> >(tee "$out/gpu-speed.err" >&2)
rc=$?
[ $rc -eq 0 ] || echo "gpu_speed.py exited $rc (what it measured is in $out/gpu-speed.json)" >&2
if [ -d /tmp/mlx ]; then tar czf "$out/ptx.tgz" -C /tmp mlx 2> /dev/null || true; fi
exit $rc
