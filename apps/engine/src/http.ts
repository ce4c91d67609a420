import { randomUUID, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { Allowlist } from '@hydra-engine/hydra-rpc';
import { type ChatCommonParams, jsonSchemaToGrammar } from '@hydra-engine/native-ggml';
import { BodyParser, type PreparedBody } from './body.js';
import { ChatStreamDiff, chatReply, chatSampler, renderJinjaChat, withoutChatFields } from './chat.js';
import type { Engine, GenerationParams, GenerationResult } from './engine.js';
import { HydraError, httpStatus } from './errors.js';
import type { RequestRecord } from './metrics.js';
import { checkSampler, requestSettings } from './request-params.js';
import { applyCors, CORS_DEFAULTS, type CorsOptions } from './routes/cors.js';
import { chatTemplateOptions, generationSettings, LlamaRoutes, stopType } from './routes/llama.js';

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

function errorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 404) return 'not_found_error';
  if (status === 429) return 'rate_limit_error';
  if (status === 501) return 'not_supported_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

// The code each error answer carried, for the request log line.
const sentCodes = new WeakMap<ServerResponse, string>();

function sendError(res: ServerResponse, err: unknown, headers: Record<string, string> = {}): void {
  const code = err instanceof HydraError ? err.code : 'HYDRA_ERR_INTERNAL';
  if (!res.headersSent) sentCodes.set(res, code);
  const status = httpStatus(code);
  const message = err instanceof Error ? err.message : String(err);
  const keys = err instanceof HydraError ? err.keys : undefined;
  if (res.headersSent) return;
  sendJson(
    res,
    status,
    { error: { message, type: errorType(status), code, ...(keys?.length ? { keys } : {}) } },
    headers,
  );
}

/** Reads a body with a size cap (413) and a deadline (408). */
function readBody(req: IncomingMessage, maxBytes: number, timeoutMs: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > maxBytes) {
      reject(
        new HydraError('HYDRA_ERR_BODY_TOO_LARGE', `the body is ${declared} bytes; the limit is ${maxBytes}`),
      );
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    const finish = (err: HydraError | undefined, value?: Buffer) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (err) {
        req.removeAllListeners('data');
        req.resume();
        reject(err);
      } else resolve(value as Buffer);
    };
    const timer = setTimeout(
      () =>
        finish(
          new HydraError(
            'HYDRA_ERR_REQUEST_TIMEOUT',
            `the request body did not arrive within ${timeoutMs} ms`,
          ),
        ),
      timeoutMs,
    );
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > maxBytes) {
        finish(new HydraError('HYDRA_ERR_BODY_TOO_LARGE', `the body exceeds the limit of ${maxBytes} bytes`));
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => finish(undefined, Buffer.concat(chunks)));
    req.on('error', (err) =>
      finish(new HydraError('HYDRA_ERR_BAD_REQUEST', `reading the body failed: ${err.message}`)),
    );
  });
}

function badRequest(message: string, key?: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_REQUEST', message, key ? { keys: [key] } : {});
}

/** llama-server's `timings` of a native answer (server_slot_stats::to_json). */
function nativeTimings(
  result: GenerationResult,
  promptMs: number,
  predictedMs: number,
): Record<string, number> {
  const promptN = result.promptTokens - result.cachedTokens;
  const n = result.completionTokens;
  return {
    cache_n: result.cachedTokens,
    prompt_n: promptN,
    prompt_ms: promptMs,
    prompt_per_token_ms: promptN > 0 ? promptMs / promptN : 0,
    prompt_per_second: promptMs > 0 ? (1000 * promptN) / promptMs : 0,
    predicted_n: n,
    predicted_ms: predictedMs,
    predicted_per_token_ms: n > 0 ? predictedMs / n : 0,
    predicted_per_second: predictedMs > 0 ? (1000 * n) / predictedMs : 0,
  };
}

/** llama-server's `response_fields` (json_get_nested_values): only those paths, `a/b` keyed as given. */
function pickFields(fields: unknown, answer: Record<string, unknown>): Record<string, unknown> {
  if (!Array.isArray(fields) || fields.length === 0) return answer;
  const out: Record<string, unknown> = {};
  for (const path of fields as string[]) {
    let at: unknown = answer;
    let found = true;
    for (const k of path.split('/')) {
      if (found && typeof at === 'object' && at !== null && !Array.isArray(at) && k in at)
        at = (at as Record<string, unknown>)[k];
      else found = false;
    }
    if (found) out[path] = at;
  }
  return out;
}

/** Validates a request's T1 settings (see request-params.ts) and merges them over the configuration in force. */
export function generationParams(engine: Engine, body: Record<string, unknown>): GenerationParams {
  const settings = requestSettings(body, engine.layers.effective(), { jsonSchemaToGrammar });
  if (engine.model) checkSampler(engine.model, settings.sampler, settings.fields);
  let stop: string[] = [];
  if (typeof body.stop === 'string') stop = [body.stop];
  else if (Array.isArray(body.stop)) {
    if (!body.stop.every((s) => typeof s === 'string') || body.stop.length > 16) {
      throw badRequest('stop must be a string or an array of at most 16 strings', 'stop');
    }
    stop = body.stop as string[];
  } else if (body.stop !== undefined && body.stop !== null)
    throw badRequest('stop must be a string or an array of strings', 'stop');
  stop = stop.filter((s) => s.length > 0);
  return {
    maxTokens: settings.nPredict < 0 ? Number.MAX_SAFE_INTEGER : settings.nPredict,
    stop,
    sampler: settings.sampler,
    ignoreEos: settings.ignoreEos,
  };
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

const PUBLIC_PATHS = new Set(['/health', '/v1/health']);

/** `--api-key k1,k2` as llama-server reads it: comma-separated, empty entries dropped. */
export function splitApiKeys(value: string): string[] {
  return value.split(',').filter((k) => k.length > 0);
}

/** The OpenAI-compatible HTTP API, `/health` and `/metrics`, on node:http. */
export class HttpApi {
  readonly #opts: HttpOptions;
  readonly #server: Server;
  readonly #keys: Buffer[];
  readonly #metricsAllow: Allowlist | undefined;
  readonly #maxConnections: number;
  readonly #maxPerSource: number;
  readonly #maxPromptBytes: number;
  readonly #maxMessages: number;
  readonly #perSource = new Map<string, number>();
  readonly #refusedSockets = new WeakSet<Socket>();
  readonly #bodies = new BodyParser();
  readonly #llama: LlamaRoutes;
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
    this.#metricsAllow = options.metricsAllowFrom ? new Allowlist(options.metricsAllowFrom) : undefined;
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
    this.#llama = new LlamaRoutes({
      engine: options.engine,
      bodies: this.#bodies,
      modelId: () => this.#modelName(),
      ...(options.slotSavePath !== undefined ? { slotSavePath: options.slotSavePath } : {}),
      slotsEndpoint: options.slotsEndpoint ?? true,
      readBody: (req) => readBody(req, options.maxBodyBytes, options.bodyTimeoutMs),
      promptByteLimit: () => this.#promptByteLimit(),
      messageLimit: () => this.#messageLimit(),
      build: options.build ?? 'hydra-engine',
      ...(options.chatTemplate !== undefined ? { chatTemplate: options.chatTemplate } : {}),
      jinja: options.jinja ?? true,
      ...(options.reasoningFormat !== undefined ? { reasoningFormat: options.reasoningFormat } : {}),
      ...(options.chatTemplateKwargs !== undefined ? { chatTemplateKwargs: options.chatTemplateKwargs } : {}),
    });
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
      rec.code ??= sentCodes.get(res);
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

  #modelObject(): Record<string, unknown> {
    const m = this.#opts.engine.model?.info;
    return {
      id: this.#modelName(),
      object: 'model',
      created: 0,
      owned_by: 'hydra-engine',
      ...(this.#aliases.length > 1 ? { aliases: this.#aliases } : {}),
      // The native model facts, and llama-server's meta keys (`size` is one of both).
      meta: m
        ? { ...m, n_vocab: m.nVocab, n_ctx_train: m.nCtxTrain, n_embd: m.nEmbd, n_params: m.nParams }
        : null,
    };
  }

  #health(res: ServerResponse): void {
    const { engine } = this.#opts;
    const state = engine.state;
    const degraded = engine.degraded;
    // llama-server's 503 while loading (what readiness probes wait on), from the moment a model is
    // configured (the GGUF checks before the load runs it still say `empty`); a model-less engine
    // is up and says so (it serves /control and waits for a model).
    const loading = state === 'loading' || (state === 'empty' && Boolean(engine.layers.get('model')));
    const unavailable = loading
      ? 'Loading model'
      : state === 'error'
        ? `The model failed to load: ${engine.lastError ?? 'unknown error'}`
        : undefined;
    const body = {
      ...(unavailable ? { error: { code: 503, message: unavailable, type: 'unavailable_error' } } : {}),
      status:
        state === 'ready'
          ? degraded
            ? 'degraded'
            : 'ok'
          : loading
            ? 'loading'
            : state === 'empty'
              ? 'no_model'
              : state,
      state,
      ...(state === 'empty' && !loading ? { message: 'no model is loaded' } : {}),
      ...(degraded ? { degraded } : {}),
      epoch: engine.epoch,
      slots: engine.slots,
      queue: engine.queueDepth,
      ...(engine.placement ? { placement: engine.placement.rows } : {}),
    };
    sendJson(res, unavailable ? 503 : 200, body, this.#epochHeader());
  }

  #epochHeader(): Record<string, string> {
    return { 'x-hydra-config-epoch': String(this.#opts.engine.epoch) };
  }

  async #route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://x');
    const path = url.pathname.replace(/\/+$/, '') || '/';
    const { engine } = this.#opts;
    if (applyCors(this.#cors, req, res)) return;
    if (!PUBLIC_PATHS.has(path) && !this.#authorized(req)) {
      this.#unauthorized++;
      req.resume();
      sendError(res, new HydraError('HYDRA_ERR_UNAUTHORIZED', 'missing or wrong API key'));
      return;
    }
    if (PUBLIC_PATHS.has(path) && req.method === 'GET') {
      this.#health(res);
      return;
    }
    if (path === '/metrics' && req.method === 'GET') {
      if (this.#metricsAllow && !this.#metricsAllow.allows(req.socket.remoteAddress)) {
        req.resume();
        sendError(
          res,
          new HydraError('HYDRA_ERR_FORBIDDEN', `${req.socket.remoteAddress} is not in --control-allow-from`),
        );
        return;
      }
      const text = (await this.#opts.metrics()) + this.#metricsText();
      res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4', ...this.#epochHeader() });
      res.end(text);
      return;
    }
    if (this.#opts.control && (await this.#opts.control(req, res, path))) return;
    const send = (status: number, body: unknown) => sendJson(res, status, body, this.#epochHeader());
    if (await this.#llama.handle(req, url, path, send, () => this.#methodNotAllowed(req, res))) return;
    const one = /^(?:\/v1)?\/models\/(.+)$/.exec(path);
    if (one) {
      if (req.method !== 'GET') return this.#methodNotAllowed(req, res);
      const id = decodeURIComponent(one[1]!);
      const known =
        engine.modelPath !== undefined && (id === this.#modelName() || this.#aliases.includes(id));
      if (!known) throw new HydraError('HYDRA_ERR_NOT_FOUND', `no model ${JSON.stringify(id)}`);
      send(200, this.#modelObject());
      return;
    }
    const routes = [
      '/v1/models',
      '/models',
      '/v1/chat/completions',
      '/chat/completions',
      '/v1/completions',
      '/completions',
      '/completion',
    ];
    if (!routes.includes(path)) {
      req.resume();
      sendError(res, new HydraError('HYDRA_ERR_NOT_FOUND', `no route ${req.method} ${path}`));
      return;
    }
    if (path.endsWith('/models')) {
      if (req.method !== 'GET') return this.#methodNotAllowed(req, res);
      const data = engine.modelPath ? [this.#modelObject()] : [];
      sendJson(res, 200, { object: 'list', data }, this.#epochHeader());
      return;
    }
    if (req.method !== 'POST') return this.#methodNotAllowed(req, res);
    const data = await readBody(req, this.#opts.maxBodyBytes, this.#opts.bodyTimeoutMs).catch((err) => {
      sendError(res, err, { connection: 'close' });
      return undefined;
    });
    if (data === undefined) return;
    const chat = path.endsWith('/chat/completions');
    const prepared = await this.#bodies.parse(
      data,
      chat,
      this.#messageLimit(),
      chat && this.#opts.jinja !== false,
    );
    // llama-server: /completion and /completions answer in its own shape, /v1/completions in OpenAI's.
    await this.#complete(req, res, prepared, chat, path === '/completion' || path === '/completions');
  }

  // llama-server's native /completion answer (server_task_result_cmpl_final::to_json_non_oaicompat).
  #nativeFinal(
    body: Record<string, unknown>,
    params: GenerationParams,
    prompt: Int32Array,
    result: GenerationResult,
    model: string,
    stream: boolean,
  ): Record<string, unknown> {
    const m = this.#opts.engine.model;
    const full = m ? Buffer.concat(result.tokens.map((t) => m.tokenBytes(t))).toString('utf8') : result.text;
    // The request's settings once more, for their names (already validated; the grammar fields are
    // taken from the sampler, which holds the converted grammar).
    const { json_schema: _j, response_format: _r, ...plain } = body;
    const settings = requestSettings(plain, this.#opts.engine.layers.effective()).effective;
    const grammar = (params.sampler as { grammar?: string }).grammar;
    if (grammar !== undefined) settings['sampling.grammar'] = grammar;
    const nCtx = this.#opts.engine.slots.nCtxSeq;
    return {
      index: 0,
      content: result.text,
      tokens: body.return_tokens === true || stream ? result.tokens : [],
      id_slot: result.slot,
      stop: true,
      model,
      tokens_predicted: result.completionTokens,
      tokens_evaluated: result.promptTokens,
      generation_settings: {
        n_ctx: nCtx,
        model,
        ...generationSettings(settings, { stop: params.stop, stream }),
      },
      prompt: typeof body.prompt === 'string' ? body.prompt : m ? m.detokenize(prompt) : '',
      has_new_line: result.text.includes('\n'),
      truncated: result.finishReason === 'length' && result.promptTokens + result.completionTokens >= nCtx,
      ...stopType(result, params, full),
      tokens_cached: result.cachedTokens,
    };
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

  #checkPromptBytes(bytes: number, key: string): void {
    const limit = this.#promptByteLimit();
    if (bytes > limit) {
      throw new HydraError(
        'HYDRA_ERR_PROMPT_TOO_LARGE',
        `the prompt is ${bytes} bytes; the limit is ${limit}`,
        {
          keys: [key],
        },
      );
    }
  }

  async #complete(
    req: IncomingMessage,
    res: ServerResponse,
    prepared: PreparedBody,
    chat: boolean,
    native = false,
  ): Promise<void> {
    const { engine } = this.#opts;
    const { body } = prepared;
    const stream = body.stream === true;
    if (body.stream !== undefined && typeof body.stream !== 'boolean')
      throw badRequest('stream must be a boolean', 'stream');
    const fields = body.response_fields;
    if (fields !== undefined && fields !== null) {
      if (!native)
        throw new HydraError('HYDRA_ERR_UNSUPPORTED_FIELD', 'response_fields is for /completion only', {
          keys: ['response_fields'],
        });
      if (!Array.isArray(fields) || !fields.every((f) => typeof f === 'string'))
        throw badRequest('response_fields must be an array of strings', 'response_fields');
    }
    let promptText = '';
    if (prepared.chat) this.#checkPromptBytes(prepared.chat.bytes, 'messages');
    else if (!prepared.tokens) {
      if (typeof body.prompt !== 'string')
        throw badRequest('prompt must be a string or an array of token ids', 'prompt');
      this.#checkPromptBytes(Buffer.byteLength(body.prompt), 'prompt');
      promptText = body.prompt;
    }
    const slotField = body.slot_id ?? body.id_slot;
    if (slotField !== undefined && slotField !== null && slotField !== -1 && !Number.isSafeInteger(slotField))
      throw badRequest('slot_id must be an integer', 'slot_id');
    if (body.cache_prompt !== undefined && typeof body.cache_prompt !== 'boolean')
      throw badRequest('cache_prompt must be a boolean', 'cache_prompt');
    // Jinja templates: llama.cpp's common chat layer renders the chat and gives the tool-call grammar.
    let rendered: ChatCommonParams | undefined;
    if (prepared.chat?.messagesJson) {
      engine.assertReady();
      rendered = await renderJinjaChat(
        engine.model!,
        body,
        prepared.chat.messagesJson,
        {
          ...(this.#opts.chatTemplate !== undefined ? { template: this.#opts.chatTemplate } : {}),
          ...(this.#opts.reasoningFormat !== undefined
            ? { reasoningFormat: this.#opts.reasoningFormat }
            : {}),
          ...(this.#opts.chatTemplateKwargs !== undefined
            ? { chatTemplateKwargs: this.#opts.chatTemplateKwargs }
            : {}),
        },
        true,
      );
    }
    let params = generationParams(engine, rendered ? withoutChatFields(body) : body);
    if (rendered) {
      params = {
        ...params,
        sampler: chatSampler(params.sampler, rendered, body),
        stop: [...params.stop, ...rendered.additionalStops],
      };
      if (engine.model && rendered.grammar !== '')
        checkSampler(engine.model, params.sampler, {
          grammar: 'tools',
          logit_bias: 'logit_bias',
          samplers: 'samplers',
        });
    }
    const chatOptions = prepared.chat && !rendered ? chatTemplateOptions(body) : undefined;
    let prompt: Int32Array;
    if (prepared.tokens) {
      const nVocab = engine.model?.info.nVocab ?? 0;
      if (prepared.tokens.max >= nVocab)
        throw badRequest(`prompt token ids must be below ${nVocab}`, 'prompt');
      engine.assertReady();
      prompt = prepared.tokens.ids;
    } else {
      // Rendering and tokenizing run off the JS thread: a big input must not stall /health. A model
      // swapped meanwhile has another vocabulary: the tokens are made again for the new one.
      let tokens: Int32Array | undefined;
      for (let attempt = 0; attempt < 2 && tokens === undefined; attempt++) {
        const model = engine.model;
        // The chat layer tokenized a rendered prompt in its own job, with the model it rendered for.
        const t = rendered
          ? rendered.tokens!
          : prepared.chat
            ? await (this.#opts.chatTemplate === undefined && chatOptions!.addAssistant
                ? engine.chatTokensAsync(prepared.chat.packed)
                : engine.model!.tokenizeChatAsync(prepared.chat.packed, {
                    addAssistant: chatOptions!.addAssistant,
                    ...(this.#opts.chatTemplate !== undefined ? { template: this.#opts.chatTemplate } : {}),
                  }))
            : await engine.tokenizeAsync(promptText);
        if (engine.model === model) tokens = t;
      }
      if (tokens === undefined)
        throw new HydraError('HYDRA_ERR_LOADING', 'the model changed while the prompt was tokenized');
      prompt = tokens;
      if (req.socket.destroyed) return;
    }
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID()}`;
    const created = Math.floor(Date.now() / 1000);
    const model = this.#modelName();
    const abort = new AbortController();
    const includeUsage = (body.stream_options as Record<string, unknown> | undefined)?.include_usage === true;
    const onClose = () => {
      if (!res.writableFinished) abort.abort();
    };
    res.on('close', onClose);
    const epochHeaders = this.#epochHeader();
    let onText: ((t: string) => void) | undefined;
    const chunk = (delta: Record<string, unknown>, finish: string | null) =>
      chat
        ? {
            id,
            object: 'chat.completion.chunk',
            created,
            model,
            choices: [{ index: 0, delta, finish_reason: finish }],
          }
        : {
            id,
            object: 'text_completion',
            created,
            model,
            choices: [{ index: 0, text: delta.content ?? '', finish_reason: finish }],
          };
    const write = (obj: unknown) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
    let diff: ChatStreamDiff | undefined;
    // Generated token ids since the last streamed text (llama-server's native chunks carry them).
    let pendingTokens: number[] = [];
    let predicted = 0;
    if (stream && native) {
      onText = (text) => {
        if (!res.headersSent) {
          res.writeHead(200, {
            'content-type': 'text/event-stream',
            'cache-control': 'no-cache',
            connection: 'keep-alive',
            ...epochHeaders,
          });
        }
        write({
          index: 0,
          content: text,
          tokens: pendingTokens,
          stop: false,
          id_slot: -1,
          tokens_predicted: predicted,
          tokens_evaluated: prompt.length,
        });
        pendingTokens = [];
      };
    } else if (stream) {
      let first = true;
      const send = (delta: Record<string, unknown>) => {
        if (!res.headersSent) {
          res.writeHead(200, {
            'content-type': 'text/event-stream',
            'cache-control': 'no-cache',
            connection: 'keep-alive',
            ...epochHeaders,
          });
        }
        write(chunk(first && chat ? { role: 'assistant', ...delta } : delta, null));
        first = false;
      };
      // Parsing the text so far after every piece (as llama-server) is only needed where it can
      // differ from the text: tool calls or reasoning to split out.
      if (rendered && (rendered.parseToolCalls || rendered.supportsThinking)) {
        diff = new ChatStreamDiff(rendered, send);
        const d = diff;
        onText = (text) => d.push(text);
      } else onText = (text) => send({ content: text });
    }
    const rec = this.#records.get(res);
    // Absolute times until the record is closed (#track makes ttftMs relative to the request).
    let lastToken = 0;
    const onToken = rec
      ? () => {
          lastToken = performance.now();
          rec.ttftMs ??= lastToken;
        }
      : undefined;
    // llama-server's timings, seen from here: the prompt from admission to the first token,
    // generation from there to the end.
    const submitted = performance.now();
    let firstToken: number | undefined;
    const nativeToken = native
      ? (t: number) => {
          firstToken ??= performance.now();
          if (stream) {
            pendingTokens.push(t);
            predicted++;
          }
          onToken?.();
        }
      : undefined;
    // Admission errors throw here, before any byte of the response.
    const pending = engine.submit(prompt, params, {
      signal: abort.signal,
      ...(onText ? { onText } : {}),
      ...(onToken ? { onToken } : {}),
      ...(nativeToken ? { onToken: nativeToken } : {}),
      ...(typeof slotField === 'number' && slotField >= 0 ? { slot: slotField } : {}),
      // On by default, as llama-server: a request that shares a slot's prefix skips its prefill.
      ...((body.cache_prompt ?? this.#opts.cachePrompt ?? true) === true ? { cachePrompt: true } : {}),
    });
    let result: GenerationResult;
    try {
      result = await pending;
    } catch (err) {
      if (rec) rec.code = (err as HydraError).code ?? 'HYDRA_ERR_INTERNAL';
      if (res.headersSent) {
        const e = err as HydraError;
        write({ error: { message: e.message, code: e.code ?? 'HYDRA_ERR_INTERNAL' } });
        // The terminator too: an OpenAI client waits for it to tell an ended stream from a cut one.
        res.end('data: [DONE]\n\n');
        return;
      }
      throw err;
    } finally {
      res.off('close', onClose);
    }
    if (rec) {
      rec.promptTokens = result.promptTokens;
      rec.completionTokens = result.completionTokens;
      rec.cachedTokens = result.cachedTokens;
      rec.finishReason = result.finishReason;
      rec.epoch = result.epoch;
      rec.slot = result.slot;
      rec.queueMs = result.queueMs;
      if (rec.ttftMs !== undefined) rec.decodeMs = lastToken - rec.ttftMs;
    }
    if (result.finishReason === 'cancelled') {
      res.destroy();
      return;
    }
    const usage = {
      prompt_tokens: result.promptTokens,
      completion_tokens: result.completionTokens,
      total_tokens: result.promptTokens + result.completionTokens,
      prompt_tokens_details: { cached_tokens: result.cachedTokens },
    };
    const headers = { 'x-hydra-config-epoch': String(result.epoch) };
    if (native) {
      const ended = performance.now();
      // The prompt's time from when the request got its slot (llama-server's timings start there).
      const timings = nativeTimings(
        result,
        Math.max(0, (firstToken ?? ended) - submitted - result.queueMs),
        ended - (firstToken ?? ended),
      );
      const final = pickFields(body.response_fields, {
        ...this.#nativeFinal(body, params, prompt, result, model, stream),
        timings,
      });
      if (stream) {
        if (!res.headersSent)
          res.writeHead(200, {
            'content-type': 'text/event-stream',
            'cache-control': 'no-cache',
            ...headers,
          });
        // llama-server ends a native stream with the final object (stop: true), no [DONE].
        write({ ...final, content: '', tokens: pendingTokens });
        res.end();
        return;
      }
      sendJson(res, 200, final, headers);
      return;
    }
    if (stream) {
      if (diff) await diff.end();
      if (!res.headersSent) {
        res.writeHead(200, {
          'content-type': 'text/event-stream',
          'cache-control': 'no-cache',
          connection: 'keep-alive',
          ...headers,
        });
      }
      const finish = diff?.calledTools && result.finishReason === 'stop' ? 'tool_calls' : result.finishReason;
      write(chunk(chat ? {} : { content: '' }, finish));
      if (includeUsage)
        write({
          id,
          object: chat ? 'chat.completion.chunk' : 'text_completion',
          created,
          model,
          choices: [],
          usage,
        });
      res.end('data: [DONE]\n\n');
      return;
    }
    const reply = rendered ? await chatReply(result.text, rendered, result.finishReason) : undefined;
    const choice = chat
      ? {
          index: 0,
          message: reply?.message ?? { role: 'assistant', content: result.text },
          finish_reason: reply?.finishReason ?? result.finishReason,
          logprobs: null,
        }
      : {
          index: 0,
          text: result.text,
          finish_reason: result.finishReason,
          logprobs: null,
          // llama.cpp server's `return_tokens`: the ids to continue a cached slot with.
          ...(body.return_tokens === true ? { tokens: result.tokens } : {}),
        };
    sendJson(
      res,
      200,
      { id, object: chat ? 'chat.completion' : 'text_completion', created, model, choices: [choice], usage },
      headers,
    );
  }
}
