import { spawn } from 'node:child_process';
import { request } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI, engineWith, runCli, tinyModel } from './helpers.js';

let model: string;
let eng: Awaited<ReturnType<typeof engineWith>>;

beforeAll(async () => {
  model = await tinyModel();
  eng = await engineWith([
    '-m',
    model,
    '-np',
    '1',
    '--max-queue',
    '0',
    '--max-body-bytes',
    '2048',
    '--body-timeout-ms',
    '300',
  ]);
}, 60_000);
afterAll(async () => {
  await eng?.close();
});

async function post(path: string, body: string, headers: Record<string, string> = {}) {
  const res = await fetch(`${eng.url}${path}`, {
    method: 'POST',
    body,
    headers: { 'content-type': 'application/json', ...headers },
  });
  return { status: res.status, body: (await res.json()) as { error?: { code: string; keys?: string[] } } };
}

describe('bad input', () => {
  it('400 for bad JSON, bad shapes and bad T1 values', async () => {
    expect((await post('/v1/completions', '{nope')).body.error!.code).toBe('HYDRA_ERR_BAD_JSON');
    expect((await post('/v1/completions', '[1]')).status).toBe(400);
    expect((await post('/v1/completions', '{"prompt": 5}')).body.error!.code).toBe('HYDRA_ERR_BAD_REQUEST');
    expect((await post('/v1/chat/completions', '{"messages": []}')).body.error!.code).toBe(
      'HYDRA_ERR_BAD_REQUEST',
    );
    const hot = await post('/v1/completions', '{"prompt": "x", "temperature": "hot"}');
    expect(hot.status).toBe(400);
    expect(hot.body.error).toMatchObject({ code: 'HYDRA_ERR_BAD_VALUE', keys: ['temperature'] });
    expect((await post('/v1/completions', '{"prompt": "x", "top_p": 7}')).body.error!.code).toBe(
      'HYDRA_ERR_BAD_VALUE',
    );
    expect((await post('/v1/completions', '{"prompt": "x", "stop": [1]}')).status).toBe(400);
  });

  it('413 for an oversized body, 404 and 405 for unknown routes and methods', async () => {
    const big = await post('/v1/completions', JSON.stringify({ prompt: 'x'.repeat(5000) }));
    expect(big.status).toBe(413);
    expect(big.body.error!.code).toBe('HYDRA_ERR_BODY_TOO_LARGE');
    expect((await fetch(`${eng.url}/nope`)).status).toBe(404);
    expect((await fetch(`${eng.url}/v1/completions`)).status).toBe(405);
  });

  it('408 for a body that stops arriving', async () => {
    const status = await new Promise<number>((resolve, reject) => {
      const req = request(
        `${eng.url}/v1/completions`,
        { method: 'POST', headers: { 'content-length': '100' } },
        (res) => {
          res.resume();
          resolve(res.statusCode!);
        },
      );
      req.on('error', reject);
      req.write('{"prompt": ');
    });
    expect(status).toBe(408);
  });

  it('429 with a code when every slot is busy and the queue is full; the prompt length is checked', async () => {
    const ac = new AbortController();
    const res = await fetch(`${eng.url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: 'long', max_tokens: 100000, ignore_eos: true, stream: true }),
      signal: ac.signal,
    });
    await res.body!.getReader().read();
    const second = await post('/v1/completions', '{"prompt": "x", "max_tokens": 2}');
    expect(second.status).toBe(429);
    expect(second.body.error!.code).toBe('HYDRA_ERR_QUEUE_FULL');
    ac.abort();
  });
});

describe('process', () => {
  it('boots with no model, answers /health within 5 s, and 503 HYDRA_ERR_NO_MODEL on completions', async () => {
    const t0 = performance.now();
    const p = spawn(process.execPath, [CLI, '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    try {
      const url = await new Promise<string>((resolve, reject) => {
        let buf = '';
        p.stderr.on('data', (d) => {
          buf += d;
          const m = /HTTP on (http:\/\/\S+)/.exec(buf);
          if (m) resolve(m[1]!);
        });
        p.on('exit', (code) => reject(new Error(`exited ${code}: ${buf}`)));
      });
      const health = (await (await fetch(`${url}/health`)).json()) as { state: string };
      // Loading nothing takes well under a second; the bound leaves room for a loaded CI machine.
      expect(performance.now() - t0).toBeLessThan(5000);
      expect(health.state).toBe('empty');
      for (const path of ['/v1/chat/completions', '/v1/completions']) {
        const res = await fetch(`${url}${path}`, {
          method: 'POST',
          body: JSON.stringify({ prompt: 'x', messages: [{ role: 'user', content: 'x' }] }),
        });
        expect(res.status).toBe(503);
        expect(((await res.json()) as { error: { code: string } }).error.code).toBe('HYDRA_ERR_NO_MODEL');
      }
      expect(((await (await fetch(`${url}/v1/models`)).json()) as { data: unknown[] }).data).toEqual([]);
    } finally {
      p.kill('SIGTERM');
    }
  });

  it('exits 2 with a clear message on bad flags and bad config', async () => {
    for (const args of [
      ['--bogus'],
      ['-c', 'many'],
      ['-fa', 'maybe'],
      ['--port'],
      ['--config', '/nonexistent.yaml'],
      ['--temp', '500'],
    ]) {
      const r = await runCli(args);
      expect(r.code, args.join(' ')).toBe(2);
      expect(r.out).toMatch(/HYDRA_ERR_(BAD_ARGUMENT|CONFIG_INVALID)/);
    }
  });

  it('serves HELLO and STATUS on the merged port', async () => {
    const { HydraClient } = await import('@hydra-engine/hydra-rpc');
    const e = await engineWith(['-m', model, '--rpc-port', String(20000 + (process.pid % 20000))]);
    try {
      const client = await HydraClient.connect({ port: e.rpcPort!, timeoutMs: 5000 });
      const hello = await client.hello({ client: 'test' });
      expect(hello.protocol).toBe(1);
      const status = await client.status();
      expect(status).toMatchObject({ state: 'ready', epoch: 1, slots: { total: 1, busy: 0 }, mode: 'solo' });
      expect(status.model!.n_layer).toBe(4);
      await client.close();
    } finally {
      await e.close();
    }
  });

  it('plan and synth-model subcommands', async () => {
    const plan = await runCli([
      'plan',
      '--model',
      model,
      '--device',
      'CUDA0=100',
      '--device',
      'RPC0=100',
      '--json',
    ]);
    expect(plan.code).toBe(0);
    const json = JSON.parse(plan.out) as { devices: { name: string }[] };
    expect(json.devices.map((d) => d.name)).toEqual(['CUDA0', 'RPC0']);
    expect((await runCli(['plan', '--model', model])).code).toBe(2);
    expect((await runCli(['synth-model', '--shape', 'huge', '--out', '/tmp/x.gguf'])).code).toBe(2);
  });
});
