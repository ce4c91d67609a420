// `/health` (public: readiness probes send no key) and `/metrics` (Prometheus text, behind
// `--control-allow-from` when it is set).
import type { ServerResponse } from 'node:http';
import { Allowlist } from '@hydra-engine/hydra-rpc';
import { HydraError } from '../errors.js';
import { type RouteContext, type RouteModule, sendError } from './plumbing.js';

/** Paths answered without an API key. */
export const PUBLIC_PATHS: ReadonlySet<string> = new Set(['/health', '/v1/health']);

function health(ctx: RouteContext, res: ServerResponse): void {
  const { engine } = ctx;
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
  ctx.send(res, unavailable ? 503 : 200, body);
}

export const healthRoutes: RouteModule = (ctx) => {
  const allow = ctx.opts.metricsAllowFrom ? new Allowlist(ctx.opts.metricsAllowFrom) : undefined;
  return async (req, res, _url, path) => {
    if (PUBLIC_PATHS.has(path) && req.method === 'GET') {
      health(ctx, res);
      return true;
    }
    if (path !== '/metrics' || req.method !== 'GET') return false;
    if (allow && !allow.allows(req.socket.remoteAddress)) {
      req.resume();
      sendError(
        res,
        new HydraError('HYDRA_ERR_FORBIDDEN', `${req.socket.remoteAddress} is not in --control-allow-from`),
      );
      return true;
    }
    const text = (await ctx.opts.metrics()) + ctx.httpMetricsText();
    res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4', ...ctx.epochHeader() });
    res.end(text);
    return true;
  };
};
