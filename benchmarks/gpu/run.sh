#!/usr/bin/env bash
# Runs the GPU benchmark with the unpacked node (build.sh) and the bundle (bundle.mjs) when present,
# else with `node` and the unbundled run.mjs. Arguments go to run.mjs (see --help).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
node_bin="$here/.node/node"
[ -x "$node_bin" ] || node_bin=$(command -v node)
entry="$here/../dist/gpu/run.cjs"
[ -f "$entry" ] || entry="$here/run.mjs"
exec "$node_bin" "$entry" "$@"
