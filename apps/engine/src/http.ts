import { timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { BodyParser } from './body.js';
import type { Engine } from './engine.js';
import { HydraError } from './errors.js';
import type { RequestRecord } from './metrics.js';
import { applyCors, CORS_DEFAULTS, type CorsOptions } from './routes/cors.js';
import { PUBLIC_PATHS } from './routes/health.js';
import { ROUTE_MODULES } from './routes/index.js';
import {
  type RouteContext,
  type RouteHandler,
  readBody,
  sendError,
  sendJson,
  sentCode,
} from './routes/plumbing.js';

export { generationParams } from './routes/completions.js';

export interface HttpOptions {
  engine: Engine;
  /**
   * Keys accepted as `Authorization: Bearer KEY` (or `X-Api-Key: KEY`), as llama-server's
   * `--api-key k1,k2` / `--api-key-file`: when any is set every route but `/health` and
   * `/v1/health` needs one, `/metrics` and `/control/*` included.
   */
  apiKeys?: readonly string[];
  /** CIDR list that may read `/metrics` (the `--control-allow-from` list; absent: anyone). */
  metricsAllowFrom?: readonly string[];
  maxBodyBytes: number;
  bodyTimeoutMs: number;
  /** Open connections in all (default {@link HTTP_DEFAULTS}); the next one gets 503. */
  maxConnections?: number;
  /** Open connections from one source address (default {@link HTTP_DEFAULTS}). */
  maxConnectionsPerSource?: number;
  /** An idle keep-alive connection is closed after this long (default 5000 ms). */
  keepAliveTimeoutMs?: number;
  /** The request line and headers must arrive within this long, idle new connections included. */
  headersTimeoutMs?: number;
  /** Largest prompt (or sum of chat message texts) in UTF-8 bytes; 0: max(1 MiB, 64 x n_ctx of a slot). */
  maxPromptBytes?: number;
  /** Most chat messages in one request; 0: max(256, n_ctx of a slot / 2). */
  maxMessages?: number;
  /** Prometheus text for `/metrics`. */
  metrics: () => string | Promise<string>;
  /** Called once per answered request (the request log line and latency histograms). */
  onRequest?: (record: RequestRecord) => void;
  modelId?: () => string;
  /** `--alias a,b`: the model's names in answers (the first) and in `/v1/models/{id}` (any). */
  aliases?: readonly string[];
  /** `--slot-save-path`: the folder of `/slots/{id}?action=save|restore` files (absent: 501). */
  slotSavePath?: string;
  /** `GET /slots` (llama-server's `--slots`, default on; `--no-slots` turns it off). */
  slotsEndpoint?: boolean;
  /** `POST /props` (llama-server's `--props`, default off: 501). */
  propsEndpoint?: boolean;
  /** CORS headers and preflight (default llama-server's: any origin, credentials allowed). */
  cors?: CorsOptions;
  /** `/props` `build_info`. */
  build?: string;
  /** A request's `cache_prompt` when it sends none (llama-server's `--cache-prompt`, default true). */
  cachePrompt?: boolean;
  /** `--chat-template(-file)`: rendered instead of the model's template. */
  chatTemplate?: string;
  /**
   * Jinja chat templates through llama.cpp's common chat layer (llama-server's `--jinja`, default
   * true): tools, tool calls, reasoning. false (`--no-jinja`): llama.cpp's legacy renderer.
   */
  jinja?: boolean;
  /** `--reasoning-format`: none, auto (default), deepseek, deepseek-legacy. */
  reasoningFormat?: string;
  /** `--chat-template-kwargs`: template variables for every chat (a request's own win). */
  chatTemplateKwargs?: Record<string, unknown>;
  /** The `/control/*` routes (src/control); answers true when it handled the request. */
  control?: (req: IncomingMessage, res: ServerResponse, path: string) => Promise<boolean>;
}

/** Defaults of the optional {@link HttpOptions} limits. */
export const HTTP_DEFAULTS = {
  maxConnections: 1024,
  maxConnectionsPerSource: 256,
  keepAliveTimeoutMs: 5000,
  headersTimeoutMs: 10_000,
  maxPromptBytes: 0,
  maxMessages: 0,
} as const;

/** Counters of the HTTP server (also in `/metrics`). */
export interface HttpStats {
  connections: number;
  refusedConnections: number;
  unauthorized: number;
}

function positiveInt(options: Record<string, unknown>, key: string, dflt: number, min = 1): number {
  const v = options[key] ?? dflt;
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) {
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `options.${key} must be an integer >= ${min}`, {
      keys: [key],
    });
  }
  return v;
}

function keyMatches(given: string, keys: readonly Buffer[]): boolean {
  const g = Buffer.from(given);
  let ok = false;
  // Every key is compared, in constant time each: the answer time says nothing about the keys.
  for (const k of keys) if (k.length === g.length && timingSafeEqual(k, g)) ok = true;
  return ok;
}

/** `--api-key k1,k2` as llama-server reads it: comma-separated, empty entries dropped. */
export function splitApiKeys(value: string): string[] {
  return value.split(',').filter((k) => k.length > 0);
}

/** The OpenAI-compatible HTTP API, `/health` and `/metrics`, on node:http. */
export class HttpApi {
  readonly #opts: HttpOptions;
  readonly #server: Server;
  readonly #keys: Buffer[];
  readonly #maxConnections: number;
  readonly #maxPerSource: number;
  readonly #maxPromptBytes: number;
  readonly #maxMessages: number;
  readonly #perSource = new Map<string, number>();
  readonly #refusedSockets = new WeakSet<Socket>();
  readonly #bodies = new BodyParser();
  readonly #routes: RouteHandler[];
  readonly #cors: CorsOptions;
  readonly #aliases: readonly string[];
  readonly #records = new WeakMap<ServerResponse, RequestRecord>();
  /** Set by {@link beginShutdown}: the Retry-After of every refusal. */
  #shutdownRetryS: number | undefined;
  #open = 0;
  #refused = 0;
  #unauthorized = 0;

  constructor(options: HttpOptions) {
    if (!options || typeof options !== 'object')
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options must be an object');
    const o = options as unknown as Record<string, unknown>;
    const keys = options.apiKeys ?? [];
    if (!Array.isArray(keys) || !keys.every((k) => typeof k === 'string' && k.length > 0)) {
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.apiKeys must be non-empty strings', {
        keys: ['apiKeys'],
      });
    }
    this.#keys = keys.map((k) => Buffer.from(k));
    positiveInt(o, 'maxBodyBytes', Number.NaN);
    positiveInt(o, 'bodyTimeoutMs', Number.NaN);
    this.#maxConnections = positiveInt(o, 'maxConnections', HTTP_DEFAULTS.maxConnections);
    this.#maxPerSource = positiveInt(o, 'maxConnectionsPerSource', HTTP_DEFAULTS.maxConnectionsPerSource);
    const keepAlive = positiveInt(o, 'keepAliveTimeoutMs', HTTP_DEFAULTS.keepAliveTimeoutMs);
    const headers = positiveInt(o, 'headersTimeoutMs', HTTP_DEFAULTS.headersTimeoutMs);
    this.#maxPromptBytes = positiveInt(o, 'maxPromptBytes', HTTP_DEFAULTS.maxPromptBytes, 0);
    this.#maxMessages = positiveInt(o, 'maxMessages', HTTP_DEFAULTS.maxMessages, 0);
    const aliases = options.aliases ?? [];
    if (!Array.isArray(aliases) || !aliases.every((a) => typeof a === 'string' && a.length > 0))
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.aliases must be non-empty strings', {
        keys: ['aliases'],
      });
    this.#aliases = aliases;
    if (
      options.slotSavePath !== undefined &&
      (typeof options.slotSavePath !== 'string' || !options.slotSavePath)
    )
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.slotSavePath must be a folder path', {
        keys: ['slotSavePath'],
      });
    this.#cors = { ...CORS_DEFAULTS, ...options.cors };
    this.#opts = options;
    const ctx: RouteContext = {
      opts: options,
      engine: options.engine,
      bodies: this.#bodies,
      aliases,
      modelName: () => this.#modelName(),
      epochHeader: () => this.#epochHeader(),
      send: (res, status, body) => sendJson(res, status, body, this.#epochHeader()),
      readBody: (req) => readBody(req, options.maxBodyBytes, options.bodyTimeoutMs),
      promptByteLimit: () => this.#promptByteLimit(),
      messageLimit: () => this.#messageLimit(),
      record: (res) => this.#records.get(res),
      methodNotAllowed: (req, res) => this.#methodNotAllowed(req, res),
      httpMetricsText: () => this.#metricsText(),
    };
    this.#routes = ROUTE_MODULES.map((module) => module(ctx));
    this.#server = createServer(
      // Node closes connections past their header or request deadline only when it checks: every
      // quarter of the header timeout, so an idle connection lives at most 1.25x of it.
      { connectionsCheckingInterval: Math.max(50, Math.floor(headers / 4)) },
      (req, res) => {
        if (this.#refusedSockets.has(req.socket)) return;
        this.#track(req, res);
        if (this.#shutdownRetryS !== undefined && !req.url?.startsWith('/metrics')) {
          req.resume();
          const err = new HydraError('HYDRA_ERR_SHUTTING_DOWN', 'the engine is shutting down');
          const rec = this.#records.get(res);
          if (rec) rec.code = err.code;
          sendError(res, err, { 'retry-after': String(this.#shutdownRetryS), connection: 'close' });
          return;
        }
        this.#route(req, res).catch((err) => {
          const rec = this.#records.get(res);
          if (rec) rec.code = err instanceof HydraError ? err.code : 'HYDRA_ERR_INTERNAL';
          sendError(res, err);
        });
      },
    );
    this.#server.headersTimeout = headers;
    // The body has its own deadline (readJson's 408 with a code); this one backs it up.
    this.#server.requestTimeout = headers + options.bodyTimeoutMs + 1000;
    this.#server.keepAliveTimeout = keepAlive;
    // Before Node's own listener, so a refused socket is paused before its parser reads from it.
    this.#server.prependListener('connection', (socket: Socket) => this.#admit(socket));
  }

  /** Connection and authorization counters. */
  stats(): HttpStats {
    return { connections: this.#open, refusedConnections: this.#refused, unauthorized: this.#unauthorized };
  }

  // A refused connection gets a 503 with a code, not a reset: a client can tell "full" from "down".
  #admit(socket: Socket): void {
    const source = socket.remoteAddress ?? '';
    const fromSource = this.#perSource.get(source) ?? 0;
    if (this.#open >= this.#maxConnections || fromSource >= this.#maxPerSource) {
      this.#refused++;
      this.#refusedSockets.add(socket);
      const message =
        this.#open >= this.#maxConnections
          ? `the server has ${this.#open} connections open (the limit)`
          : `${source} has ${fromSource} connections open (the per-source limit)`;
      const body = JSON.stringify({
        error: { message, type: 'server_error', code: 'HYDRA_ERR_TOO_MANY_CONNECTIONS' },
      });
      socket.on('error', () => undefined);
      socket.end(
        `HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      );
      socket.pause();
      setTimeout(() => socket.destroy(), 1000).unref();
      return;
    }
    this.#open++;
    this.#perSource.set(source, fromSource + 1);
    socket.once('close', () => {
      this.#open--;
      const n = (this.#perSource.get(source) ?? 1) - 1;
      if (n > 0) this.#perSource.set(source, n);
      else this.#perSource.delete(source);
    });
  }

  #authorized(req: IncomingMessage): boolean {
    if (this.#keys.length === 0) return true;
    let given = req.headers.authorization ?? req.headers['x-api-key'] ?? '';
    if (Array.isArray(given)) given = given[0] ?? '';
    if (given.startsWith('Bearer ')) given = given.slice('Bearer '.length);
    return keyMatches(given, this.#keys);
  }

  listen(port: number, host: string): Promise<AddressInfo> {
    return new Promise((resolve, reject) => {
      this.#server.once('error', reject);
      this.#server.listen(port, host, () => {
        this.#server.off('error', reject);
        resolve(this.#server.address() as AddressInfo);
      });
    });
  }

  close(): Promise<void> {
    return new Promise((resolve) => {
      this.#server.close(() => {
        this.#bodies.close().then(() => resolve(), resolve);
      });
      this.#server.closeIdleConnections();
      setTimeout(() => this.#server.closeAllConnections(), 2000).unref();
    });
  }

  /**
   * Refuses every later request but `/metrics` with 503 `HYDRA_ERR_SHUTTING_DOWN` and
   * `Retry-After: retryAfterS`; requests already admitted go on.
   */
  beginShutdown(retryAfterS: number): void {
    this.#shutdownRetryS = Math.max(1, Math.ceil(retryAfterS));
    this.#server.closeIdleConnections();
  }

  #track(req: IncomingMessage, res: ServerResponse): void {
    const onRequest = this.#opts.onRequest;
    if (!onRequest) return;
    const t0 = performance.now();
    const rec: RequestRecord = {
      method: req.method ?? '',
      route: (req.url ?? '/').split('?')[0]!.replace(/\/+$/, '') || '/',
      status: 0,
      durationMs: 0,
    };
    this.#records.set(res, rec);
    res.once('close', () => {
      rec.status = res.headersSent ? res.statusCode : 0;
      rec.durationMs = performance.now() - t0;
      rec.code ??= sentCode(res);
      if (rec.ttftMs !== undefined) rec.ttftMs -= t0;
      try {
        onRequest(rec);
      } catch {
        // A failing log sink must not take the server down.
      }
    });
  }

  // llama-server's model name: the first alias, else the file.
  #modelName(): string {
    const { engine } = this.#opts;
    if (!engine.modelPath) return '';
    return this.#aliases[0] ?? this.#opts.modelId?.() ?? engine.modelPath;
  }

  #epochHeader(): Record<string, string> {
    return { 'x-hydra-config-epoch': String(this.#opts.engine.epoch) };
  }

  async #route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://x');
    const path = url.pathname.replace(/\/+$/, '') || '/';
    if (applyCors(this.#cors, req, res)) return;
    if (!PUBLIC_PATHS.has(path) && !this.#authorized(req)) {
      this.#unauthorized++;
      req.resume();
      sendError(res, new HydraError('HYDRA_ERR_UNAUTHORIZED', 'missing or wrong API key'));
      return;
    }
    for (const handle of this.#routes) if (await handle(req, res, url, path)) return;
    req.resume();
    sendError(res, new HydraError('HYDRA_ERR_NOT_FOUND', `no route ${req.method} ${path}`));
  }

  #metricsText(): string {
    const s = this.stats();
    return [
      '# HELP hydra_http_connections Open HTTP connections.',
      '# TYPE hydra_http_connections gauge',
      `hydra_http_connections ${s.connections}`,
      '# HELP hydra_http_connections_refused_total HTTP connections refused by the connection caps.',
      '# TYPE hydra_http_connections_refused_total counter',
      `hydra_http_connections_refused_total ${s.refusedConnections}`,
      '# HELP hydra_http_unauthorized_total HTTP requests refused for a missing or wrong API key.',
      '# TYPE hydra_http_unauthorized_total counter',
      `hydra_http_unauthorized_total ${s.unauthorized}`,
      '',
    ].join('\n');
  }

  // Sized from a slot so that a prompt that fits one is never refused for its bytes: 64 bytes per
  // token is above the longest token of common vocabularies.
  #promptByteLimit(): number {
    return this.#maxPromptBytes || Math.max(1 << 20, 64 * this.#opts.engine.slots.nCtxSeq);
  }

  // A chat template spends a few tokens per message on its markers, so more messages than half a
  // slot's tokens cannot fit one.
  #messageLimit(): number {
    return this.#maxMessages || Math.max(256, Math.floor(this.#opts.engine.slots.nCtxSeq / 2));
  }

  #methodNotAllowed(req: IncomingMessage, res: ServerResponse): void {
    req.resume();
    sendError(res, new HydraError('HYDRA_ERR_METHOD_NOT_ALLOWED', `${req.method} is not allowed here`));
  }
}
