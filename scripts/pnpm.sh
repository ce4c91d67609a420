#!/usr/bin/env bash
# Runs the pinned pnpm, installing it with npm into .tools/ on first use: a fresh machine
# needs only Node and npm.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=$(node -p "require('$root/package.json').packageManager.split('@')[1]")
bin="$root/.tools/node_modules/.bin/pnpm"
if [ ! -x "$bin" ] || [ "$("$bin" --version 2>/dev/null)" != "$version" ]; then
  echo "hydra: installing pnpm@$version into .tools/" >&2
  mkdir -p "$root/.tools"
  npm install --prefix "$root/.tools" --no-save --no-package-lock --loglevel=error "pnpm@$version" >&2
fi
export PATH="$root/.tools/node_modules/.bin:$root/node_modules/.bin:$PATH"
exec "$bin" "$@"
