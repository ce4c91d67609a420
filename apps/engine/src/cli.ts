#!/usr/bin/env node
import { dirname, join } from 'node:path';
import { exitNow } from '@hydra-engine/native-ggml';
import { runRpcHost } from '@hydra-engine/native-ggml/rpc-host';
import { runSynthCli } from '@hydra-engine/native-ggml/synth';
import { parseServeArgs, usage } from './args.js';
import { runDemo } from './demo.js';
import { HydraError } from './errors.js';
import { ENGINE_VERSION, type StartOptions, startEngine } from './serve.js';
import { runBenchClient, runPlan } from './tools.js';

const USAGE_CODES = new Set(['HYDRA_ERR_BAD_ARGUMENT', 'HYDRA_ERR_CONFIG_INVALID']);

/**
 * Runs `hydra-engine` with `argv` (without node and script). Resolves with the exit code for
 * one-shot commands; `serve` keeps running until SIGINT/SIGTERM.
 */
export async function main(argv: readonly string[], startOptions: StartOptions = {}): Promise<number> {
  const io = { stdout: process.stdout, stderr: process.stderr };
  const [cmd, ...rest] = argv;
  try {
    switch (cmd) {
      case 'synth-model':
        await runSynthCli(rest, io);
        return 0;
      case 'plan':
        // 1 when the plan does not fit, so scripts can test it.
        return await runPlan(rest, io);
      case 'bench-client':
        await runBenchClient(rest, io);
        return 0;
      case 'demo':
        await runDemo(rest, io);
        return 0;
      case 'rpc-host':
        if (rest.includes('--help') || rest.includes('-h')) {
          io.stdout.write(
            'hydra-engine rpc-host\n\nInternal: one ggml-RPC session of the merged port (--rpc-port), started by the\n' +
              'engine with its IPC channel; not for use by hand.\n',
          );
          return 0;
        }
        // A child of this engine's merged port (see native-ggml rpc-host.ts); exits with its channel.
        runRpcHost(sea ? { workerFilename: join(dirname(process.execPath), 'rpc-worker.cjs') } : {});
        return await new Promise<number>(() => {});
    }
    const args = parseServeArgs(cmd === 'serve' ? rest : argv);
    if (args.help) {
      io.stdout.write(`${usage()}\n`);
      return 0;
    }
    if (args.version) {
      io.stdout.write(`hydra-engine ${ENGINE_VERSION}\n`);
      return 0;
    }
    const running = await startEngine(args, startOptions);
    let stopping = false;
    const log = running.logger;
    const stop = (signal: string) => {
      if (stopping) {
        log.warn(`hydra-engine: second ${signal}, exiting now`, { event: 'exit', signal });
        // A decode may be running on a worker thread: process.exit() would tear ggml down under it.
        exitNow(1);
      }
      stopping = true;
      const timeoutS = args.settings.shutdownTimeoutS;
      log.info(`hydra-engine: ${signal}, shutting down (running requests get up to ${timeoutS} s)`, {
        event: 'shutdown',
        signal,
        timeout_s: timeoutS,
      });
      running.shutdown(timeoutS * 1000).then(
        () => process.exit(0),
        (err) => {
          log.error(`hydra-engine: shutdown failed: ${(err as Error).message}`, { event: 'shutdown_failed' });
          exitNow(1);
        },
      );
    };
    process.on('SIGINT', () => stop('SIGINT'));
    process.on('SIGTERM', () => stop('SIGTERM'));
    await running.loaded;
    // llama-server's behaviour: a model that cannot be loaded at start ends the process, its cause
    // printed (above); a coordinator that will CONFIGURE one asks for --keep-up-on-load-failure.
    if (running.loadError && !args.settings.keepUpOnLoadFailure && !stopping) {
      stopping = true;
      log.error(
        'hydra-engine: exiting: the start-up model load failed (--keep-up-on-load-failure keeps the engine up)',
        {
          event: 'exit',
          code: running.loadError.code,
        },
      );
      await running.close().catch(() => undefined);
      return 1;
    }
    return await new Promise<number>(() => {});
  } catch (err) {
    const code = err instanceof HydraError ? err.code : 'HYDRA_ERR_INTERNAL';
    io.stderr.write(`hydra-engine: ${code}: ${(err as Error).message}\n`);
    if (USAGE_CODES.has(code)) {
      io.stderr.write('run `hydra-engine --help` for the flags\n');
      return 2;
    }
    return 1;
  }
}

const isEntry = process.argv[1] !== undefined && /cli\.(c|m)?js$/.test(process.argv[1]);
const sea = (globalThis as { __HYDRA_SEA__?: boolean }).__HYDRA_SEA__ === true;
if (isEntry || sea) {
  // The single executable serves ggml-RPC sessions in copies of itself (`rpc-host`), whose worker
  // thread module is a file beside it.
  const options: StartOptions = sea ? { rpcHost: { command: process.execPath, args: ['rpc-host'] } } : {};
  main(process.argv.slice(2), options).then((code) => process.exit(code));
}
