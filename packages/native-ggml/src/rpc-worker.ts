// A piscina worker module: each task serves one ggml-RPC session on a detached fd, blocking this
// worker thread (not the event loop) until the client leaves. The worker keeps its device backends
// between sessions (see native/hydra_rpc_serve.cpp).
import { closeSync } from 'node:fs';
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
