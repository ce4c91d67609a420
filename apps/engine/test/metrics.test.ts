import { spawnSync } from 'node:child_process';
import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freeLoopbackPort } from '../src/ports.js';
import { engineWith, tinyModel, waitFor } from './helpers.js';

// Debian's `prometheus` package (scripts/test.sh installs it). Its absence fails the test.
function promtool(text: string): { status: number | null; out: string } {
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  if (r.error) throw new Error(`promtool is not installed (apt-get install prometheus): ${r.error.message}`);
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

function value(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  if (line === undefined) throw new Error(`no ${series} in /metrics`);
  return Number(line.slice(series.length + 1));
}

// ggml-RPC protocol 6 HELLO: cmd 0x0E, size u64 = 24, 24 request bytes; the reply is 8 + 28 bytes.
function rpcHello(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(port, '127.0.0.1');
    const req = Buffer.alloc(1 + 8 + 24);
    req[0] = 0x0e;
    req.writeBigUInt64LE(24n, 1);
    let got = 0;
    s.on('data', (d) => {
      got += d.length;
      if (got >= 36) resolve(s);
    });
    s.once('error', reject);
    s.once('connect', () => s.write(req));
    setTimeout(() => reject(new Error(`no HELLO reply (got ${got} bytes)`)), 10_000).unref();
  });
}

describe('/metrics', () => {
  let eng: Awaited<ReturnType<typeof engineWith>>;
  let rpcPort: number;
  beforeAll(async () => {
    rpcPort = await freeLoopbackPort();
    eng = await engineWith(['-m', await tinyModel(), '-np', '2', '-c', '512', '--rpc-port', String(rpcPort)]);
  });
  afterAll(async () => eng?.close());

  const complete = (body: Record<string, unknown>) =>
    fetch(`${eng.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'hello there, general', max_tokens: 8, temperature: 0, ...body }),
    }).then(async (r) => ({ status: r.status, text: await r.text() }));

  it('passes promtool check metrics, with latency histograms and prompt-cache hits', async () => {
    expect((await complete({})).status).toBe(200);
    expect((await complete({ stream: true })).status).toBe(200);
    // The same prompt twice on one slot with cache_prompt: the second reuses the slot's KV.
    expect((await complete({ cache_prompt: true, slot_id: 1 })).status).toBe(200);
    expect((await complete({ cache_prompt: true, slot_id: 1 })).status).toBe(200);
    expect((await complete({ max_tokens: 'x' })).status).toBe(400);
    const text = await (await fetch(`${eng.url}/metrics`)).text();
    const check = promtool(text);
    expect(check.out).toBe('');
    expect(check.status).toBe(0);
    // A gauge named *_total is the lint problem the old name had.
    expect(text).not.toMatch(/^hydra_slots_total /m);
    expect(value(text, 'hydra_slots')).toBe(2);
    expect(value(text, 'hydra_slot_context_tokens')).toBe(256);
    // Slot 1 keeps the cached prompt and its tokens; no slot holds more than its share.
    const cells = [0, 1].map((i) => value(text, `hydra_slot_kv_cells{slot="${i}"}`));
    expect(cells[1]).toBeGreaterThan(5);
    for (const c of cells) expect(c).toBeLessThanOrEqual(256);
    expect(value(text, 'hydra_time_to_first_token_seconds_count')).toBe(4);
    expect(value(text, 'hydra_time_per_output_token_seconds_count')).toBe(4);
    expect(value(text, 'hydra_request_duration_seconds_count{route="/v1/completions"}')).toBe(4);
    expect(value(text, 'hydra_time_to_first_token_seconds_sum')).toBeGreaterThan(0);
    expect(value(text, 'hydra_queue_wait_seconds_count')).toBe(4);
    expect(value(text, 'hydra_prompt_cache_hit_tokens_total')).toBeGreaterThan(0);
    expect(value(text, 'hydra_http_requests_total{route="/v1/completions",status="200"}')).toBe(4);
    expect(value(text, 'hydra_http_requests_total{route="/v1/completions",status="400"}')).toBe(1);
  });

  it('counts merged-port bytes while a ggml-RPC session is still open', async () => {
    const before = await (await fetch(`${eng.url}/metrics`)).text();
    expect(value(before, 'hydra_rpc_bytes_in_total')).toBe(0);
    const s = await rpcHello(rpcPort);
    try {
      let text = '';
      await waitFor(async () => {
        text = await (await fetch(`${eng.url}/metrics`)).text();
        return value(text, 'hydra_rpc_bytes_in_total') > 0;
      }, 10_000);
      // Still running: the figure is the live one, not a total added when the session ended.
      expect(value(text, 'hydra_rpc_sessions_active')).toBe(1);
      expect(value(text, 'hydra_rpc_sessions_served_total')).toBe(0);
      expect(value(text, 'hydra_rpc_bytes_in_total')).toBeGreaterThanOrEqual(33);
      expect(value(text, 'hydra_rpc_bytes_out_total')).toBeGreaterThanOrEqual(36);
      expect(promtool(text).status).toBe(0);
    } finally {
      s.destroy();
    }
  });
});
