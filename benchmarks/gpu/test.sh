#!/usr/bin/env bash
# Runs the native-ggml test suite on the device machine against the CUDA build (after build.sh, with
# .carry/gpu-test.tar.xz from pack-tests.sh). The loader picks build-cuda/ first and the tests use
# the stock tools beside it, so every comparison with upstream is CUDA against CUDA.
# Usage: bash benchmarks/gpu/test.sh [--out DIR]   (DIR gets the vitest JSON report and the log)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${2:-${OUT:-/tmp}}
mkdir -p "$out"
cd "$root"
[ -d node_modules/vitest ] || tar -xJf .carry/gpu-test.tar.xz
[ -f packages/native-ggml/build-cuda/bin/hydra_ggml.node ] || { echo "test.sh: run build.sh first" >&2; exit 1; }
export PATH=$root/benchmarks/gpu/.node:$PATH
cd packages/native-ggml
HYDRA_REQUIRE_NATIVE=1 node ../../node_modules/vitest/vitest.mjs run --reporter=default --reporter=json \
  --outputFile.json="$out/vitest-native-ggml-gpu.json" 2>&1 | tee "$out/vitest-native-ggml-gpu.log" | grep -E "×|FAIL|Test Files|Tests "
exit "${PIPESTATUS[0]}"
