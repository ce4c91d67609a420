import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { freeLoopbackPort } from '@hydra-engine/native-ggml/ports';
import { sleep } from './wait.js';

/** The repository root (this file is packages/test-kit/dist/engine.js once built). */
export const REPO = fileURLToPath(new URL('../../../', import.meta.url)).replace(/\/$/, '');
/** The built `hydra-engine` CLI. */
export const CLI = `${REPO}/apps/engine/dist/cli.js`;

/** Runs the CLI as a process; resolves with its exit code and everything it wrote. */
export function runCli(
  args: readonly string[],
  timeoutMs = 20_000,
): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (d) => {
      out += d;
    });
    p.stderr.on('data', (d) => {
      out += d;
    });
    const timer = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

export interface SpawnEngineOptions {
  /** Serve a merged port (`--rpc-port`): on `rpcPort`, or on a free loopback port. */
  rpc?: boolean;
  rpcPort?: number;
  /** Variables besides this process's environment. */
  env?: Record<string, string>;
  /** How long the start (and, with `-m`, the load) may take; default 60 s. */
  timeoutMs?: number;
  /**
   * Resolve once `/health` reports `error` (a failed load kept up by `--keep-up-on-load-failure`)
   * instead of throwing on it; default false.
   */
  untilError?: boolean;
  /** The `--progress` mode (the engine refuses the flag twice); default `off`. */
  progress?: string;
}

/** How the process ended; `at` is `performance.now()` when its exit was seen. */
export interface EngineExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  at: number;
}

/** A `hydra-engine` process started by {@link spawnEngine}. */
export interface EngineProcess {
  child: ChildProcess;
  pid: number;
  url: string;
  httpPort: number;
  /** The merged port, as a number and as the `host:port` a head's `--rpc` takes. */
  rpcPort: number | undefined;
  rpc: string | undefined;
  /** Everything the engine wrote to stdout and stderr so far. */
  log(): string;
  /** What the engine wrote to stderr alone (its log lines, unmixed with stdout). */
  stderr(): string;
  /** Exit code and signal once the process is gone, undefined while it runs. */
  exited(): { code: number | null; signal: NodeJS.Signals | null } | undefined;
  /** Resolves when the process is gone. */
  exit: Promise<EngineExit>;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once the process is gone. */
  stop(graceMs?: number): Promise<void>;
}

/**
 * Spawns the real `hydra-engine` CLI on loopback (`--port 0`, the bound port read from its log)
 * and resolves once HTTP answers, the merged port (if asked for) listens, and, with `-m`,
 * `/health` says ready (with `untilError`: says error). It reads the engine's start lines, so the
 * log level must be info or lower. Throws, with the log, when the engine exits or (without
 * `untilError`) its state is `error` during the start, or at the time-out.
 */
export async function spawnEngine(
  flags: readonly string[],
  options: SpawnEngineOptions = {},
): Promise<EngineProcess> {
  // --rpc-port 0 means "off", so the merged port is one that was free a moment ago.
  const rpcPort =
    options.rpc || options.rpcPort !== undefined
      ? (options.rpcPort ?? (await freeLoopbackPort()))
      : undefined;
  const rpcFlags = rpcPort !== undefined ? ['--rpc-port', String(rpcPort)] : [];
  const child = spawn(
    process.execPath,
    [CLI, '--port', '0', '--progress', options.progress ?? 'off', ...rpcFlags, ...flags],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ...options.env },
    },
  );
  let out = '';
  let err = '';
  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  const gone = new Promise<EngineExit>((resolve) => {
    child.on('exit', (code, signal) => {
      exit = { code, signal };
      resolve({ code, signal, at: performance.now() });
    });
  });
  // A long soak must not grow these without bound; the start lines and the latest lines matter.
  const bounded = (text: string) =>
    text.length > 4_000_000 ? text.slice(0, 200_000) + text.slice(-1_000_000) : text;
  child.stdout!.on('data', (d: Buffer) => {
    out = bounded(out + d.toString());
  });
  child.stderr!.on('data', (d: Buffer) => {
    const text = d.toString();
    out = bounded(out + text);
    err = bounded(err + text);
  });
  const stop = async (graceMs = 5_000) => {
    if (exit) return;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await gone;
    clearTimeout(timer);
  };
  const deadline = Date.now() + (options.timeoutMs ?? 60_000);
  const wantModel = flags.includes('-m') || flags.includes('--model');
  let httpPort: number | undefined;
  let ready = false;
  let failed = false;
  while (!ready && Date.now() < deadline) {
    if (exit) throw new Error(`engine exited during start (${JSON.stringify(exit)}):\n${out}`);
    httpPort ??= Number(/HTTP on http:\/\/[^\s]+:(\d+)/.exec(out)?.[1]) || undefined;
    // HTTP listens before the merged port does: /health can answer while --rpc-port refuses.
    const rpcUp = rpcPort === undefined || /merged ggml-RPC\/Hydra port on /.test(out);
    if (httpPort !== undefined && rpcUp) {
      const h = await fetch(`http://127.0.0.1:${httpPort}/health`).then(
        (r) => r.json() as Promise<{ state?: string }>,
        () => undefined,
      );
      failed = h?.state === 'error' && options.untilError === true;
      if (failed) break;
      if (h?.state === 'error') {
        child.kill('SIGKILL');
        throw new Error(`engine failed to load:\n${out}`);
      }
      ready = h !== undefined && (!wantModel || h.state === 'ready');
    }
    if (!ready) await sleep(20);
  }
  if ((!ready && !failed) || httpPort === undefined) {
    child.kill('SIGKILL');
    throw new Error(`engine did not start in time:\n${out}`);
  }
  return {
    child,
    pid: child.pid!,
    url: `http://127.0.0.1:${httpPort}`,
    httpPort,
    rpcPort,
    rpc: rpcPort !== undefined ? `127.0.0.1:${rpcPort}` : undefined,
    log: () => out,
    stderr: () => err,
    exited: () => exit,
    exit: gone,
    stop,
  };
}

/** Engines started together and stopped together (a suite's `afterAll(() => group.stopAll())`). */
export interface EngineGroup {
  start(flags: readonly string[], options?: SpawnEngineOptions): Promise<EngineProcess>;
  /** Stops every engine of the group that still runs, at once (SIGTERM then SIGKILL). */
  stopAll(graceMs?: number): Promise<void>;
}

/** A group of {@link spawnEngine} processes, so that a failing test leaves none behind. */
export function engineGroup(): EngineGroup {
  const all: EngineProcess[] = [];
  return {
    async start(flags, options) {
      const e = await spawnEngine(flags, options);
      all.push(e);
      return e;
    },
    async stopAll(graceMs = 0) {
      await Promise.all(all.splice(0).map((e) => e.stop(graceMs)));
    },
  };
}
