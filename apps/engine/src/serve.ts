import { basename } from 'node:path';
import { HydraPort, OPCODES, type RpcHostSpec } from '@hydra-engine/hydra-rpc';
import { initBackend, installRpcAbortPark, peekFirstByte } from '@hydra-engine/native-ggml';
import { rpcHostPath } from '@hydra-engine/native-ggml/rpc-host';
import { DRAIN_TIMEOUT_ENV, parseDrainTimeout } from '@hydra-engine/tiering';
import type { ServeArgs } from './args.js';
import { PeerWatchdog } from './combine/watchdog.js';
import { startWeightsIndexer } from './combine/weights.js';
import { Controller } from './control/controller.js';
import { controlRoutes, registerControl } from './control/wire.js';
import { Engine } from './engine.js';
import { HydraError } from './errors.js';
import { HttpApi, splitApiKeys } from './http.js';
import { EngineMetrics } from './metrics.js';
import { formatPlacement } from './placement.js';

/** The version reported by HELLO and `--version`. */
export const ENGINE_VERSION = '0.1.0';

export interface RunningEngine {
  engine: Engine;
  controller: Controller;
  http: HttpApi;
  port: HydraPort | undefined;
  httpPort: number;
  rpcPort: number | undefined;
  /** Settles when the `--rpc-weights` files are indexed (a file that cannot be is logged); never rejects. */
  weightsIndexed: Promise<unknown>;
  /** Peer loss detection (see src/combine/watchdog.ts). */
  watchdog: PeerWatchdog;
  /** Settles when the start-up model load (if any) ends; never rejects. */
  loaded: Promise<void>;
  /** Why the start-up model load failed, once {@link loaded} settled; undefined when it did not. */
  readonly loadError: HydraError | undefined;
  close(): Promise<void>;
}

export interface StartOptions {
  /** Where progress and log lines go (default stderr). */
  log?: { write(text: string): unknown; isTTY?: boolean };
  /**
   * The child process that serves ggml-RPC sessions: default node running native-ggml's rpc-host;
   * the single executable runs itself with `rpc-host`.
   */
  rpcHost?: RpcHostSpec;
}

function progressPrinter(
  mode: ServeArgs['settings']['progress'],
  out: { write(t: string): unknown; isTTY?: boolean },
) {
  const bar = mode === 'bar' || (mode === 'auto' && out.isTTY === true);
  if (mode === 'off') return undefined;
  let lastLine = -1;
  return (p: number) => {
    const pct = Math.floor(p * 100);
    if (bar) {
      const width = 30;
      const filled = Math.round(p * width);
      out.write(
        `\rloading model [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${String(pct).padStart(3)}%${p >= 1 ? '\n' : ''}`,
      );
    } else if (pct >= lastLine + 10 || (p >= 1 && lastLine < 100)) {
      lastLine = pct >= 100 ? 100 : pct - (pct % 10);
      out.write(`hydra-engine: loading model ${pct}%\n`);
    }
  };
}

/**
 * Starts the engine: HTTP at once (model-less boot answers `/health` immediately), the merged port
 * when `rpc_port` is set, then the start-up model load in the background.
 */
export async function startEngine(args: ServeArgs, options: StartOptions = {}): Promise<RunningEngine> {
  const log = options.log ?? process.stderr;
  const t4 = args.layers.startOnly();
  const info = (m: string) => log.write(`${m}\n`);
  let drainTimeoutMs: number;
  try {
    drainTimeoutMs = parseDrainTimeout(process.env[DRAIN_TIMEOUT_ENV]);
  } catch (err) {
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', (err as Error).message, {
      keys: [DRAIN_TIMEOUT_ENV],
      cause: err,
    });
  }
  try {
    // A ggml-RPC peer that dies must cost this engine its COMBINE model, not the process: the
    // failing client thread parks and the watchdog below fails over to SOLO.
    installRpcAbortPark();
  } catch (err) {
    info(`hydra-engine: ggml-RPC abort hook unavailable: ${(err as Error).message}`);
  }
  const engine = new Engine({
    layers: args.layers,
    maxQueue: args.settings.maxQueue,
    ...(args.registry ? { registry: args.registry } : {}),
    logger: { info, warn: info },
  });
  const apiKeys = [...splitApiKeys(t4.api_key as string), ...args.settings.apiKeysFromFile];
  let port: HydraPort | undefined;
  const controller = new Controller({
    engine,
    registry: args.registry,
    drainTimeoutMs,
    stateTimeoutMs: args.settings.stateTimeoutMs,
    maxStateUploadBytes: args.settings.maxStateUploadBytes,
  });
  const metrics = new EngineMetrics(engine, (t4.rpc_port as number) > 0 ? () => port?.stats() : undefined);
  const allowFrom = (t4.control_allow_from as string[]).map((c) =>
    c.replace(/^127\.0\.0\.1\/8$/, '127.0.0.0/8'),
  );
  const http = new HttpApi({
    control: controlRoutes(controller, {
      allowFrom,
      maxBodyBytes: args.settings.maxBodyBytes,
      bodyTimeoutMs: args.settings.bodyTimeoutMs,
      poolStats: () => port?.stats(),
    }),
    engine,
    apiKeys,
    metricsAllowFrom: allowFrom,
    maxBodyBytes: args.settings.maxBodyBytes,
    bodyTimeoutMs: args.settings.bodyTimeoutMs,
    maxConnections: args.settings.httpMaxConnections,
    maxConnectionsPerSource: args.settings.httpMaxConnectionsPerSource,
    keepAliveTimeoutMs: args.settings.keepAliveTimeoutMs,
    headersTimeoutMs: args.settings.headersTimeoutMs,
    maxPromptBytes: args.settings.maxPromptBytes,
    maxMessages: args.settings.maxMessages,
    metrics: () => metrics.render(),
    onRequest: (rec) => metrics.observe(rec),
    modelId: () => basename(engine.modelPath ?? ''),
    aliases: args.settings.aliases,
    ...(args.settings.slotSavePath !== undefined ? { slotSavePath: args.settings.slotSavePath } : {}),
    slotsEndpoint: args.settings.slotsEndpoint,
    cors: {
      origins: args.settings.corsOrigins,
      methods: args.settings.corsMethods,
      headers: args.settings.corsHeaders,
      credentials: args.settings.corsCredentials,
    },
    build: `hydra-engine ${ENGINE_VERSION}`,
  });
  const host = t4.host as string;
  const address = await http.listen(t4.port as number, host);
  info(`hydra-engine: HTTP on http://${host}:${address.port} (state ${engine.state})`);
  let rpcPort: number | undefined;
  let weights: ReturnType<typeof startWeightsIndexer> | undefined;
  const wantedRpc = t4.rpc_port as number;
  if (wantedRpc > 0) {
    initBackend();
    const s = args.settings;
    port = new HydraPort({
      host,
      port: wantedRpc,
      allowFrom,
      native: { peekFirstByte },
      rpcHost: options.rpcHost ?? { args: [rpcHostPath] },
      ...(Object.keys(s.rpcLimits).length > 0 ? { rpcTask: { limits: s.rpcLimits } } : {}),
      poolSize: s.rpcPoolSize,
      queueSize: s.rpcQueueSize,
      queueTimeoutMs: s.rpcQueueTimeoutMs,
      ...(s.rpcMaxPerSource > 0 ? { rpcMaxPerSource: s.rpcMaxPerSource } : {}),
      maxConnections: s.portMaxConnections,
      maxConnectionsPerSource: s.portMaxConnectionsPerSource,
      maxHydraSessions: s.hydraMaxSessions,
      maxHydraSessionsPerSource: s.hydraMaxSessionsPerSource,
      idleTimeoutMs: s.hydraIdleTimeoutMs,
      logger: { info, warn: info, error: info },
    });
    port.handle('HELLO', () => ({
      protocol: 1,
      engine: { name: 'hydra-engine', version: ENGINE_VERSION },
      ggml_rpc: { major: 6, minor: 0, patch: 0 },
      opcodes: Object.values(OPCODES).filter((o) => o !== OPCODES.PIPELINE_ATTACH),
      devices: engine
        .devices()
        .map(({ name, description, free, total }) => ({ name, description, free, total })),
    }));
    registerControl(port, controller);
    try {
      rpcPort = (await port.listen()).port;
    } catch (err) {
      await http.close();
      throw new HydraError(
        'HYDRA_ERR_BAD_ARGUMENT',
        `cannot listen on --rpc-port ${wantedRpc}: ${(err as Error).message}`,
        {
          keys: ['--rpc-port'],
          cause: err,
        },
      );
    }
    info(`hydra-engine: merged ggml-RPC/Hydra port on ${host}:${rpcPort}`);
    const served = port;
    weights = startWeightsIndexer({
      engine,
      files: args.settings.rpcWeights,
      log: info,
      onFile: (file) => served.broadcastToHosts({ weights: file }),
    });
  }
  const watchdog = new PeerWatchdog({
    engine,
    log: info,
    stallMs: args.settings.peerStallMs,
    intervalMs: args.settings.peerProbeIntervalMs,
    probeTimeoutMs: args.settings.peerProbeTimeoutMs,
    failures: args.settings.peerProbeFailures,
  });
  let loaded: Promise<void> = Promise.resolve();
  let loadError: HydraError | undefined;
  if (args.layers.get('model')) {
    const onProgress = progressPrinter(args.settings.progress, log);
    loaded = engine
      .load(onProgress ? { onProgress } : {})
      .then(() => {
        const m = engine.model!.info;
        info(
          `hydra-engine: model ready: ${engine.modelPath} (${m.arch}, ${m.nLayer} layers, ${engine.slots.total} slots of ` +
            `${engine.slots.nCtxSeq} tokens) in ${engine.counters.loadSeconds.toFixed(2)} s, epoch ${engine.epoch}`,
        );
        for (const line of formatPlacement(engine.placement ?? { nLayer: 0, rows: [] }))
          info(`hydra-engine:   ${line}`);
      })
      .catch((err: HydraError) => {
        loadError =
          err instanceof HydraError
            ? err
            : new HydraError('HYDRA_ERR_LOAD_FAILED', (err as Error).message, { cause: err });
        info(`hydra-engine: ${loadError.code}: ${loadError.message}`);
      });
  }
  return {
    engine,
    controller,
    http,
    port,
    httpPort: address.port,
    rpcPort,
    loaded,
    get loadError() {
      return loadError;
    },
    weightsIndexed: weights?.ready ?? Promise.resolve([]),
    watchdog,
    async close() {
      watchdog.stop();
      weights?.stop();
      controller.close();
      await http.close();
      await engine.close();
      await port?.close();
    },
  };
}
