#!/usr/bin/env bash
# The GPU side of the main job (issue 28) in one call on a lent NVIDIA machine that has no cargo:
# the release binaries are built on the development machine and carried over.
#
#   # on the development machine (one build, burn compiled once with every feature):
#   cargo build --release -p xfmr -p xfmr-cli --example workloads --bin xfmr \
#       --features xfmr/flex,xfmr/wgpu,xfmr/cuda,xfmr-cli/wgpu,xfmr-cli/cuda
#   mkdir -p .gpu/target/release/examples && cp target/release/xfmr .gpu/target/release/ \
#       && cp target/release/examples/workloads .gpu/target/release/examples/ \
#       && strip .gpu/target/release/xfmr .gpu/target/release/examples/workloads \
#       && cp ../shared/data/bible_es_en.tsv .gpu/ \
#       && (cd .gpu && tar -cJf bin.tar.xz target bible_es_en.tsv && rm -r target bible_es_en.tsv)
#   # (140 MB stripped, 25 MB compressed: what travels to the device is limited to 64 MiB)
#   # on the GPU machine, `.gpu` and `.gl` (the Vulkan loader's .deb, for wgpu) carried:
#   OUT=/tmp/out bash benches/gpu_session.sh [TRAIN_MINUTES]
#
# 1. W1-W3 side by side with PyTorch on CUDA (benches/compare_pytorch.py --device cuda): xfmr on
#    wgpu and on burn's CUDA backend, one round (a dedicated machine: no drift to alternate
#    out), warm-up steps left out since both GPU backends compile kernels for each new shape.
# 2. The full corpus's translation run (docs/training.md's GPU recipe) on CUDA for
#    TRAIN_MINUTES (default 3), then scored on the 500 test sentences; on wgpu instead when
#    the CUDA run fails at once (a missing NVRTC, say).
# Everything it prints is also written under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/xfmr-gpu-out}
mkdir -p "$OUT"
minutes=${1:-3}
if [ -f .gpu/bin.tar.xz ] && [ ! -x .gpu/target/release/xfmr ]; then
  python3 -c "import tarfile; tarfile.open('.gpu/bin.tar.xz').extractall('.gpu')"
fi
export CARGO_TARGET_DIR=$PWD/.gpu/target
xfmr=$CARGO_TARGET_DIR/release/xfmr

if ! ldconfig -p | grep -q libvulkan.so.1 && ls .gl/*.deb >/dev/null 2>&1; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
  nproc
} 2>&1 | tee "$OUT/machine.txt"

echo "== W1-W3"
# Two invocations, so that one cut off by its limit leaves the other's table.
timeout 100 python3 benches/compare_pytorch.py --prebuilt --device cuda --workloads w1 w2 \
  --rounds 1 --iters 30 2>&1 | tee "$OUT/bench-w1w2.txt"
timeout 150 python3 benches/compare_pytorch.py --prebuilt --device cuda --workloads w3 \
  --rounds 1 --iters 30 --skip 30 2>&1 | tee "$OUT/bench-w3.txt"

echo "== full corpus on cuda, $minutes minutes"
"$xfmr" prepare-data .gpu/bible_es_en.tsv --max-chars 100000 --out /tmp/full 2>&1 | tail -3
limit=$(awk -v m="$minutes" 'BEGIN { printf "%d", 60 * m + 120 }')
train() {
  timeout "$limit" "$xfmr" train --backend "$1" --data /tmp/full --out "/tmp/long-$1" \
    --preset small --vocab-size 8000 --warmup 800 --max-tokens 16000 --eval-every 200 \
    --checkpoint-every 100 --minutes "$minutes" --test-sentences 500 > "$OUT/train-$1.log" 2>&1
}
backend=cuda
start=$(date +%s)
train cuda
status=$?
echo "train (cuda) exited $status after $(( $(date +%s) - start )) s"
if [ "$status" != 0 ] && [ $(( $(date +%s) - start )) -lt 90 ]; then
  tail -20 "$OUT/train-cuda.log"
  backend=wgpu
  start=$(date +%s)
  train wgpu
  echo "train (wgpu) exited $? after $(( $(date +%s) - start )) s"
fi
tail -40 "$OUT/train-$backend.log"
for f in metrics.jsonl results.json loss-curve.png; do cp "/tmp/long-$backend/$f" "$OUT/$backend-$f" 2>/dev/null; done
true
