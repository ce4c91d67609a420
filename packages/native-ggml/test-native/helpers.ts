import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import {
  addonCandidates,
  detachFd,
  freeLoopbackPort as freePort,
  listDevices,
  type Model,
  peekFirstByte,
  probeRpcServer,
} from '../src/index.js';
import { writeSyntheticModel } from '../src/synth/index.js';

/**
 * The stock upstream tools built beside the addon the loader picks (build-cuda/bin/ for a CUDA
 * build, else build/bin/), so a GPU run compares against the same backend; HYDRA_LLAMA_TOOLS wins.
 */
export const binDir =
  process.env.HYDRA_LLAMA_TOOLS ??
  dirname(
    addonCandidates().find((p) => existsSync(p)) ?? fileURLToPath(new URL('../build/bin/x', import.meta.url)),
  );
const fixtures = fileURLToPath(new URL('./fixtures/', import.meta.url));

export async function tinyModel(
  quant: 'f32' | 'q8_0' | 'q4_0' = 'f32',
  arch: 'llama' | 'moe' = 'llama',
): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'hydra-native-'));
  const out = join(dir, `tiny-${arch}-${quant}.gguf`);
  await writeSyntheticModel({ arch, shape: 'tiny', quant, seed: 7, out });
  return out;
}

export function run(
  file: string,
  args: string[],
  timeoutMs = 60_000,
): Promise<{ stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: timeoutMs, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      if (err) reject(Object.assign(err, { stderr }));
      else resolve({ stdout, stderr });
    });
  });
}

/**
 * Runs `file` with its stdout written to a file, not a pipe, and resolves with what it wrote. For
 * tools that print through llama.cpp's asynchronous common_log (llama-embedding): its worker thread
 * is still writing when main returns, and a pipe that fills up (the reader busy) holds it back long
 * enough for the exit to cut the output; a file never blocks it.
 */
export async function runToFile(file: string, args: string[], timeoutMs = 60_000): Promise<string> {
  // libhydra-log-flush (native-tools/log_flush.cpp) joins that worker at exit, so nothing is lost.
  const env = { ...process.env, LD_PRELOAD: join(dirname(file), 'libhydra-log-flush.so') };
  const dir = mkdtempSync(join(tmpdir(), 'hydra-stdout-'));
  const out = join(dir, 'stdout');
  const fd = openSync(out, 'w');
  try {
    await new Promise<void>((resolve, reject) => {
      const child = spawn(file, args, { stdio: ['ignore', fd, 'ignore'], env });
      const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
      child.once('error', reject);
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        if (code === 0) resolve();
        else reject(new Error(`${file} exited ${code ?? signal}`));
      });
    });
  } finally {
    closeSync(fd);
  }
  const text = readFileSync(out, 'utf8');
  rmSync(dir, { recursive: true, force: true });
  return text;
}

export interface ClientResult {
  logits: number[];
  generated: number[];
}

/**
 * The devices a peer serves in logits comparisons against the local baseline, which computes on the
 * CPU (`rpcClient` without an endpoint): the comparison is of the transport, not of two backends.
 * By default a peer serves its GPU, whose kernels differ from the CPU's by 2e-3 to 7e-3 on the
 * tiny f32 model (measured on the H200), far above the 1e-4 the transport must keep.
 */
export const CPU_PEER = ['CPU'];

/** Whether this machine has a GPU the loaded addon can use. */
export function hasGpu(): boolean {
  return listDevices().some((d) => d.type === 'gpu');
}

/**
 * Runs the RPC client fixture in its own process: without an endpoint the model computes locally on
 * the CPU; with `local-gpu` as the endpoint, on the local GPU with `ngl` layers.
 */
export async function rpcClient(
  model: string,
  prompt: string,
  endpoint?: string,
  ngl?: number,
): Promise<ClientResult> {
  const args = [join(fixtures, 'rpc-client.mjs'), model, prompt];
  if (endpoint) args.push(endpoint, String(ngl));
  const { stdout } = await run(process.execPath, args, 120_000);
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as ClientResult;
}

/**
 * A minimal merged-port stand-in built from this package's pieces only: peek (not consume) the
 * first byte, detach the fd, serve the session in a worker thread with rpc-worker.
 */
export async function startFdServer(devices?: string[]): Promise<{
  port: number;
  firstBytes: number[];
  sessions: Promise<unknown>[];
  close(): Promise<void>;
}> {
  const firstBytes: number[] = [];
  const sessions: Promise<unknown>[] = [];
  const server: Server = createServer({ pauseOnConnect: true }, (socket: Socket) => {
    const fd = (socket as unknown as { _handle: { fd: number } })._handle.fd;
    peekFirstByte(fd, 5000).then((byte) => {
      firstBytes.push(byte);
      if (byte !== 0x0e) {
        socket.destroy();
        return;
      }
      const served = detachFd(fd);
      socket.destroy();
      const stats = new BigUint64Array(new SharedArrayBuffer(24));
      const worker = new Worker(join(fixtures, 'serve-worker.mjs'), {
        workerData: { fd: served, stats, devices },
      });
      sessions.push(
        new Promise((resolve, reject) => {
          worker.once('message', resolve);
          worker.once('error', reject);
        }),
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('no port');
  return {
    port: address.port,
    firstBytes,
    sessions,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

export { freePort };

/** Starts the stock upstream ggml-rpc-server built from the same pin; resolves once it listens. */
export async function startStockRpcServer(
  devices?: string[],
): Promise<{ endpoint: string; child: ChildProcess }> {
  const port = await freePort();
  const args = ['-H', '127.0.0.1', '-p', String(port), ...(devices ? ['-d', devices.join(',')] : [])];
  const child = spawn(join(binDir, 'ggml-rpc-server'), args, {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const endpoint = `127.0.0.1:${port}`;
  const deadline = Date.now() + 15_000;
  // Its stdout is block-buffered on a pipe, so readiness is a HELLO that gets an answer.
  for (;;) {
    if (child.exitCode !== null) throw new Error(`ggml-rpc-server exited with ${child.exitCode}`);
    try {
      await probeRpcServer(endpoint, 1000);
      break;
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
  return { endpoint: `127.0.0.1:${port}`, child };
}

export function maxAbsDiff(a: number[], b: number[]): number {
  if (a.length !== b.length) return Number.POSITIVE_INFINITY;
  let max = 0;
  for (let i = 0; i < a.length; i++) max = Math.max(max, Math.abs(a[i]! - b[i]!));
  return max;
}

/**
 * `n` greedy tokens of each prompt, every sequence decoded in the same batch at each step (one
 * context, one sequence per prompt); for comparing with the prompts decoded one at a time.
 */
export async function greedyBatched(model: Model, prompts: string[], n: number): Promise<number[][]> {
  const ctx = await model.createContext({ nCtx: 512, nBatch: 64, nSeqMax: prompts.length });
  const samplers = prompts.map(() => model.createSampler({ temp: 0 }));
  try {
    const tokens = prompts.map((p) => model.tokenize(p));
    let r = await ctx.decode(
      prompts.map((_, i) => ({ seq: i, pos: 0, tokens: tokens[i]!, sampler: samplers[i]! })),
    );
    const outs = prompts.map((_, i) => [r.tokens[i]!]);
    for (let step = 1; step < n; step++) {
      r = await ctx.decode(
        prompts.map((_, i) => ({
          seq: i,
          pos: tokens[i]!.length + step - 1,
          tokens: [outs[i]!.at(-1)!],
          sampler: samplers[i]!,
        })),
      );
      for (const [i, o] of outs.entries()) o.push(r.tokens[i]!);
    }
    return outs;
  } finally {
    for (const s of samplers) s.dispose();
    await ctx.dispose();
  }
}
