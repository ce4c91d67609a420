// The request plumbing every route module shares: the JSON and error edge (OpenAI's error shape
// with the HydraError code, the HTTP status per code), the capped body reader, and the context
// and module types the route list in routes/index.ts is made of.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { BodyParser } from '../body.js';
import type { Engine } from '../engine.js';
import { HydraError, httpStatus } from '../errors.js';
import type { HttpOptions } from '../http.js';
import type { RequestRecord } from '../metrics.js';

export type Send = (status: number, body: unknown) => void;

function errorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 404) return 'not_found_error';
  if (status === 429) return 'rate_limit_error';
  if (status === 501) return 'not_supported_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

export function sendJson(
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

/** The code of the error answer `res` carried, if it was one. */
export function sentCode(res: ServerResponse): string | undefined {
  return sentCodes.get(res);
}

export function sendError(res: ServerResponse, err: unknown, headers: Record<string, string> = {}): void {
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

// The body reader is body.ts's (size cap, deadline, drain), shared with the control routes.
export { readBody } from '../body.js';

export function badRequest(message: string, key?: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_REQUEST', message, key ? { keys: [key] } : {});
}

/** What the HTTP server gives every route module (made once, in HttpApi's constructor). */
export interface RouteContext {
  readonly opts: HttpOptions;
  readonly engine: Engine;
  readonly bodies: BodyParser;
  /** `--alias` names (the first names the model in answers). */
  readonly aliases: readonly string[];
  /** llama-server's model name: the first alias, else the file ('' without a model). */
  modelName(): string;
  /** `x-hydra-config-epoch` of the configuration in force. */
  epochHeader(): Record<string, string>;
  /** `res`'s JSON answer with the epoch header. */
  send(res: ServerResponse, status: number, body: unknown): void;
  /** The request's body, within the size cap and deadline. */
  readBody(req: IncomingMessage): Promise<Buffer>;
  promptByteLimit(): number;
  messageLimit(): number;
  /** The request-log record of `res` (absent without an `onRequest` sink). */
  record(res: ServerResponse): RequestRecord | undefined;
  /** 405 for a known path asked with another method. */
  methodNotAllowed(req: IncomingMessage, res: ServerResponse): void;
  /** The HTTP server's own `/metrics` lines. */
  httpMetricsText(): string;
}

/** One route module's handler: true when it answered the request, false to let the next one try. */
export type RouteHandler = (
  req: IncomingMessage,
  res: ServerResponse,
  url: URL,
  path: string,
) => Promise<boolean>;

/** A route module: made once per server with the shared context (see routes/index.ts). */
export type RouteModule = (ctx: RouteContext) => RouteHandler;
