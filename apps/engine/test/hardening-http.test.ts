import { writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineWith, tinyModel, waitFor } from './helpers.js';

type Running = Awaited<ReturnType<typeof engineWith>>;

interface Answer {
  status: number;
  json: { error?: { code?: string }; [k: string]: unknown } | undefined;
  text: string;
}

/** One request on its own connection (no agent), from `localAddress` when given. */
function call(
  url: string,
  path: string,
  options: { method?: string; body?: unknown; headers?: Record<string, string>; localAddress?: string } = {},
): Promise<Answer> {
  const u = new URL(url);
  const body = options.body === undefined ? undefined : JSON.stringify(options.body);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        path,
        method: options.method ?? (body === undefined ? 'GET' : 'POST'),
        headers: { 'content-type': 'application/json', ...options.headers },
        agent: false,
        ...(options.localAddress ? { localAddress: options.localAddress } : {}),
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (d: Buffer) => chunks.push(d));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString();
          let json: Answer['json'];
          try {
            json = JSON.parse(text);
          } catch {}
          resolve({ status: res.statusCode ?? 0, json, text });
        });
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

function rawSocket(url: string, localAddress?: string): Promise<Socket> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const s = connect({ host: u.hostname, port: Number(u.port), ...(localAddress ? { localAddress } : {}) });
    s.on('error', () => undefined);
    s.once('connect', () => resolve(s));
    s.once('error', reject);
  });
}

/** What a socket receives until it closes (or `ms` pass). */
function received(s: Socket, ms: number): Promise<{ text: string; closed: boolean }> {
  return new Promise((resolve) => {
    let text = '';
    const timer = setTimeout(() => resolve({ text, closed: false }), ms);
    s.on('data', (d: Buffer) => {
      text += d.toString('latin1');
    });
    s.on('close', () => {
      clearTimeout(timer);
      resolve({ text, closed: true });
    });
  });
}

let model: string;
beforeAll(async () => {
  model = await tinyModel();
});

describe('--api-key guards every route but /health, as llama-server does', () => {
  let eng: Running;
  beforeAll(async () => {
    const file = join(tmpdir(), `hydra-keys-${process.pid}.txt`);
    writeFileSync(file, '# operators\nk3\n\nk4\r\n');
    eng = await engineWith(['-m', model, '-c', '512', '--api-key', 'k1,k2', '--api-key-file', file]);
  }, 60_000);
  afterAll(async () => {
    await eng?.close();
  });

  it('/health and /v1/health stay public', async () => {
    expect((await call(eng.url, '/health')).status).toBe(200);
    expect((await call(eng.url, '/v1/health')).status).toBe(200);
  });

  it('/metrics, /control/*, /v1/* and unknown paths answer 401 without a key', async () => {
    const before = eng.engine.epoch;
    for (const [path, body] of [
      ['/metrics', undefined],
      ['/control/status', undefined],
      ['/control/configure', { n_ctx: 256 }],
      ['/control/load_model', { model }],
      ['/v1/models', undefined],
      ['/v1/completions', { prompt: 'hi', max_tokens: 1 }],
      ['/nope', undefined],
    ] as const) {
      const r = await call(eng.url, path, { body });
      expect({ path, status: r.status, code: r.json?.error?.code }).toEqual({
        path,
        status: 401,
        code: 'HYDRA_ERR_UNAUTHORIZED',
      });
      const wrong = await call(eng.url, path, { body, headers: { authorization: 'Bearer k5' } });
      expect(wrong.status).toBe(401);
    }
    expect(eng.engine.epoch).toBe(before);
    expect(eng.engine.layers.get('n_ctx')).toBe(512);
  });

  it('any of the keys, from --api-key k1,k2 or --api-key-file, as Bearer, bare or X-Api-Key', async () => {
    const variants: Record<string, string>[] = [
      { authorization: 'Bearer k1' },
      { authorization: 'Bearer k2' },
      { authorization: 'k3' },
      { 'x-api-key': 'k4' },
    ];
    for (const headers of variants) {
      expect((await call(eng.url, '/metrics', { headers })).status).toBe(200);
      expect((await call(eng.url, '/control/status', { headers })).status).toBe(200);
    }
    // A comment line of the key file is not a key.
    expect(
      (await call(eng.url, '/metrics', { headers: { authorization: 'Bearer # operators' } })).status,
    ).toBe(401);
    const m = await call(eng.url, '/metrics', { headers: { authorization: 'Bearer k1' } });
    expect(Number(/hydra_http_unauthorized_total (\d+)/.exec(m.text)?.[1])).toBeGreaterThanOrEqual(14);
    const done = await call(eng.url, '/v1/completions', {
      body: { prompt: 'hi', max_tokens: 1 },
      headers: { authorization: 'Bearer k2' },
    });
    expect(done.status).toBe(200);
  });
});

describe('/metrics is served to --control-allow-from only', () => {
  it('a loopback client outside the list gets 403', async () => {
    const eng = await engineWith(['--control-allow-from', '10.0.0.0/8']);
    try {
      const r = await call(eng.url, '/metrics');
      expect([r.status, r.json?.error?.code]).toEqual([403, 'HYDRA_ERR_FORBIDDEN']);
      expect((await call(eng.url, '/health')).status).toBe(200);
    } finally {
      await eng.close();
    }
  });
});

describe('HTTP connection caps and idle timeouts', () => {
  it('refuses the connection past --http-max-connections with a 503 and a code; idle ones are closed', async () => {
    const eng = await engineWith(['--http-max-connections', '4', '--headers-timeout-ms', '400']);
    try {
      const idle = await Promise.all(Array.from({ length: 4 }, () => rawSocket(eng.url)));
      const closing = idle.map((s) => received(s, 5000));
      await waitFor(async () => eng.http.stats().connections === 4, 2000);
      const extra = await rawSocket(eng.url);
      const got = await received(extra, 2000);
      expect(got.text).toMatch(/^HTTP\/1\.1 503/);
      expect(got.text).toContain('HYDRA_ERR_TOO_MANY_CONNECTIONS');
      expect(eng.http.stats().refusedConnections).toBe(1);
      // Idle connections that never send a request are closed after the header timeout.
      const t0 = Date.now();
      const ends = await Promise.all(closing);
      expect(ends.every((e) => e.closed)).toBe(true);
      expect(Date.now() - t0).toBeLessThan(2000);
      expect((await call(eng.url, '/health')).status).toBe(200);
      const m = await call(eng.url, '/metrics');
      expect(m.text).toMatch(/hydra_http_connections_refused_total 1\b/);
    } finally {
      await eng.close();
    }
  });

  it('one source address cannot take the places of another (per-source cap)', async () => {
    const eng = await engineWith(['--http-max-connections-per-source', '3', '--headers-timeout-ms', '5000']);
    try {
      const mine = await Promise.all(Array.from({ length: 3 }, () => rawSocket(eng.url, '127.0.0.1')));
      await waitFor(async () => eng.http.stats().connections === 3, 2000);
      const fourth = await call(eng.url, '/health', { localAddress: '127.0.0.1' });
      expect([fourth.status, fourth.json?.error?.code]).toEqual([503, 'HYDRA_ERR_TOO_MANY_CONNECTIONS']);
      const other = await call(eng.url, '/health', { localAddress: '127.0.0.2' });
      expect(other.status).toBe(200);
      for (const s of mine) s.destroy();
      await waitFor(async () => eng.http.stats().connections === 0, 2000);
      expect((await call(eng.url, '/health', { localAddress: '127.0.0.1' })).status).toBe(200);
    } finally {
      await eng.close();
    }
  });

  it('an idle keep-alive connection closes after --keep-alive-timeout-ms', async () => {
    const eng = await engineWith(['--keep-alive-timeout-ms', '300']);
    try {
      const s = await rawSocket(eng.url);
      const end = received(s, 5000);
      const t0 = Date.now();
      s.write('GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n');
      const got = await end;
      expect(got.text).toMatch(/^HTTP\/1\.1 200/);
      expect(got.closed).toBe(true);
      expect(Date.now() - t0).toBeLessThan(2000);
    } finally {
      await eng.close();
    }
  });
});

describe('prompt and message caps answer before any tokenization', () => {
  let eng: Running;
  beforeAll(async () => {
    eng = await engineWith(['-m', model, '-c', '1024', '-np', '2', '--max-prompt-bytes', '1000']);
  }, 60_000);
  afterAll(async () => {
    await eng?.close();
  });

  it('a prompt over --max-prompt-bytes is 413 HYDRA_ERR_PROMPT_TOO_LARGE', async () => {
    const ok = await call(eng.url, '/v1/completions', { body: { prompt: 'é'.repeat(500), max_tokens: 1 } });
    expect(ok.status).toBe(400); // 1000 bytes pass the cap; the prompt is then too long for a slot
    expect(ok.json?.error?.code).toBe('HYDRA_ERR_PROMPT_TOO_LONG');
    const big = await call(eng.url, '/v1/completions', { body: { prompt: 'é'.repeat(501), max_tokens: 1 } });
    expect([big.status, big.json?.error?.code]).toEqual([413, 'HYDRA_ERR_PROMPT_TOO_LARGE']);
    const chat = await call(eng.url, '/v1/chat/completions', {
      body: {
        messages: [
          { role: 'user', content: 'x'.repeat(600) },
          { role: 'user', content: 'y'.repeat(400) },
        ],
      },
    });
    expect([chat.status, chat.json?.error?.code]).toEqual([413, 'HYDRA_ERR_PROMPT_TOO_LARGE']);
  });

  it('more messages than the default cap (a slot of 512 tokens: 256) is 400 HYDRA_ERR_TOO_MANY_MESSAGES', async () => {
    const messages = Array.from({ length: 257 }, () => ({ role: 'user', content: '' }));
    const r = await call(eng.url, '/v1/chat/completions', { body: { messages, max_tokens: 1 } });
    expect([r.status, r.json?.error?.code]).toEqual([400, 'HYDRA_ERR_TOO_MANY_MESSAGES']);
    const fine = await call(eng.url, '/v1/chat/completions', {
      body: { messages: messages.slice(0, 2), max_tokens: 1 },
    });
    expect(fine.status).toBe(200);
  });
});
