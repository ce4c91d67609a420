#!/usr/bin/env bash
# Quick start, first command: set up (pnpm, dependencies, native build) and run the engine demo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pnpm() { bash scripts/pnpm.sh "$@"; }
pnpm install --frozen-lockfile --reporter=append-only
pnpm exec turbo run build --output-logs=errors-only
node apps/engine/dist/cli.js demo "$@"
