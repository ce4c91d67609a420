// The worker thread of an rpc-host child process (see rpc-host.ts): each task serves one ggml-RPC
// session on a detached fd, blocking this thread (not the host's event loop, which keeps answering
// its parent) until the client leaves. The thread keeps its device backends between sessions (see
// native/hydra_rpc_serve.cpp). The default export serves one task when called directly.
import { closeSync } from 'node:fs';
import { isMainThread, parentPort, workerData } from 'node:worker_threads';
import type { NativeServeLimits, NativeServeSummary } from './binding.js';
import { loadBinding } from './binding.js';

/** The task a merged port hands to this worker. */
export interface RpcServeTask {
  fd: number;
  devices?: string[];
  threads?: number;
  cacheDir?: string;
  /** Live counters (commands, set-tensor bytes, hash hits), usually on a SharedArrayBuffer. */
  stats?: BigUint64Array;
  /** The session's caps and timeouts; serveRpcFd refuses an unknown or invalid key by name. */
  limits?: NativeServeLimits;
}

let ready = false;

export default function serve(task: RpcServeTask): NativeServeSummary {
  let binding: ReturnType<typeof loadBinding>['binding'];
  try {
    binding = loadBinding().binding;
    if (!ready) {
      binding.backendInit(4);
      ready = true;
    }
  } catch (err) {
    closeSync(task.fd); // the fd is ours from the moment the task arrives
    throw err;
  }
  const options: { devices?: string[]; threads?: number; cacheDir?: string } & NativeServeLimits = {
    ...task.limits,
  };
  if (task.devices) options.devices = task.devices;
  if (task.threads) options.threads = task.threads;
  if (task.cacheDir) options.cacheDir = task.cacheDir;
  return binding.serveRpcFd(task.fd, options, task.stats);
}

/** What the host thread posts to this worker thread, and what comes back. */
export interface RpcWorkerRequest {
  id: number;
  task: RpcServeTask;
}
export type RpcWorkerReply =
  | { ready: true }
  | { id: number; result: NativeServeSummary }
  | { id: number; error: { code?: string; message: string } };

if (
  !isMainThread &&
  parentPort !== null &&
  (workerData as { hydraRpcHost?: unknown })?.hydraRpcHost === true
) {
  const port = parentPort;
  // Backends load before the first session, so a warm host's first client does not wait for them.
  try {
    loadBinding().binding.backendInit(4);
    ready = true;
  } catch {
    // serve() retries and reports the error with the session that needs it.
  }
  port.postMessage({ ready: true } satisfies RpcWorkerReply);
  port.on('message', ({ id, task }: RpcWorkerRequest) => {
    let reply: RpcWorkerReply;
    try {
      reply = { id, result: serve(task) };
    } catch (err) {
      const e = err as { code?: unknown; message?: unknown };
      reply = {
        id,
        error: {
          ...(typeof e?.code === 'string' ? { code: e.code } : {}),
          message: String(e?.message ?? err),
        },
      };
    }
    port.postMessage(reply);
  });
}
