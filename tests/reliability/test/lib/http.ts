import { request } from 'node:http';
import { connect, type Socket } from 'node:net';

export interface RawResponse {
  status: number;
  body: string;
  json?: { error?: { code?: string; keys?: string[] }; [k: string]: unknown };
}

/** One HTTP request with node:http (so the source address and raw body are ours to pick). */
export function httpRequest(
  url: string,
  options: {
    method?: string;
    path: string;
    body?: string | Buffer;
    headers?: Record<string, string>;
    localAddress?: string;
    timeoutMs?: number;
  },
): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        path: options.path,
        method: options.method ?? (options.body === undefined ? 'GET' : 'POST'),
        headers: { 'content-type': 'application/json', ...options.headers },
        localAddress: options.localAddress,
        // one connection per request: a kept-alive socket would count as an engine fd
        agent: false,
        timeout: options.timeoutMs ?? 30_000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (d: Buffer) => chunks.push(d));
        res.on('end', () => {
          const body = Buffer.concat(chunks).toString();
          let json: RawResponse['json'];
          try {
            json = JSON.parse(body);
          } catch {}
          resolve({ status: res.statusCode!, body, ...(json ? { json } : {}) });
        });
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error('client timeout')));
    req.on('error', reject);
    req.end(options.body);
  });
}

/** A raw TCP connection to the HTTP port, for slowloris and abrupt disconnects. */
export function rawHttp(url: string): Promise<Socket> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const s = connect({ host: u.hostname, port: Number(u.port) });
    s.once('connect', () => resolve(s));
    s.once('error', reject);
    s.on('error', () => {});
  });
}

/** Reads a raw HTTP response head from `s` until the status line arrives or it closes. */
export function statusOf(s: Socket, timeoutMs: number): Promise<number | 'closed' | 'timeout'> {
  return new Promise((resolve) => {
    let text = '';
    const timer = setTimeout(() => resolve('timeout'), timeoutMs);
    s.on('data', (d: Buffer) => {
      text += d.toString('latin1');
      const m = /^HTTP\/1\.1 (\d{3})/.exec(text);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    s.on('close', () => {
      clearTimeout(timer);
      resolve('closed');
    });
  });
}
