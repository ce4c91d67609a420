import { type ChildProcess, spawn } from 'node:child_process';
import { freeLoopbackPort } from '@hydra-engine/native-ggml/ports';
import { REPO } from './engine.js';
import { waitFor } from './wait.js';

/** The pinned llama.cpp's stock `ggml-rpc-server`, as native-ggml's build leaves it. */
export const RPC_SERVER = `${REPO}/packages/native-ggml/build/bin/ggml-rpc-server`;

/** A stock `ggml-rpc-server` process started by {@link stockRpcServer}. */
export interface StockRpcServer {
  child: ChildProcess;
  port: number;
  /** `127.0.0.1:port`, as `--rpc` and `addRpcServer` take it. */
  endpoint: string;
  /** SIGKILL; resolves once the process is gone. */
  stop(): Promise<void>;
}

/**
 * Starts the stock `ggml-rpc-server` on a free loopback port (`-t threads` when given) and
 * resolves once it answers a HELLO. Throws when it exits or does not answer within `timeoutMs`
 * (default 15 s).
 */
export async function stockRpcServer(
  options: { threads?: number; timeoutMs?: number } = {},
): Promise<StockRpcServer> {
  // The addon is loaded only by the suites that start a stock server.
  const { probeRpcServer } = await import('@hydra-engine/native-ggml');
  const port = await freeLoopbackPort();
  const threads = options.threads !== undefined ? ['-t', String(options.threads)] : [];
  const child = spawn(RPC_SERVER, ['-H', '127.0.0.1', '-p', String(port), ...threads], { stdio: 'ignore' });
  const gone = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await gone;
  };
  const endpoint = `127.0.0.1:${port}`;
  try {
    await waitFor(
      async () => {
        if (child.exitCode !== null || child.signalCode !== null)
          throw new Error(`ggml-rpc-server exited (${child.exitCode ?? child.signalCode})`);
        return probeRpcServer(endpoint, 500).then(
          () => true,
          () => false,
        );
      },
      options.timeoutMs ?? 15_000,
      `ggml-rpc-server on ${endpoint} answering`,
    );
  } catch (err) {
    await stop();
    throw err;
  }
  return { child, port, endpoint, stop };
}
