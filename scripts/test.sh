#!/usr/bin/env bash
# Quick start, second command: set up (pnpm, dependencies, native build) and run every test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pnpm() { bash scripts/pnpm.sh "$@"; }
# The dashboard test renders the page in headless Chromium (Debian's package).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "hydra: installing Debian's chromium for the dashboard test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >&2
fi
# The engine's /metrics test runs `promtool check metrics` (Debian's prometheus package).
if ! command -v promtool >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "hydra: installing Debian's prometheus (promtool) for the metrics test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus) >&2
fi
pnpm install --frozen-lockfile --reporter=append-only
rm -f packages/*/test-results.json apps/*/test-results.json tests/*/test-results.json benchmarks/test-results.json
status=0
pnpm exec turbo run test --continue --output-logs=full || status=$?
node scripts/test-summary.mjs || status=$((status == 0 ? 1 : status))
exit $status
