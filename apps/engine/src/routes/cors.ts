// CORS as llama-server's pre-routing handler does it (tools/server/server-http.cpp): every answer
// names the allowed origin, and an OPTIONS preflight is answered before the API key check
// (browsers send no Authorization header on a preflight).
import type { IncomingMessage, ServerResponse } from 'node:http';

/** llama-server's `--cors-origins`, `--cors-methods`, `--cors-headers`, `--cors-credentials`. */
export interface CorsOptions {
  /** `*` (default), `localhost` (reflect a localhost Origin only) or a literal origin list. */
  origins: string;
  methods: string;
  headers: string;
  credentials: boolean;
}

/** llama-server's defaults (common_params). */
export const CORS_DEFAULTS: CorsOptions = {
  origins: '*',
  methods: 'GET, POST, DELETE, OPTIONS',
  headers: '*',
  credentials: true,
};

function isLocalhost(origin: string): boolean {
  try {
    const host = new URL(origin).hostname;
    return host === 'localhost' || host === '127.0.0.1' || host === '[::1]' || host === '::1';
  } catch {
    return false;
  }
}

/**
 * Sets the CORS headers of `req`'s answer; answers an OPTIONS preflight itself (true: handled).
 * With `*` and credentials allowed the request's Origin is echoed (a literal `*` forbids credentials).
 */
export function applyCors(options: CorsOptions, req: IncomingMessage, res: ServerResponse): boolean {
  const origin = typeof req.headers.origin === 'string' ? req.headers.origin : '';
  if (options.credentials && options.origins === '*') res.setHeader('access-control-allow-origin', origin);
  else if (options.origins === 'localhost') {
    if (origin !== '' && isLocalhost(origin)) res.setHeader('access-control-allow-origin', origin);
  } else res.setHeader('access-control-allow-origin', options.origins);
  if (req.method !== 'OPTIONS') return false;
  req.resume();
  res.setHeader('access-control-allow-credentials', options.credentials ? 'true' : 'false');
  res.setHeader('access-control-allow-methods', options.methods);
  res.setHeader('access-control-allow-headers', options.headers);
  res.writeHead(200, { 'content-type': 'text/html', 'content-length': 0 });
  res.end();
  return true;
}
