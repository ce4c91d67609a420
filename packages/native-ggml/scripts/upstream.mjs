// Fetches the pinned llama.cpp source from the npm registry and prepares it for the build.
//
// The source is the git bundle that node-llama-cpp ships (`llama/gitRelease.bundle`): fetched by
// exact version with `npm pack`, both the tarball and the bundle checked against pinned sha256
// sums, cloned into upstream/ (git-ignored) and patched with patches/*.patch. Nothing of upstream
// is committed. A second run reuses upstream/ when its stamp matches the pin and the patches.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const PIN = {
  package: 'node-llama-cpp',
  version: '3.21.1',
  tarballSha256: '7a231d6bafa14142a1cbed9893d4ec5bc6041b2a5f5939a623accaab4203c11f',
  bundlePath: 'package/llama/gitRelease.bundle',
  bundleSha256: '9336d8aab8f8e6a8919380f3641fe92e57b02fb55df1b6bd083b82491a6293b8',
  commit: '80fb11ac73e66d89eae2c6a91d8a77428fa733ed',
};

const pkgDir = join(dirname(fileURLToPath(import.meta.url)), '..');
const cacheDir = join(pkgDir, '.cache');
export const upstreamDir = join(pkgDir, 'upstream');
const patchesDir = join(pkgDir, 'patches');

function sha256(file) {
  return createHash('sha256').update(readFileSync(file)).digest('hex');
}

function run(cmd, args, opts = {}) {
  return execFileSync(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'], encoding: 'utf8', ...opts });
}

function fail(message) {
  console.error(`hydra native-ggml: ${message}`);
  process.exit(1);
}

function patchFiles() {
  return readdirSync(patchesDir)
    .filter((f) => f.endsWith('.patch'))
    .sort();
}

function stampFor() {
  const h = createHash('sha256').update(PIN.bundleSha256);
  for (const f of patchFiles()) h.update(f).update(readFileSync(join(patchesDir, f)));
  return h.digest('hex');
}

function fetchBundle() {
  mkdirSync(cacheDir, { recursive: true });
  const tarball = join(cacheDir, `${PIN.package}-${PIN.version}.tgz`);
  if (!existsSync(tarball) || sha256(tarball) !== PIN.tarballSha256) {
    console.error(`hydra native-ggml: fetching ${PIN.package}@${PIN.version} from the npm registry`);
    run('npm', ['pack', `${PIN.package}@${PIN.version}`, '--pack-destination', cacheDir, '--silent']);
  }
  const got = sha256(tarball);
  if (got !== PIN.tarballSha256) {
    fail(
      `checksum mismatch for ${tarball}: expected ${PIN.tarballSha256}, got ${got}. Delete it and retry; if it persists the registry copy changed and the pin must be reviewed.`,
    );
  }
  const bundle = join(cacheDir, 'gitRelease.bundle');
  if (!existsSync(bundle) || sha256(bundle) !== PIN.bundleSha256) {
    run('tar', ['-xzf', tarball, '-C', cacheDir, '--strip-components=2', PIN.bundlePath]);
  }
  const bundleSum = sha256(bundle);
  if (bundleSum !== PIN.bundleSha256) {
    fail(`checksum mismatch for the llama.cpp bundle: expected ${PIN.bundleSha256}, got ${bundleSum}`);
  }
  return bundle;
}

function headOf(dir) {
  try {
    return run('git', ['rev-parse', 'HEAD'], { cwd: dir }).trim();
  } catch {
    return '';
  }
}

export function prepareUpstream() {
  const stampFile = join(upstreamDir, '.hydra-stamp');
  const stamp = stampFor();
  if (existsSync(stampFile) && readFileSync(stampFile, 'utf8') === stamp) return upstreamDir;
  if (existsSync(join(upstreamDir, '.git')) && headOf(upstreamDir) === PIN.commit) {
    // Same pin, other patches: restore only the files the old patches touched, so the incremental
    // build recompiles those alone instead of the whole tree.
    console.error('hydra native-ggml: patches changed, re-patching upstream/');
    run('git', ['checkout', '--quiet', '--', '.'], { cwd: upstreamDir });
    run('git', ['clean', '-fdq'], { cwd: upstreamDir });
  } else {
    const bundle = fetchBundle();
    rmSync(upstreamDir, { recursive: true, force: true });
    console.error('hydra native-ggml: cloning the pinned llama.cpp bundle into upstream/');
    run('git', ['-c', 'advice.detachedHead=false', 'clone', '--quiet', bundle, upstreamDir]);
  }
  for (const patch of patchFiles()) {
    console.error(`hydra native-ggml: applying ${patch}`);
    try {
      run('git', ['apply', '--whitespace=nowarn', join(patchesDir, patch)], { cwd: upstreamDir });
    } catch {
      fail(`patch ${patch} does not apply to the pinned llama.cpp`);
    }
  }
  writeFileSync(stampFile, stamp);
  return upstreamDir;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) prepareUpstream();
