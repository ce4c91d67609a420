import { afterEach, describe, expect, it, vi } from 'vitest';
import { RpcPool } from '../src/pool.js';
import { memoryLogger } from './helpers.js';

// The pool's admission and accounting, with a real piscina pool and a worker that holds its thread
// the way a native ggml-RPC session does. End-to-end ggml-RPC through the port is in native-port.test.ts.
const worker = { filename: new URL('./fixtures/hold-worker.mjs', import.meta.url) };
const pools: RpcPool[] = [];
afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.close(100)));
});

function harness(size: number, queueSize: number) {
  const logger = memoryLogger();
  const pool = new RpcPool({ worker, size, queueSize, logger });
  pools.push(pool);
  const gate = new SharedArrayBuffer(4 * 16);
  const started = new SharedArrayBuffer(4 * 16);
  const gates = new Int32Array(gate);
  const marks = new Int32Array(started);
  const aborted: number[] = [];
  const ended: number[] = [];
  const admit = (id: number) =>
    pool.admit({
      label: `session-${id}`,
      start: () => ({ id, gate, started }),
      abort: () => aborted.push(id),
      ended: () => ended.push(id),
    });
  const release = (id: number, how: 1 | 2 = 1) => {
    Atomics.store(gates, id, how);
    Atomics.notify(gates, id);
  };
  const isStarted = (id: number) => Atomics.load(marks, id) === 1;
  return { pool, logger, admit, release, isStarted, aborted, ended };
}

describe('RpcPool', () => {
  it('size 2, queue 1: the 4th session is refused, the first two keep running, the queued one starts when a slot frees', async () => {
    const h = harness(2, 1);
    expect([h.admit(0), h.admit(1), h.admit(2)]).toEqual([true, true, true]);
    await vi.waitFor(() => expect(h.isStarted(0) && h.isStarted(1)).toBe(true), { timeout: 5000 });
    expect(h.isStarted(2)).toBe(false);
    expect(h.pool.stats()).toMatchObject({ active: 2, queued: 1, refused: 0 });

    expect(h.admit(3)).toBe(false);
    expect(h.pool.stats()).toMatchObject({ active: 2, queued: 1, refused: 1 });
    expect(h.logger.lines.filter((l) => l.level === 'warn' && l.message.includes('session-3'))).toHaveLength(
      1,
    );

    h.release(0);
    await vi.waitFor(() => expect(h.isStarted(2)).toBe(true), { timeout: 5000 });
    expect(h.isStarted(3)).toBe(false);
    expect(h.pool.stats()).toMatchObject({ active: 2, queued: 0, served: 1 });
    expect(h.ended).toEqual([0]);

    h.release(1);
    h.release(2);
    await vi.waitFor(() => expect(h.pool.stats().served).toBe(3), { timeout: 5000 });
    expect(h.pool.stats()).toEqual({
      active: 0,
      queued: 0,
      refused: 1,
      served: 3,
      failed: 0,
      bytesIn: 100 + 101 + 102,
      bytesOut: 30,
      commands: 9,
      setTensorBytes: 3000,
    });
    expect(h.admit(4)).toBe(true);
    h.release(4);
    await vi.waitFor(() => expect(h.pool.stats().served).toBe(4), { timeout: 5000 });
  });

  it('counts a failed session and keeps serving', async () => {
    const h = harness(1, 0);
    h.admit(0);
    h.release(0, 2);
    await vi.waitFor(() => expect(h.pool.stats()).toMatchObject({ failed: 1, active: 0 }), { timeout: 5000 });
    expect(h.logger.lines.some((l) => l.level === 'error' && l.message.includes('session-0'))).toBe(true);
    h.admit(1);
    h.release(1);
    await vi.waitFor(() => expect(h.pool.stats().served).toBe(1), { timeout: 5000 });
  });

  it('close aborts queued jobs, waits for running ones, and cuts them at the timeout', async () => {
    const h = harness(1, 2);
    h.admit(0);
    h.admit(1);
    await vi.waitFor(() => expect(h.isStarted(0)).toBe(true), { timeout: 5000 });
    const started = Date.now();
    let cut = false;
    await h.pool.close(300, () => {
      cut = true;
      h.release(0);
    });
    expect(cut).toBe(true);
    expect(Date.now() - started).toBeLessThan(2500);
    expect(h.aborted).toEqual([1]);
    expect(h.isStarted(1)).toBe(false);
    expect(h.pool.stats()).toMatchObject({ served: 1, active: 0, queued: 0 });
    expect(h.admit(2)).toBe(false);
  });

  it('close resolves soon after the running sessions end', async () => {
    const h = harness(2, 0);
    h.admit(0);
    await vi.waitFor(() => expect(h.isStarted(0)).toBe(true), { timeout: 5000 });
    const closing = h.pool.close(10_000);
    setTimeout(() => h.release(0), 100);
    const started = Date.now();
    await closing;
    expect(Date.now() - started).toBeLessThan(1100);
    expect(h.pool.stats().served).toBe(1);
  });
});
