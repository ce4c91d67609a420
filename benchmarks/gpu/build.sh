#!/usr/bin/env bash
# Builds native-ggml with CUDA on the device machine with plain cmake (no node_modules, no cmake-js):
# the hydra_ggml addon and the stock upstream tools (llama-bench, ggml-rpc-server, llama-simple, and
# with HYDRA_SERVER_TOOLS the serving anchors llama-server and llama-batched-bench) from the same
# pinned, patched llama.cpp, into packages/native-ggml/build-cuda/bin/. Also unpacks the
# carried node binary. Stops by itself before --budget-s (default 540 s); run it again to continue:
# the build is incremental. Usage: bash benchmarks/gpu/build.sh [--jobs N] [--archs 90] [--budget-s S]
#
# Carried (git-ignored) inputs, relative to the repository root; see benchmarks/README.md:
#   .carry/node.xz                       xz-compressed `node` (v20) executable
#   .carry/napi/node-api-headers/include Node-API C headers (node_api.h, js_native_api.h, ...)
#   .carry/napi/node-addon-api           node-addon-api's folder (napi.h, napi-inl.h, ...)
#   .carry/llama.cpp.tar.xz              packages/native-ggml/upstream/ already cloned and patched
#                                        (entries start with `upstream/`); only when upstream/ is absent
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
pkg="$root/packages/native-ggml"
carry="${HYDRA_CARRY_DIR:-$root/.carry}"
jobs=$(nproc)
archs=90
budget=540
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs=$2; shift 2 ;;
    --archs) archs=$2; shift 2 ;;
    --budget-s) budget=$2; shift 2 ;;
    *) echo "build.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
say() { echo "[$(( $(date +%s) - start ))s] build.sh: $*" >&2; }

# 1. node: benchmarks/gpu/.node/node (git-ignored, kept between calls on a warm machine).
node_bin="$root/benchmarks/gpu/.node/node"
if [ ! -x "$node_bin" ]; then
  if [ -f "$carry/node.xz" ]; then
    mkdir -p "$(dirname "$node_bin")"
    if command -v xz >/dev/null; then xz -dc "$carry/node.xz" > "$node_bin.tmp"
    else python3 -c 'import lzma,sys,shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$carry/node.xz" "$node_bin.tmp"; fi
    chmod +x "$node_bin.tmp" && mv "$node_bin.tmp" "$node_bin"
    say "node $("$node_bin" --version) unpacked to $node_bin"
  elif command -v node >/dev/null; then
    say "no $carry/node.xz; using $(command -v node)"
  else
    say "no node: carry .carry/node.xz"; exit 1
  fi
fi

# 2. upstream llama.cpp (patched) into packages/native-ggml/upstream/.
if [ ! -f "$pkg/upstream/CMakeLists.txt" ]; then
  tarball=$(ls "$carry"/llama.cpp.tar.* "$carry"/upstream.tar.* 2>/dev/null | head -n1 || true)
  [ -n "$tarball" ] || { say "packages/native-ggml/upstream/ is missing and no $carry/llama.cpp.tar.* to unpack"; exit 1; }
  first=$(tar -tf "$tarball" 2>/dev/null | head -n1 || true)  # head closes the pipe early: SIGPIPE is expected
  if [[ "$first" == upstream/* || "$first" == ./upstream/* ]]; then tar -xf "$tarball" -C "$pkg"
  else mkdir -p "$pkg/upstream" && tar -xf "$tarball" -C "$pkg/upstream" --strip-components=1; fi
  say "unpacked $tarball into $pkg/upstream"
fi
[ -f "$pkg/upstream/tools/rpc/rpc-server.cpp" ] || { say "$pkg/upstream lacks tools/rpc: wrong tarball?"; exit 1; }

# 3. Node-API headers (what cmake-js passes as CMAKE_JS_INC).
napi_h="$carry/napi/node-api-headers/include"
[ -d "$napi_h" ] || napi_h="$carry/napi/node-api-headers"  # the headers alone, without the package around them
addon_api="$carry/napi/node-addon-api"
for f in "$napi_h/node_api.h" "$addon_api/napi.h"; do
  [ -f "$f" ] || { say "missing $f (carry the Node-API headers, see benchmarks/README.md)"; exit 1; }
done

# 4. configure (cheap, every time) and an incremental build with a deadline.
out="$pkg/build-cuda"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ -f "$out/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}" "$out/CMakeCache.txt"; then
  rm -rf "$out"
fi
command -v nvcc >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"
say "configuring CUDA (archs $archs) into $out"
cmake -S "$pkg" -B "$out" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_JS_INC=$napi_h;$addon_api" "-DNODE_ADDON_API_DIR=$addon_api" \
  -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DHYDRA_SERVER_TOOLS=ON \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON >"$out.configure.log" 2>&1 \
  || { tail -n 40 "$out.configure.log" >&2; exit 1; }
left=$(( budget - ($(date +%s) - start) ))
say "building with $jobs jobs, $left s left"
set +e
timeout "$left" cmake --build "$out" --parallel "$jobs" 2>&1 | grep -E --line-buffered '^\[ *[0-9]+/[0-9]+\]|^\[ *[0-9]+%\]|error|Error' | awk 'NR % 25 == 1 || /rror/' >&2
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" = 124 ]; then say "stopped at the budget; run build.sh again to continue (incremental)"; exit 3; fi
[ "$rc" = 0 ] || { say "build failed ($rc)"; exit 1; }
for f in hydra_ggml.node llama-bench ggml-rpc-server llama-simple llama-server llama-batched-bench; do
  [ -e "$out/bin/$f" ] || { say "missing $out/bin/$f"; exit 1; }
done
say "built: $(ls "$out/bin" | tr '\n' ' ')"
