import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { engineGroup } from '@hydra-engine/test-kit';
import { afterAll, describe, expect, it } from 'vitest';
import { createLogger } from '../src/log.js';
import { tinyModel, waitFor } from './helpers.js';

const engines = engineGroup();
afterAll(() => engines.stopAll());

const model = await tinyModel();

// The log is read from stderr alone: every line of it must parse as JSON.
async function start(extra: string[]) {
  const e = await engines.start(['-t', '1', '-m', model, ...extra], { progress: 'lines' });
  const complete = (stream: boolean) =>
    fetch(`${e.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'hello', max_tokens: 5, ignore_eos: true, stream }),
    }).then((r) => r.text());
  return { url: e.url, complete, stop: () => e.stop(), log: () => e.stderr() };
}

describe('logging', () => {
  it('writes JSON lines when stderr is not a TTY: levels, timestamps, lifecycle events and one line per request', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'hydra-log-'));
    const file = join(dir, 'engine.log');
    const e = await start(['--log-file', file]);
    await e.complete(false);
    await e.complete(true);
    await fetch(`${e.url}/nope`);
    // The start's /health polls are request lines too; the three asked here are the others.
    const asked = () =>
      e
        .log()
        .split('\n')
        .filter((l) => /"event":"request"/.test(l) && !/"route":"\/health"/.test(l));
    await waitFor(async () => asked().length >= 3, 5000);
    await e.stop();
    const lines = e
      .log()
      .split('\n')
      .filter((l) => l !== '');
    const objs = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    for (const o of objs) {
      expect(typeof o.time).toBe('number');
      expect(typeof o.level).toBe('number');
      expect(typeof o.msg).toBe('string');
    }
    expect(objs.find((o) => o.event === 'listening')).toBeDefined();
    expect(objs.find((o) => o.event === 'load_progress')).toBeDefined();
    const load = objs.find((o) => o.event === 'load')!;
    expect(load.epoch).toBe(1);
    expect(load.model).toBe(model);
    const reqs = objs.filter((o) => o.event === 'request' && o.route !== '/health');
    expect(reqs).toHaveLength(3);
    for (const r of reqs.slice(0, 2)) {
      expect(r).toMatchObject({
        method: 'POST',
        route: '/v1/completions',
        status: 200,
        completion_tokens: 5,
        epoch: 1,
      });
      expect(r.prompt_tokens).toBeGreaterThan(0);
      expect(r.ttft_ms).toBeGreaterThan(0);
      expect(r.slot).toBe(0);
      expect(r.queue_ms).toBeGreaterThanOrEqual(0);
      expect(r.queue_ms as number).toBeLessThanOrEqual(r.ttft_ms as number);
      expect(r.duration_ms as number).toBeGreaterThanOrEqual(r.ttft_ms as number);
      expect(r.level).toBe(30);
    }
    expect(reqs[2]).toMatchObject({ route: '/nope', status: 404, code: 'HYDRA_ERR_NOT_FOUND' });
    expect(objs.find((o) => o.event === 'shutdown')).toMatchObject({ signal: 'SIGTERM', level: 30 });
    // The file holds the same JSON lines.
    const inFile = readFileSync(file, 'utf8').trim().split('\n');
    expect(inFile.length).toBe(lines.length);
    expect(JSON.parse(inFile[0]!).msg).toBe(objs[0]!.msg);
  }, 120_000);

  it('--log-format text: time, level and message', async () => {
    const e = await start(['--log-format', 'text']);
    await e.complete(false);
    await waitFor(async () => /POST \/v1\/completions 200/.test(e.log()), 5000);
    await e.stop();
    expect(e.log()).toMatch(
      /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO {2}hydra-engine: HTTP on http:\/\/\S+ /m,
    );
    expect(e.log()).toMatch(/INFO {2}POST \/v1\/completions 200 duration_ms=\S+ .*completion_tokens=5/);
  }, 120_000);

  it('refuses an unknown level or format by name', () => {
    expect(() => createLogger({ level: 'loud' as never })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT', keys: ['--log-level'] }),
    );
    expect(() => createLogger({ format: 'xml' as never })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT', keys: ['--log-format'] }),
    );
  });

  it('--log-level warn keeps warn lines and drops info ones', () => {
    const out: string[] = [];
    const log = createLogger({ level: 'warn', format: 'json', sink: { write: (t) => out.push(t) } });
    log.info('hidden');
    log.warn('shown', { event: 'x' });
    log.request({ method: 'GET', route: '/health', status: 200, durationMs: 1 });
    log.request({
      method: 'POST',
      route: '/v1/completions',
      status: 503,
      durationMs: 1,
      code: 'HYDRA_ERR_NO_MODEL',
    });
    expect(out.map((l) => JSON.parse(l).msg)).toEqual(['shown', 'POST /v1/completions 503']);
  });
});
