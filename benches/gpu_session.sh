#!/usr/bin/env bash
# The GPU side of the main job (issue 28) on a lent NVIDIA machine that has no cargo: the
# release binaries and the GPU parity tests are built on the development machine and carried.
#
#   # on the development machine (burn compiled once with every feature):
#   cargo build --release -p xfmr -p xfmr-cli --example workloads --bin xfmr \
#       --features xfmr/flex,xfmr/wgpu,xfmr/cuda,xfmr-cli/wgpu,xfmr-cli/cuda
#   cargo test -p xfmr-attention -p xfmr-blocks --features xfmr-attention/cuda,xfmr-blocks/cuda \
#       --no-run   # prints the test binaries' paths: copy `tests/attention/main.rs`'s and
#                  # `tests/blocks/main.rs`'s to .gpu/tests/attention and .gpu/tests/blocks
#   mkdir -p .gpu/target/release/examples .gpu/tests && cp target/release/xfmr .gpu/target/release/ \
#       && cp target/release/examples/workloads .gpu/target/release/examples/ \
#       && strip .gpu/target/release/xfmr .gpu/target/release/examples/workloads .gpu/tests/* \
#       && (cd .gpu && tar -cf - target tests | xz -9 -T2 > bin.tar.xz && rm -r target tests)
#   # (what travels to the device is limited to 64 MiB, the repository included: the archive
#   # was 43.5 MB on 2026-11-27, the tracked files 14.5 MB; the 10,436 small files of
#   # fuzz/corpus tipped it over, so they were moved aside for the call)
#   # on the GPU machine, `.gpu` and `.gl` (the Vulkan loader's .deb, for wgpu) carried:
#   OUT=/tmp/out bash benches/gpu_session.sh bench          # parity tests, W1-W3
#   OUT=/tmp/out bash benches/gpu_session.sh train [MINUTES] # the full corpus on CUDA
#
# `bench`: the attention and block parity tests on wgpu (Vulkan) and CUDA against the PyTorch
#   fixtures; W1 and W3 side by side with PyTorch on CUDA (benches/compare_pytorch.py --device
#   cuda; one round, a dedicated machine); W1 again with burn's fused (flash) attention.
# `train`: the full corpus's translation run (docs/training.md's GPU recipe; the embedded set
#   is the whole corpus) on CUDA for MINUTES (default 4), then scored on the 500 test sentences.
# burn's GPU backends compile their kernels at run time and autotune them; `cubecl.toml`
# (written here) logs each compilation, so the logs say how much of a short run that is, and
# keeps the compiled kernels (PTX) and the autotune results under target/ for the later
# processes. Both caches go back as $OUT/cubecl-cache.tar.xz; put that file in .gpu/ and a
# later call starts from them instead of compiling and autotuning again (same GPU kind).
# Everything it prints is also written under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/xfmr-gpu-out}
mkdir -p "$OUT"
phase=${1:-bench}
minutes=${2:-4}
case "$phase" in
  bench | train) ;;
  *) echo "usage: benches/gpu_session.sh bench | train [MINUTES]" >&2; exit 2 ;;
esac
if [ -f .gpu/bin.tar.xz ] && [ ! -x .gpu/target/release/xfmr ]; then
  python3 -c "import tarfile; tarfile.open('.gpu/bin.tar.xz').extractall('.gpu')"
fi
export CARGO_TARGET_DIR=$PWD/.gpu/target
# cubecl keeps its caches in target/ beside the nearest Cargo.toml: the repository's.
if [ -f .gpu/cubecl-cache.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('.gpu/cubecl-cache.tar.xz').extractall('.')"
  echo "cubecl caches from an earlier call: $(find target/autotune target/cuda -type f 2>/dev/null | wc -l) files"
fi
xfmr=$CARGO_TARGET_DIR/release/xfmr
# burn reads cubecl.toml from the working directory up; it is removed again on exit.
trap 'rm -f cubecl.toml' EXIT
rm -f /tmp/cubecl-compile.log /tmp/cubecl-autotune.log
cat > cubecl.toml <<TOML
[compilation]
cache = "target"
[compilation.logger]
level = "basic"
file = "/tmp/cubecl-compile.log"
[autotune.logger]
level = "minimal"
file = "/tmp/cubecl-autotune.log"
TOML
compiled() {
  local kernels tuned
  kernels=$(grep -c 'Compiling' /tmp/cubecl-compile.log 2>/dev/null)
  tuned=$(grep -c 'Fastest' /tmp/cubecl-autotune.log 2>/dev/null)
  echo "kernels compiled so far: ${kernels:-0}, autotune results: ${tuned:-0}"
}

if ! ldconfig -p | grep -q libvulkan.so.1 && ls .gl/*.deb >/dev/null 2>&1; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
  nproc
} 2>&1 | tee "$OUT/machine-$phase.txt"

if [ "$phase" = bench ]; then
  echo "== parity tests on wgpu and CUDA"
  export XFMR_FIXTURES_DIR=$PWD/fixtures
  {
    timeout 75 .gpu/tests/attention --test-threads 1 parity_wgpu parity_cuda \
      cached_decoding_equals_full_causal_pass_on_wgpu cached_decoding_equals_full_causal_pass_on_cuda
    echo "attention tests exited $?"
    timeout 75 .gpu/tests/blocks --test-threads 1 transformer_parity_wgpu transformer_parity_cuda
    echo "blocks tests exited $?"
    compiled
  } 2>&1 | tee "$OUT/parity.txt"
  echo "== W1"
  # Separate invocations, so that one cut off by its limit leaves the others' tables. (W2 was
  # measured on 2026-11-26; W3 on CUDA only: wgpu's was measured then, CUDA's never finished.)
  timeout 90 python3 benches/compare_pytorch.py --prebuilt --device cuda --workloads w1 \
    --rounds 1 --iters 30 2>&1 | tee "$OUT/bench-w1.txt"
  for backend in cuda wgpu; do
    timeout 30 "$CARGO_TARGET_DIR/release/examples/workloads" w1 30 "$backend" fused
  done 2>&1 | tee "$OUT/bench-w1-fused.txt"
  compiled | tee -a "$OUT/bench-w1-fused.txt"
  echo "== W3"
  timeout 200 python3 benches/compare_pytorch.py --prebuilt --device cuda --workloads w3 \
    --backends cuda --rounds 1 --iters 20 --skip 20 2>&1 | tee "$OUT/bench-w3.txt"
  compiled | tee -a "$OUT/bench-w3.txt"
else
  echo "== full corpus on cuda, $minutes minutes"
  limit=$(awk -v m="$minutes" 'BEGIN { printf "%d", 60 * m + 150 }')
  start=$(date +%s)
  timeout "$limit" "$xfmr" train --backend cuda --data crates/xfmr-cli/data/es-en --out /tmp/long-cuda \
    --preset small --vocab-size 8000 --warmup 800 --max-tokens 16000 --eval-every 200 \
    --checkpoint-every 100 --minutes "$minutes" --test-sentences 500 > "$OUT/train-cuda.log" 2>&1
  echo "train (cuda) exited $? after $(( $(date +%s) - start )) s"
  compiled
  tail -40 "$OUT/train-cuda.log"
  for f in metrics.jsonl results.json loss-curve.png; do cp "/tmp/long-cuda/$f" "$OUT/cuda-$f" 2>/dev/null; done
fi
cp /tmp/cubecl-compile.log "$OUT/cubecl-compile-$phase.log" 2>/dev/null
cp /tmp/cubecl-autotune.log "$OUT/cubecl-autotune-$phase.log" 2>/dev/null
caches=$(ls -d target/autotune target/cuda 2>/dev/null)
if [ -n "$caches" ]; then
  # shellcheck disable=SC2086
  tar -cJf "$OUT/cubecl-cache.tar.xz" $caches && ls -l "$OUT/cubecl-cache.tar.xz"
fi
true
