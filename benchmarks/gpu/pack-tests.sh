#!/usr/bin/env bash
# Packs what the native-ggml test suite needs on the device machine, which has no registry and no
# node_modules: the installed node_modules (less the lint, build and engine-only tools) and every
# package's dist/, into .carry/gpu-test.tar.xz (about 15 MB). Run after `pnpm install && pnpm build`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
mkdir -p .carry
skip=(@biomejs '@turbo' 'turbo@' 'typescript@' 'openai@' 'postject@' '@types+node')
excludes=()
for s in "${skip[@]}"; do excludes+=(--exclude="node_modules/.pnpm/${s}*"); done
tar "${excludes[@]}" -cf - node_modules packages/*/node_modules packages/*/dist | xz -T0 -6 > .carry/gpu-test.tar.xz
echo "pack-tests.sh: wrote .carry/gpu-test.tar.xz ($(du -h .carry/gpu-test.tar.xz | cut -f1))"
