// A ggml-RPC host: the child process a merged port (packages/hydra-rpc, "Host processes") spawns to
// serve ggml-RPC sessions one at a time, so that a crash inside ggml (an assert in a compute thread,
// a CUDA fault) ends that session and this process, never the engine. The main thread talks to the
// parent over IPC; a worker thread (rpc-worker.ts) blocks in serveRpcFd for each session.
import { basename } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { NativeServeLimits } from './binding.js';
import { loadBinding } from './binding.js';
import { HydraError } from './errors.js';
import { detachFd, rpcWeightsIndexAdd } from './index.js';
import type { RpcServeTask, RpcWorkerReply } from './rpc-worker.js';

const LIMIT_KEYS: Record<keyof NativeServeLimits, true> = {
  maxAllocBytes: true,
  maxMessageBytes: true,
  maxGraphNodes: true,
  maxGraphTensors: true,
  maxGraphDepth: true,
  maxBuffers: true,
  helloTimeoutMs: true,
  stallTimeoutMs: true,
  idleTimeoutMs: true,
};

/**
 * The names of serveRpcFd's per-session limits (a session task's `limits`), so that an embedder can
 * refuse an unknown one when it starts rather than at every session.
 */
export const SERVE_LIMIT_KEYS: readonly (keyof NativeServeLimits)[] = Object.keys(
  LIMIT_KEYS,
) as (keyof NativeServeLimits)[];

/** Absolute path of this module: run it with node (and an IPC channel) to start a host. */
export const rpcHostPath: string = fileURLToPath(new URL('./rpc-host.js', import.meta.url));

export interface RpcHostOptions {
  /** The worker thread module; default rpc-worker.js beside this module (a single executable ships its own). */
  workerFilename?: string | URL;
  /** How often the live counters of a running session go to the parent; default 1000 ms. */
  progressMs?: number;
}

type ParentMessage =
  | { t: 'serve'; id: number; task: Record<string, unknown> }
  | { t: 'setup'; data: { weights?: unknown } };

// The first three counters are upstream's ggml_backend_rpc_serve_stats; the rest is room for more.
const STATS_SLOTS = 8;

/**
 * Serves the host protocol on this process's IPC channel until the channel closes (the parent
 * exited or retired this host), then exits. Throws HYDRA_ERR_BAD_ARGUMENT without a channel.
 */
export function runRpcHost(options: RpcHostOptions = {}): void {
  const raw = process.send?.bind(process);
  if (raw === undefined) {
    throw new HydraError(
      'HYDRA_ERR_BAD_ARGUMENT',
      'rpc-host runs as a child of a merged port (no IPC channel)',
    );
  }
  // A message to a parent that has gone is dropped: the disconnect handler is already exiting.
  const send = (message: unknown): void => {
    if (process.connected) raw(message as never, undefined, {}, () => {});
  };
  const progressMs = options.progressMs ?? 1000;
  // Dies with its parent: a host never outlives the engine that handed it a connection. Not
  // process.exit(): it joins the worker thread, which may be blocked in a session's recv for good.
  process.on('disconnect', () => process.kill(process.pid, 'SIGKILL'));
  const worker = new Worker(options.workerFilename ?? new URL('./rpc-worker.js', import.meta.url), {
    workerData: { hydraRpcHost: true },
  });
  // A worker thread that dies leaves this host useless: exit, and the parent replaces it.
  worker.on('error', (err) => {
    process.stderr.write(`hydra rpc-host: worker thread failed: ${err.message}\n`);
    process.exit(70);
  });
  worker.on('exit', (code) => process.exit(code === 0 ? 70 : code));

  const stats = new BigUint64Array(new SharedArrayBuffer(8 * STATS_SLOTS));
  let setup: Promise<unknown> = Promise.resolve();
  let current: { id: number; timer: NodeJS.Timeout } | undefined;
  // The session socket's kernel counters, so a long session's traffic shows while it runs (the
  // summary at its end reads the same counters). The fd is the session's until its reply.
  const live = (fd: number) => {
    const bytes = loadBinding().binding.fdTcpBytes(fd);
    return {
      commands: Number(stats[0]),
      setTensorBytes: Number(stats[1]),
      setTensorHashHits: Number(stats[2]),
      ...(bytes ? { bytesIn: bytes[0], bytesOut: bytes[1] } : {}),
    };
  };

  worker.on('message', (reply: RpcWorkerReply) => {
    if ('ready' in reply) {
      send({ t: 'ready' });
      return;
    }
    if (current === undefined || current.id !== reply.id) return;
    clearInterval(current.timer);
    current = undefined;
    if ('result' in reply) send({ t: 'done', id: reply.id, result: reply.result });
    else send({ t: 'failed', id: reply.id, error: reply.error });
  });

  process.on('message', (message: ParentMessage, handle?: { fd?: unknown; close?: () => void }) => {
    if (message?.t === 'setup') {
      const file = message.data?.weights;
      if (typeof file !== 'string') {
        send({
          t: 'setup-failed',
          data: message.data,
          error: { code: 'HYDRA_ERR_BAD_ARGUMENT', message: 'unknown setup' },
        });
        return;
      }
      // Sessions wait for the index: a head that connects at once must still get hash hits.
      setup = setup.then(() =>
        rpcWeightsIndexAdd(file).catch((err: { code?: string; message: string }) =>
          send({ t: 'setup-failed', data: message.data, error: { code: err.code, message: err.message } }),
        ),
      );
      return;
    }
    if (message?.t !== 'serve') return;
    const { id, task } = message;
    let fd: number;
    try {
      if (current !== undefined)
        throw new HydraError('HYDRA_ERR_SERVE_FAILED', 'this host is serving a session already');
      if (handle === undefined || typeof handle.fd !== 'number' || handle.fd < 0) {
        throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'serve without a connection handle');
      }
      // In this tick, before libuv could read from it: the first byte the parent peeked stays unread.
      fd = detachFd(handle.fd);
    } catch (err) {
      const e = err as { code?: string; message: string };
      handle?.close?.();
      send({ t: 'failed', id, error: { code: e.code, message: e.message } });
      return;
    }
    handle.close?.();
    stats.fill(0n);
    const timer = setInterval(() => send({ t: 'progress', id, stats: live(fd) }), progressMs);
    timer.unref();
    current = { id, timer };
    const serveTask: RpcServeTask = { ...(task as Partial<RpcServeTask>), fd, stats };
    void setup.then(() => worker.postMessage({ id, task: serveTask }));
  });
}

// Started as `node rpc-host.js` (or a bundle of that name); a single executable calls runRpcHost().
const entry = process.argv[1];
if (entry !== undefined && /^rpc-host\.(c|m)?js$/.test(basename(entry))) runRpcHost();
