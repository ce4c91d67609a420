import { basename } from 'node:path';
import { HydraPort, OPCODES, type RpcHostSpec } from '@hydra-engine/hydra-rpc';
import { GGML_RPC_VERSION, initBackend, installRpcAbortPark, peekFirstByte } from '@hydra-engine/native-ggml';
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
import { createLogger, type EngineLogger } from './log.js';
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
  /** The engine's log (pino: `--log-format`, `--log-level`, `--log-file`). */
  logger: EngineLogger;
  /** Settles when the start-up model load (if any) ends; never rejects. */
  loaded: Promise<void>;
  /** Why the start-up model load failed, once {@link loaded} settled; undefined when it did not. */
  readonly loadError: HydraError | undefined;
  close(): Promise<void>;
  /**
   * Graceful stop: new requests get 503 `HYDRA_ERR_SHUTTING_DOWN` with `Retry-After`, running ones
   * get up to `timeoutMs` to finish, the rest end with that error (an SSE `error` event and
   * `[DONE]` on a stream), then {@link close}. Resolves with how many were ended.
   */
  shutdown(timeoutMs: number): Promise<{ ended: number }>;
}

export interface StartOptions {
  /** Where progress and log lines go (default stderr; `isTTY` picks text lines for `--log-format auto`). */
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
  line: (msg: string, fields: Record<string, unknown>) => void,
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
      line(`hydra-engine: loading model ${pct}%`, { event: 'load_progress', percent: pct });
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
  const logger = createLogger({
    format: args.settings.logFormat,
    level: args.settings.logLevel,
    sink: log,
    ...(args.settings.logFile !== undefined ? { file: args.settings.logFile } : {}),
  });
  const info = (m: string) => logger.info(m);
  const warn = (m: string) => logger.warn(m);
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
    logger: { info, warn },
    fit: {
      targetMib: args.settings.fitTargetMib,
      ...(args.settings.fitPrefer ? { prefer: args.settings.fitPrefer } : {}),
    },
  });
  const apiKeys = [...splitApiKeys(t4.api_key as string), ...args.settings.apiKeysFromFile];
  let port: HydraPort | undefined;
  const controller = new Controller({
    engine,
    lifecycle: (e) => logger.lifecycle(e),
    registry: args.registry,
    drainTimeoutMs,
    stateTimeoutMs: args.settings.stateTimeoutMs,
    maxStateUploadBytes: args.settings.maxStateUploadBytes,
    // The indexer starts with the merged port (below); a CONFIGURE waits for the port anyway.
    ...((t4.rpc_port as number) > 0 && args.settings.configureRpcWeights
      ? {
          indexWeights: (files: readonly string[]) =>
            weights
              ? weights.index(files)
              : Promise.reject(new HydraError('HYDRA_ERR_LOADING', 'the merged port is not listening yet')),
        }
      : {}),
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
    onRequest: (rec) => {
      metrics.observe(rec);
      logger.request(rec);
    },
    modelId: () => basename(engine.modelPath ?? ''),
    aliases: args.settings.aliases,
    ...(args.settings.slotSavePath !== undefined ? { slotSavePath: args.settings.slotSavePath } : {}),
    slotsEndpoint: args.settings.slotsEndpoint,
    propsEndpoint: args.settings.propsEndpoint,
    cors: {
      origins: args.settings.corsOrigins,
      methods: args.settings.corsMethods,
      headers: args.settings.corsHeaders,
      credentials: args.settings.corsCredentials,
    },
    build: `hydra-engine ${ENGINE_VERSION}`,
    cachePrompt: args.settings.cachePrompt,
    ...(args.settings.chatTemplate !== undefined ? { chatTemplate: args.settings.chatTemplate } : {}),
    jinja: args.settings.jinja,
    reasoningFormat: args.settings.reasoningFormat,
    ...(args.settings.chatTemplateKwargs !== undefined
      ? { chatTemplateKwargs: JSON.parse(args.settings.chatTemplateKwargs) as Record<string, unknown> }
      : {}),
  });
  const host = t4.host as string;
  const address = await http.listen(t4.port as number, host);
  logger.info(`hydra-engine: HTTP on http://${host}:${address.port} (state ${engine.state})`, {
    event: 'listening',
    port: address.port,
  });
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
      logger: { debug: (m: string) => logger.debug(m), info, warn, error: (m: string) => logger.error(m) },
    });
    port.handle('HELLO', () => ({
      protocol: 1,
      engine: { name: 'hydra-engine', version: ENGINE_VERSION },
      ggml_rpc: { ...GGML_RPC_VERSION },
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
    logger.info(`hydra-engine: merged ggml-RPC/Hydra port on ${host}:${rpcPort}`, {
      event: 'rpc_listening',
      port: rpcPort,
    });
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
    const onProgress = progressPrinter(args.settings.progress, log, (m, f) => logger.info(m, f));
    loaded = engine
      .load(onProgress ? { onProgress } : {})
      .then(() => {
        const m = engine.model!.info;
        logger.info(
          `hydra-engine: model ready: ${engine.modelPath} (${m.arch}, ${m.nLayer} layers, ${engine.slots.total} slots of ` +
            `${engine.slots.nCtxSeq} tokens) in ${engine.counters.loadSeconds.toFixed(2)} s, epoch ${engine.epoch}`,
          {
            event: 'load',
            cause: 'startup',
            model: engine.modelPath,
            seconds: engine.counters.loadSeconds,
            epoch: engine.epoch,
          },
        );
        for (const line of formatPlacement(engine.placement ?? { nLayer: 0, rows: [] }))
          info(`hydra-engine:   ${line}`);
      })
      .catch((err: HydraError) => {
        loadError =
          err instanceof HydraError
            ? err
            : new HydraError('HYDRA_ERR_LOAD_FAILED', (err as Error).message, { cause: err });
        logger.error(`hydra-engine: ${loadError.code}: ${loadError.message}`, {
          event: 'load_failed',
          cause: 'startup',
          code: loadError.code,
        });
      });
  }
  const running: RunningEngine = {
    engine,
    controller,
    http,
    port,
    httpPort: address.port,
    rpcPort,
    logger,
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
      logger.close();
    },
    async shutdown(timeoutMs: number) {
      http.beginShutdown(Math.max(1, timeoutMs / 1000));
      let timer: NodeJS.Timeout | undefined;
      const timedOut = await Promise.race([
        engine.whenIdle().then(() => false),
        new Promise<boolean>((resolve) => {
          timer = setTimeout(() => resolve(true), timeoutMs);
        }),
      ]);
      clearTimeout(timer);
      let ended = 0;
      if (timedOut) {
        ended = engine.slots.busy;
        // Queued requests must not take the slots the ended ones free.
        engine.hold('shutdown timeout');
        engine.endRunning(
          new HydraError(
            'HYDRA_ERR_SHUTTING_DOWN',
            `the engine is shutting down: the request was still running after --shutdown-timeout ${timeoutMs / 1000} s`,
          ),
        );
        logger.warn(`hydra-engine: shutdown timeout: ended ${ended} running request(s)`, {
          event: 'shutdown_timeout',
          ended,
        });
        // The error events go out before the connections are closed.
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      await running.close();
      return { ended };
    },
  };
  return running;
}
