import type { ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Proc, spawnEngine as spawnCombineEngine } from './combine-helpers.js';
import { tinyModel } from './helpers.js';

// Issue 18: STATUS (or HELLO, or GET /control/status) within about 2 s of a peer's death listed the
// devices, which asked the dead peer's RPC device for its memory on the JS thread: /health never
// answered again and SIGTERM was ignored. The head here polls /control/status the whole time.

async function spawnEngine(flags: string[], procs: ChildProcess[]): Promise<Proc> {
  const e = await spawnCombineEngine(flags);
  procs.push(e.child);
  return e;
}

/** One GET with its own deadline; resolves with the time it took, or Infinity when it did not answer. */
async function timed(url: string, deadlineMs: number): Promise<number> {
  const t0 = performance.now();
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(deadlineMs) });
    await r.arrayBuffer();
    return performance.now() - t0;
  } catch {
    return Number.POSITIVE_INFINITY;
  }
}

describe('a peer dies while the head is polled for STATUS', () => {
  let tiny: string;
  const procs: ChildProcess[] = [];
  beforeAll(async () => {
    tiny = await tinyModel();
  }, 60_000);
  afterAll(() => {
    for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  });

  it('/health keeps answering within 100 ms, STATUS keeps answering, and SIGTERM ends the head', async () => {
    const peer = await spawnEngine([], procs);
    const head = await spawnEngine(['-m', tiny, '--rpc', peer.rpc, '--device', 'RPC0', '-ngl', '99'], procs);
    const status = await fetch(`${head.url}/control/status`).then((r) => r.json());
    expect((status as { devices: { name: string }[] }).devices.map((d) => d.name)).toContain('RPC0');

    // STATUS polled back to back from before the kill until the end of the test.
    let polling = true;
    const statusTimes: number[] = [];
    const poller = (async () => {
      while (polling) {
        statusTimes.push(await timed(`${head.url}/control/status`, 5000));
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    await new Promise((r) => setTimeout(r, 300));
    const killedAt = performance.now();
    peer.child.kill('SIGKILL');
    const health: { at: number; ms: number }[] = [];
    // /health at 0.2 s and 1.0 s after the death (where every trial hung) and on through 3 s.
    for (const at of [200, 1000, 1500, 2000, 2500, 3000]) {
      const wait = killedAt + at - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      health.push({ at, ms: await timed(`${head.url}/health`, 5000) });
    }
    polling = false;
    await poller;
    console.log(
      `peer death: /health ${health.map((h) => `${h.at} ms: ${h.ms.toFixed(1)} ms`).join(', ')}; ` +
        `${statusTimes.length} STATUS polls, slowest ${Math.max(...statusTimes).toFixed(1)} ms`,
    );
    for (const h of health) expect(h.ms, `/health ${h.at} ms after the kill`).toBeLessThan(100);
    expect(Math.max(...statusTimes)).toBeLessThan(5000);

    const exited = new Promise<number | null>((resolve) => head.child.once('exit', (code) => resolve(code)));
    head.child.kill('SIGTERM');
    const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r('timeout'), 15_000))]);
    expect(code, head.log()).not.toBe('timeout');
  }, 120_000);
});
