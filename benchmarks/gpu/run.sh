#!/usr/bin/env bash
# Runs the GPU benchmark with the unpacked node (build.sh) and the bundle (bundle.mjs) when present,
# else with `node` and the unbundled run.mjs (which needs the benchmarks package built). Arguments
# go to run.mjs (see --help); with `serving` as the first argument, the rest go to serving.mjs
# instead (the serving benchmarks, see its --help).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
node_bin="$here/.node/node"
[ -x "$node_bin" ] || node_bin=$(command -v node)
script=run
if [ "${1:-}" = serving ]; then script=serving; shift; fi
entry="$here/../dist/gpu/$script.cjs"
[ -f "$entry" ] || entry="$here/$script.mjs"
exec "$node_bin" "$entry" "$@"
