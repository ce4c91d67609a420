// Shared by the engine's benchmark scripts: a figure from raw samples, a free loopback port, the
// flag readers and a bounded wait. Only node: builtins and native-ggml's addon-free ports module, so
// the esbuild bundles of the scripts (benchmarks/gpu/bundle.mjs) run without node_modules.
import { execSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { cpus, release, totalmem, type } from 'node:os';
import { join, resolve } from 'node:path';
import { freeLoopbackPort } from '@hydra-engine/native-ggml/ports';

/** The script's arguments. */
export const argv = process.argv.slice(2);

/** The value after `name` in the arguments, else `dflt`. */
export const one = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};

/** Every value after a repeated `name`. */
export const many = (name) => argv.flatMap((a, i) => (a === name ? [argv[i + 1]] : []));

/** `K=V` items as an environment object. */
export const envOf = (items) =>
  Object.fromEntries(items.map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));

/** Thrown by a `waitFor` check to end the wait at once (the process it waits for has died). */
export class FatalError extends Error {}

/**
 * The environment for an engine child. A bundled CLI (benchmarks/dist/gpu/cli.cjs) cannot find
 * native-ggml's build folders from its own path, so unless HYDRA_NATIVE_ADDON is set it is pointed
 * at the checkout's addon under the working directory, CUDA build first, as the loader orders them.
 */
export function engineEnv(extra = {}) {
  const env = { ...process.env, ...extra };
  if (!env.HYDRA_NATIVE_ADDON) {
    const found = ['build-cuda', 'build']
      .map((b) => join(process.cwd(), 'packages/native-ggml', b, 'bin/hydra_ggml.node'))
      .find((p) => existsSync(p));
    if (found) env.HYDRA_NATIVE_ADDON = found;
  }
  return env;
}

/** Polls `check` every `everyMs` until it resolves truthy; throws after `ms`, or at once on a {@link FatalError}. */
export async function waitFor(check, ms, what, everyMs = 25) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const ok = await check().catch((err) => {
      if (err instanceof FatalError) throw err;
      return false;
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`${what}: not within ${ms} ms`);
}

/** Median, p99 and mean of `samples`, with the ratio to `anchor`'s median when one is given. */
export function summary(name, unit, samples, anchor) {
  const s = [...samples].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
  const mean = s.reduce((x, y) => x + y, 0) / s.length;
  const fig = { name, unit, samples: s.length, median: q(0.5), p99: q(0.99), mean, anchor: null };
  if (anchor)
    fig.anchor = {
      name: anchor.name,
      median: anchor.median,
      p99: anchor.p99,
      ratio: fig.median / anchor.median,
    };
  return fig;
}

export const freePort = freeLoopbackPort;

/** The commit measured: --commit, else HYDRA_BENCH_COMMIT (a device copy has no .git), else git. */
export function commitOf() {
  const given = one('--commit') ?? process.env.HYDRA_BENCH_COMMIT;
  if (given) return given;
  try {
    return execSync('git rev-parse --short HEAD', {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
  } catch {
    return 'unknown';
  }
}

function gpus() {
  try {
    return execSync('nvidia-smi --query-gpu=name --format=csv,noheader', {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    })
      .split('\n')
      .map((g) => g.trim())
      .filter(Boolean);
  } catch {
    return [];
  }
}

/** A results file in the benchmarks' schema (benchmarks/src/schema.ts), which the dashboard reads. */
export function resultDoc(suite, figures, notes) {
  const g = gpus();
  return {
    schema: 1,
    suite,
    commit: commitOf(),
    machine: {
      cpu: cpus()[0]?.model ?? 'unknown',
      cores: cpus().length,
      memory_gib: Math.round(totalmem() / 2 ** 30),
      os: `${type()} ${release()}`,
      node: process.version,
      ...(g.length ? { gpus: g } : {}),
    },
    date: new Date().toISOString(),
    figures,
    skipped: [],
    notes,
  };
}

/**
 * The engine CLI: --cli, else apps/engine/dist/cli.js beside these scripts, else the device bundle's
 * cli.cjs (beside the bundled script, or benchmarks/dist/gpu/ under the working directory).
 */
export function engineCli() {
  const cli =
    one('--cli') ??
    [
      new URL('../dist/cli.js', import.meta.url).pathname,
      new URL('./cli.cjs', import.meta.url).pathname,
      resolve('benchmarks/dist/gpu/cli.cjs'),
    ].find((p) => existsSync(p));
  if (!cli) throw new Error('no engine CLI: build apps/engine, pass --cli, or run from benchmarks/dist/gpu');
  return cli;
}

/**
 * Starts an engine on free loopback ports (HTTP, and the merged port at `rpcPort` or a free one) and
 * resolves once it answers /health, and with `-m` in `flags` once the model is ready. An engine that
 * exits or fails its load ends the wait at once with its log.
 */
export async function startEngine(cli, flags, env = {}, rpcPort) {
  const port = await freePort();
  const rpc = rpcPort ?? (await freePort());
  const child = spawn(
    process.execPath,
    [cli, '--port', String(port), '--rpc-port', String(rpc), '--progress', 'off', ...flags],
    { stdio: ['ignore', 'ignore', 'pipe'], env: engineEnv(env) },
  );
  let log = '';
  child.stderr.on('data', (d) => {
    log = (log + d).slice(-8000);
  });
  const url = `http://127.0.0.1:${port}`;
  await waitFor(
    async () => {
      if (child.exitCode !== null) throw new FatalError(`engine exited: ${log.slice(-2000)}`);
      const h = await (await fetch(`${url}/health`)).json();
      if (h.state === 'error') throw new FatalError(`engine failed to load: ${log.slice(-2000)}`);
      return flags.includes('-m') ? h.state === 'ready' : true;
    },
    600_000,
    'engine start',
  );
  return { url, rpc: `127.0.0.1:${rpc}`, rpcPort: rpc, child, log: () => log };
}
