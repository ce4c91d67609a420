import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { engineGroup } from '@hydra-engine/test-kit';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli } from './helpers.js';

const engines = engineGroup();
afterAll(() => engines.stopAll());

describe('a failed start-up load', () => {
  const missing = join(tmpdir(), `hydra-missing-${process.pid}.gguf`);

  it('exits 1 after printing the cause (llama-server behaviour)', async () => {
    const t0 = performance.now();
    const r = await runCli(['--port', '0', '--progress', 'off', '-m', missing], 30_000);
    expect(r.code, r.out).toBe(1);
    expect(r.out).toContain(missing);
    expect(r.out).toMatch(/HYDRA_ERR_[A-Z_]+: .*hydra-missing/);
    expect(r.out).toContain('--keep-up-on-load-failure');
    expect(performance.now() - t0).toBeLessThan(30_000);
  });

  it('a corrupt file exits 1 with its code too', async () => {
    const bad = join(tmpdir(), `hydra-corrupt-${process.pid}.gguf`);
    writeFileSync(bad, Buffer.from('GGUF\x03\x00\x00\x00 not really a model'));
    const r = await runCli(['--port', '0', '--progress', 'off', '-m', bad], 30_000);
    expect(r.code, r.out).toBe(1);
    expect(r.out).toMatch(/HYDRA_ERR_[A-Z_]+: /);
  });

  it('with --keep-up-on-load-failure stays up; /health is 503 and every refused request carries the cause', async () => {
    const e = await engines.start(['--keep-up-on-load-failure', '-m', missing], {
      untilError: true,
      timeoutMs: 30_000,
    });
    const url = e.url;
    expect((await fetch(`${url}/health`)).status).toBe(503);
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'hi', max_tokens: 2 }),
    });
    expect(r.status).toBe(503);
    const body = (await r.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe('HYDRA_ERR_NO_MODEL');
    expect(body.error.message).toContain('the last load failed');
    expect(body.error.message).toContain(missing);
    expect(e.exited(), e.log()).toBeUndefined();
    await e.stop();
  });
});
