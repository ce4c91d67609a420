#!/usr/bin/env bash
# Quick start, second command: set up (pnpm, dependencies, native build) and run every test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pnpm() { bash scripts/pnpm.sh "$@"; }
pnpm install --frozen-lockfile --reporter=append-only
rm -f packages/*/test-results.json apps/*/test-results.json benchmarks/test-results.json
status=0
pnpm exec turbo run test --continue --output-logs=full || status=$?
node scripts/test-summary.mjs || status=$((status == 0 ? 1 : status))
exit $status
