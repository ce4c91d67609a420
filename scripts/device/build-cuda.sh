#!/usr/bin/env bash
# On the device machine (no network, no Node): unpack the carried Node binary and pinned llama.cpp
# source, then build native-ggml (addon + stock tools) with CUDA for sm_90 using plain cmake, since
# node_modules (cmake-js) does not travel. Usage: bash scripts/device/build-cuda.sh [jobs]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
jobs=${1:-16}
mkdir -p /tmp/hydra-node/bin
if [ ! -x /tmp/hydra-node/bin/node ]; then
  xz -dc .carry/node.xz > /tmp/hydra-node/bin/node
  chmod +x /tmp/hydra-node/bin/node
fi
nat=packages/native-ggml
if [ ! -f "$nat/upstream/CMakeLists.txt" ]; then
  mkdir -p "$nat/upstream"
  tar xJf .carry/upstream.tar.xz -C "$nat/upstream"
fi
cmake -S "$nat" -B "$nat/build-cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_JS_INC=$root/.carry/napi/node-api-headers;$root/.carry/napi/node-addon-api" \
  "-DNODE_ADDON_API_DIR=$root/.carry/napi/node-addon-api" \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${HYDRA_CUDA_ARCHS:-90}" \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON > /tmp/hydra-cmake.log
cmake --build "$nat/build-cuda" -j "$jobs"
ls -la "$nat/build-cuda/bin/hydra_ggml.node"
