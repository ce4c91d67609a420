import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { freeLoopbackPort as freePort } from '@hydra-engine/engine';
import { HydraClient, OPCODES, type OpcodeName } from '@hydra-engine/hydra-rpc';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';

export const REPO = join(dirname(fileURLToPath(import.meta.url)), '../../../..');
export const CLI = join(REPO, 'apps/engine/dist/cli.js');

/**
 * The tiny synthetic model, written once per machine: every file of the suite reuses it, so its
 * generation time is paid once.
 */
export async function tinyModel(): Promise<string> {
  const dir = join(tmpdir(), 'hydra-reliability');
  mkdirSync(dir, { recursive: true });
  const out = join(dir, 'tiny-q8_0-seed3.gguf');
  if (existsSync(out)) return out;
  const partial = `${out}.${process.pid}.part`;
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3, out: partial });
  renameSync(partial, out);
  return out;
}

export interface EngineProcess {
  proc: ChildProcess;
  pid: number;
  url: string;
  httpPort: number;
  rpcPort: number | undefined;
  /** Everything the engine wrote to stdout and stderr so far. */
  log(): string;
  /** Exit code and signal once the process is gone, undefined while it runs. */
  exited(): { code: number | null; signal: NodeJS.Signals | null } | undefined;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once the process is gone. */
  stop(graceMs?: number): Promise<void>;
}

/**
 * Spawns the real `hydra-engine` CLI (apps/engine/dist/cli.js) on ephemeral loopback ports and
 * waits until HTTP answers and, with a model, `/health` says ready.
 */
export async function spawnEngine(
  flags: string[],
  options: { timeoutMs?: number; rpc?: boolean; env?: Record<string, string> } = {},
): Promise<EngineProcess> {
  // --rpc-port 0 means "off", so the merged port gets a port that was free a moment ago.
  const rpcFlags = options.rpc ? ['--rpc-port', String(await freePort())] : [];
  const proc = spawn(process.execPath, [CLI, '--port', '0', '--progress', 'off', ...rpcFlags, ...flags], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...options.env },
  });
  let out = '';
  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  const gone = new Promise<void>((resolve) => {
    proc.on('exit', (code, signal) => {
      exit = { code, signal };
      resolve();
    });
  });
  const append = (d: Buffer) => {
    out += d.toString();
    // A long soak must not grow this without bound; the start lines and the latest lines matter.
    if (out.length > 4_000_000) out = out.slice(0, 200_000) + out.slice(-1_000_000);
  };
  proc.stdout!.on('data', append);
  proc.stderr!.on('data', append);
  const deadline = Date.now() + (options.timeoutMs ?? 60_000);
  const wantModel = flags.includes('-m') || flags.includes('--model');
  const wantRpc = options.rpc === true;
  let httpPort: number | undefined;
  let rpcPort: number | undefined;
  while (Date.now() < deadline) {
    if (exit) throw new Error(`engine exited during start (${JSON.stringify(exit)}):\n${out}`);
    httpPort ??= Number(/HTTP on http:\/\/[^:]+:(\d+)/.exec(out)?.[1]) || undefined;
    if (wantRpc)
      rpcPort ??= Number(/merged ggml-RPC\/Hydra port on [^\s]+:(\d+)/.exec(out)?.[1]) || undefined;
    const started = httpPort !== undefined && (!wantRpc || rpcPort !== undefined);
    if (started && (!wantModel || /model ready/.test(out))) break;
    if (
      /HYDRA_ERR_LOAD_FAILED|HYDRA_ERR_[A-Z_]+: /.test(out) &&
      started &&
      wantModel &&
      !/model ready/.test(out)
    )
      throw new Error(`engine failed to load:\n${out}`);
    await sleep(20);
  }
  if (httpPort === undefined || (wantModel && !/model ready/.test(out))) {
    proc.kill('SIGKILL');
    throw new Error(`engine did not start in time:\n${out}`);
  }
  return {
    proc,
    pid: proc.pid!,
    url: `http://127.0.0.1:${httpPort}`,
    httpPort,
    rpcPort,
    log: () => out,
    exited: () => exit,
    async stop(graceMs = 5_000) {
      if (exit) return;
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), graceMs);
      await gone;
      clearTimeout(timer);
    },
  };
}

export { freePort };

/**
 * Throws unless the engine's HELLO lists every opcode in `names`. A suite calls it before testing
 * what those opcodes serve, so an engine that stopped serving one fails the suite instead of
 * passing it by skipping.
 */
export async function requireOpcodes(rpcPort: number, ...names: OpcodeName[]): Promise<void> {
  const c = await HydraClient.connect({ port: rpcPort });
  try {
    const served = new Set((await c.hello()).opcodes as number[]);
    const missing = names.filter((n) => !served.has(OPCODES[n]));
    if (missing.length > 0) throw new Error(`the engine's HELLO does not list ${missing.join(', ')}`);
  } finally {
    await c.close();
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Resident set size of `pid` in bytes (VmRSS of /proc/PID/status). */
export function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? Number.NaN) * 1024;
}

/** Number of open file descriptors of `pid` (entries of /proc/PID/fd). */
export function openFds(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/** Parses Prometheus text into `name{labels}` -> value. */
export function parseMetrics(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return out;
}

export async function metrics(url: string): Promise<Map<string, number>> {
  const res = await fetch(`${url}/metrics`);
  return parseMetrics(await res.text());
}

export interface Health {
  state: string;
  epoch: number;
  slots: { total: number; busy: number; nCtxSeq: number };
  queue: number;
}

export async function health(url: string): Promise<Health> {
  return (await (await fetch(`${url}/health`)).json()) as Health;
}

/** Polls until `check` holds or `timeoutMs` passes; throws with `what` on time-out. */
export async function waitFor(check: () => Promise<boolean> | boolean, timeoutMs: number, what: string) {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await check()) return;
    await sleep(20);
  }
  throw new Error(`${what}: not within ${timeoutMs} ms`);
}

/** Waits until every slot is free and the queue is empty (per /health and /metrics). */
export async function waitSlotsFree(url: string, timeoutMs = 10_000): Promise<void> {
  await waitFor(
    async () => {
      const h = await health(url);
      const m = await metrics(url);
      return (
        h.slots.busy === 0 &&
        h.queue === 0 &&
        m.get('hydra_slots_busy') === 0 &&
        m.get('hydra_queue_depth') === 0
      );
    },
    timeoutMs,
    'all slots free',
  );
}

/** One short non-streaming completion; returns its status and body. */
export async function completion(
  url: string,
  body: Record<string, unknown> = { prompt: 'hello', max_tokens: 4 },
  init: RequestInit = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    ...init,
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}
