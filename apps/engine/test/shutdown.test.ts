import { engineGroup, sleep } from '@hydra-engine/test-kit';
import { afterAll, describe, expect, it } from 'vitest';
import { tinyModel } from './helpers.js';

const engines = engineGroup();
afterAll(() => engines.stopAll());

const model = await tinyModel();

async function start(extra: string[]) {
  return engines.start(['-t', '1', '-m', model, '-np', '2', '-c', '65536', ...extra]);
}

/** A streamed completion: resolves with the whole SSE text once the server ends it. */
function stream(url: string, maxTokens: number): { text: Promise<string>; firstChunk: Promise<void> } {
  let first!: () => void;
  const firstChunk = new Promise<void>((r) => {
    first = r;
  });
  const text = (async () => {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'once upon', max_tokens: maxTokens, ignore_eos: true, stream: true }),
    });
    const reader = r.body!.getReader();
    let out = '';
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return out;
      out += Buffer.from(value).toString();
      first();
    }
  })();
  return { text, firstChunk };
}

describe('SIGTERM', () => {
  it('refuses new requests with 503 and Retry-After, lets a short stream finish, ends a long one with an error event and [DONE], exits 0', async () => {
    const e = await start(['--shutdown-timeout', '2']);
    const long = stream(e.url, 60_000);
    await long.firstChunk;
    const short = stream(e.url, 64);
    await short.firstChunk;
    const t0 = performance.now();
    e.child.kill('SIGTERM');
    await sleep(200);
    const refused = await fetch(`${e.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'late', max_tokens: 2 }),
    });
    expect(refused.status).toBe(503);
    expect(refused.headers.get('retry-after')).toBe('2');
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe(
      'HYDRA_ERR_SHUTTING_DOWN',
    );
    const shortText = await short.text;
    expect(shortText).toContain('"finish_reason":"length"');
    expect(shortText.trimEnd().endsWith('data: [DONE]')).toBe(true);
    const longText = await long.text;
    const endedAt = performance.now() - t0;
    expect(longText).toContain('"code":"HYDRA_ERR_SHUTTING_DOWN"');
    expect(longText).not.toContain('"finish_reason":"length"');
    expect(longText.trimEnd().endsWith('data: [DONE]')).toBe(true);
    // Ended at the timeout, not before it and not much after.
    expect(endedAt).toBeGreaterThan(1800);
    expect(endedAt).toBeLessThan(6000);
    const exit = await e.exit;
    expect(exit.code, e.log()).toBe(0);
    expect(e.log()).toMatch(/SIGTERM, shutting down \(running requests get up to 2 s\)/);
    expect(e.log()).toMatch(/shutdown timeout: ended 1 running request/);
  }, 120_000);

  it('a second signal exits at once', async () => {
    const e = await start(['--shutdown-timeout', '60']);
    const long = stream(e.url, 60_000);
    // The server cuts this one: its read fails, which is expected here.
    const cut = long.text.catch(() => '');
    await long.firstChunk;
    e.child.kill('SIGTERM');
    await sleep(300);
    const t0 = performance.now();
    e.child.kill('SIGTERM');
    const exit = await e.exit;
    expect(exit.code, `signal ${exit.signal}\n${e.log()}`).toBe(1);
    expect(exit.at - t0).toBeLessThan(2000);
    expect(e.log()).toMatch(/second SIGTERM, exiting now/);
    await cut;
  }, 120_000);
});
