#!/usr/bin/env bash
# Builds what `benches/gpu_session.sh` runs on a GPU machine that has no cargo, on the
# development machine, and packs it into .gpu/bin.tar.xz (the folder is ignored by git; name it
# in the device call's `carry`): the `xfmr` program and the `workloads` example (release, with
# the flex, wgpu and cuda backends), and the attention and block test binaries with their CUDA
# tests. One cargo invocation, so that burn is compiled once, with one set of features, for all
# of them. What travels to a device machine is limited to 64 MiB,
# the repository included (the archive was about 45 MB on 2026-11-27).
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(-p xfmr -p xfmr-cli -p xfmr-attention -p xfmr-blocks)
features=xfmr/flex,xfmr/wgpu,xfmr/cuda,xfmr-cli/wgpu,xfmr-cli/cuda,xfmr-attention/cuda,xfmr-blocks/cuda
# The paths of what was built, from cargo's JSON messages.
built=$(cargo build --release "${packages[@]}" --features "$features" --example workloads \
  --bin xfmr --test attention --test blocks --message-format json-render-diagnostics \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], "test" if m["profile"]["test"] else "run", m["executable"])')
rm -rf .gpu/target .gpu/tests && mkdir -p .gpu/target/release/examples .gpu/tests
while read -r name kind path; do
  case "$name $kind" in
    "xfmr run") cp "$path" .gpu/target/release/ ;;
    "workloads run") cp "$path" .gpu/target/release/examples/ ;;
    "attention test" | "blocks test") cp "$path" ".gpu/tests/$name" ;;
  esac
done <<< "$built"
strip .gpu/target/release/xfmr .gpu/target/release/examples/workloads .gpu/tests/*
(cd .gpu && tar -cf - target tests | xz -9 -T2 > bin.tar.xz && rm -r target tests)
ls -l .gpu/bin.tar.xz
