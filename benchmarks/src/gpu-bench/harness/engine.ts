import { freeLoopbackPort } from '@hydra-engine/native-ggml/ports';
import { type Child, type ProcessGroup, waitHttp, waitTcp } from './processes.js';

/** A started engine (or llama-server) and how long it took to serve. */
export interface Server {
  child: Child;
  port: number;
  url: string;
  /** Spawn to the accepted /health answer, ms. */
  readyMs: number;
}

export interface StartEngineOptions {
  /** The engine's argv after the CLI path, given its HTTP port. */
  args: (port: number) => string[];
  /** The /health `state` that means ready (`empty` for a model-less engine). */
  state?: string;
  timeoutMs?: number;
  env?: Record<string, string>;
  pollMs?: number;
}

/** Spawns the engine CLI with the running node and waits for /health 200 with `state`. */
export async function startEngine(
  group: ProcessGroup,
  cli: string | undefined,
  options: StartEngineOptions,
): Promise<Server> {
  if (!cli) throw new Error('no engine: build apps/engine or run benchmarks/gpu/bundle.mjs');
  const state = options.state ?? 'ready';
  const port = await freeLoopbackPort();
  const since = performance.now();
  const child = group.start(process.execPath, [cli, ...options.args(port)], { env: options.env ?? {} });
  const url = `http://127.0.0.1:${port}`;
  const readyMs = await waitHttp(
    `${url}/health`,
    (s, b) => s === 200 && b.state === state,
    since,
    child,
    options.timeoutMs ?? 300_000,
    options.pollMs,
  );
  return { child, port, url, readyMs };
}

/** Starts stock ggml-rpc-server on a free loopback port (`-d devices` when given); resolves once it accepts. */
export async function startRpcServer(
  group: ProcessGroup,
  bin: string,
  options: { devices?: string; env?: Record<string, string>; timeoutMs?: number } = {},
): Promise<{ child: Child; port: number; endpoint: string }> {
  const port = await freeLoopbackPort();
  const args = ['-H', '127.0.0.1', '-p', String(port)];
  if (options.devices) args.push('-d', options.devices);
  const child = group.start(bin, args, { env: options.env ?? {} });
  await waitTcp(port, child, options.timeoutMs ?? 60_000);
  return { child, port, endpoint: `127.0.0.1:${port}` };
}

export { freeLoopbackPort };
