import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type EngineProcess,
  health,
  metrics,
  sleep,
  spawnEngine,
  tinyModel,
  waitFor,
  waitSlotsFree,
} from './lib/engine.js';
import { recordFigures } from './lib/figures.js';
import { CMD, command, RpcConn } from './lib/ggml-rpc.js';
import { httpRequest } from './lib/http.js';
import { exchange, frame } from './lib/hydra-wire.js';

/**
 * Overload and allowlist against the real engine (-np 2, --max-queue 2, merged port with the
 * default ggml-RPC pool of 4 sessions + 64 queued, allowlist 127.0.0.1/32 only). Every client here
 * is 127.0.0.1, so the per-source ggml-RPC cap is lifted to pool + queue to exhaust both; the
 * per-source caps themselves are in port-containment.test.ts.
 */

const SLOTS = 2;
const QUEUE = 2;
const RPC_POOL = 4; // the defaults of --rpc-pool-size and --rpc-queue-size
const RPC_QUEUE = 64;
let eng: EngineProcess;
const fig: Record<string, unknown> = {};

beforeAll(async () => {
  eng = await spawnEngine(
    [
      '-m',
      await tinyModel(),
      '-np',
      String(SLOTS),
      '-t',
      '1',
      '-c',
      '1024',
      '--max-queue',
      String(QUEUE),
      '--control-allow-from',
      '127.0.0.1/32',
      '--rpc-max-per-source',
      String(RPC_POOL + RPC_QUEUE),
    ],
    { rpc: true },
  );
});

afterAll(async () => {
  await eng?.stop();
  recordFigures('overload-allowlist', fig);
});

interface StreamResult {
  status: number;
  code?: string;
  finish?: string;
  chunks: number;
}

async function stream(maxTokens: number): Promise<StreamResult> {
  const res = await fetch(`${eng.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      prompt: 'once upon a time',
      max_tokens: maxTokens,
      stream: true,
      ignore_eos: true,
    }),
  });
  if (res.status !== 200) {
    const body = (await res.json()) as { error: { code: string } };
    return { status: res.status, code: body.error.code, chunks: 0 };
  }
  const text = await res.text();
  const events = text
    .split('\n')
    .filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
    .map((l) => JSON.parse(l.slice(6)) as { choices?: { finish_reason?: string | null }[]; error?: unknown });
  const finish = events.map((e) => e.choices?.[0]?.finish_reason).find((f) => f);
  return { status: 200, ...(finish ? { finish } : {}), chunks: events.length };
}

describe('overload', () => {
  it('HTTP: 3x more streams than slots + queue; the excess gets 429 QUEUE_FULL, every admitted one completes', async () => {
    const n = 3 * (SLOTS + QUEUE);
    const rejectedBefore = (await metrics(eng.url)).get('hydra_requests_rejected_queue_full_total') ?? 0;
    // fill the slots and the queue with long streams first, so the excess meets a full engine
    const first = Array.from({ length: SLOTS + QUEUE }, () => stream(400));
    await waitFor(
      async () => {
        const h = await health(eng.url);
        return h.slots.busy === SLOTS && h.queue === QUEUE;
      },
      10_000,
      'slots and queue full',
    );
    const excess = Array.from({ length: n - SLOTS - QUEUE }, () => stream(400));
    const results = await Promise.all([...first, ...excess]);
    const admitted = results.filter((r) => r.status === 200);
    const refused = results.filter((r) => r.status !== 200);
    fig.http = {
      streams: n,
      admitted: admitted.length,
      refused: refused.length,
      refusedCodes: [...new Set(refused.map((r) => `${r.status} ${r.code}`))],
    };
    expect(admitted.length).toBeGreaterThanOrEqual(SLOTS);
    expect(admitted.length).toBeLessThanOrEqual(n);
    expect(refused.length).toBeGreaterThan(0);
    for (const r of refused) {
      expect([429, 503]).toContain(r.status);
      expect(r.code).toMatch(/^HYDRA_ERR_/);
    }
    for (const r of admitted) expect(r.finish).toBe('length');
    const rejectedAfter = (await metrics(eng.url)).get('hydra_requests_rejected_queue_full_total') ?? 0;
    expect(rejectedAfter - rejectedBefore).toBe(refused.filter((r) => r.status === 429).length);
    await waitSlotsFree(eng.url);
  });

  it('ggml-RPC: pool + queue + 8 connections; the excess is refused, active sessions keep working', async () => {
    const active: RpcConn[] = [];
    for (let i = 0; i < RPC_POOL; i++) {
      const c = await RpcConn.open(eng.rpcPort!);
      await c.hello();
      active.push(c);
    }
    const bufs = await Promise.all(active.map((c) => c.alloc(1024n)));
    const queued: RpcConn[] = [];
    for (let i = 0; i < RPC_QUEUE; i++) {
      const c = await RpcConn.open(eng.rpcPort!);
      c.write(command(CMD.HELLO, Buffer.alloc(24)));
      queued.push(c);
    }
    await sleep(300);
    const refusedBefore = (await metrics(eng.url)).get('hydra_rpc_sessions_refused_total') ?? 0;
    const excess: RpcConn[] = [];
    for (let i = 0; i < 8; i++) {
      const c = await RpcConn.open(eng.rpcPort!);
      c.write(command(CMD.HELLO, Buffer.alloc(24)));
      excess.push(c);
    }
    const excessClosed = await Promise.all(excess.map((c) => c.waitClosed(5_000)));
    // the queued ones wait: a host is held by each idle active session
    const queuedReplied = await queued[0]!.read(8, 500);
    for (const [i, c] of active.entries()) {
      const base = await c.base(bufs[i]!.ptr);
      expect(base).not.toBe(0n);
      expect(await c.deviceCount()).toBe(1);
    }
    const m = await metrics(eng.url);
    fig.rpc = {
      active: active.length,
      queued: queued.length,
      excess: excess.length,
      excessClosed: excessClosed.filter(Boolean).length,
      refusedDelta: (m.get('hydra_rpc_sessions_refused_total') ?? 0) - refusedBefore,
      activeGauge: m.get('hydra_rpc_sessions_active'),
      queuedGauge: m.get('hydra_rpc_sessions_queued'),
      queuedAnsweredWithin500ms: queuedReplied !== undefined,
    };
    expect(excessClosed.every(Boolean)).toBe(true);
    expect(m.get('hydra_rpc_sessions_refused_total')! - refusedBefore).toBe(excess.length);
    expect(m.get('hydra_rpc_sessions_active')).toBe(RPC_POOL);
    expect(m.get('hydra_rpc_sessions_queued')).toBe(RPC_QUEUE);
    expect(queuedReplied).toBeUndefined();
    // one active session leaves: the first queued one gets its host and its HELLO answer
    active.pop()!.destroy();
    expect((await queued[0]!.read(8, 5_000))?.readBigUInt64LE(0)).toBe(28n);
    for (const c of [...active, ...queued]) c.destroy();
    await sleep(500);
    expect((await fetch(`${eng.url}/health`)).status).toBe(200);
    expect(eng.exited()).toBeUndefined();
  });
});

describe('allowlist (--control-allow-from 127.0.0.1/32)', () => {
  const OUTSIDE = '127.0.0.2';

  it('both protocols on the merged port are refused from 127.0.0.2 and served from 127.0.0.1', async () => {
    const hydraOut = await exchange(eng.rpcPort!, frame(0x31, Buffer.alloc(0)), {
      expected: 0,
      localAddress: OUTSIDE,
      timeoutMs: 5_000,
    });
    expect(hydraOut.closed).toBe(true);
    expect(hydraOut.replies).toEqual([]);
    const rpcOut = await RpcConn.open(eng.rpcPort!, { localAddress: OUTSIDE });
    rpcOut.write(command(CMD.HELLO, Buffer.alloc(24)));
    expect(await rpcOut.read(8, 3_000)).toBeUndefined();
    expect(rpcOut.closed).toBe(true);
    const hydraIn = await exchange(eng.rpcPort!, frame(0x31, Buffer.alloc(0)), {
      expected: 1,
      endAfter: true,
    });
    expect(hydraIn.replies.length).toBe(1);
    const rpcIn = await RpcConn.open(eng.rpcPort!);
    expect((await rpcIn.hello()).major).toBe(6);
    rpcIn.destroy();
    fig.allowlist = { hydraFromOutside: 'closed, no reply', rpcFromOutside: 'closed, no reply' };
  });

  it('/control routes answer 403 HYDRA_ERR_FORBIDDEN to 127.0.0.2, and change nothing', async () => {
    const status = await httpRequest(eng.url, { path: '/control/status' });
    if (status.status === 404) {
      fig.controlRoutes = 'absent';
      return; // built before the control plane: nothing to refuse
    }
    expect(status.status).toBe(200);
    const epoch = (status.json as { epoch: number }).epoch;
    const routes: [string, string | undefined][] = [
      ['/control/status', undefined],
      ['/control/configure', JSON.stringify({ 'sampling.temp': 0.3 })],
      ['/control/set_expert_mode', JSON.stringify({ mode: 'solo' })],
      ['/control/load_model', JSON.stringify({ model: '/nonexistent.gguf' })],
    ];
    const seen: Record<string, number> = {};
    for (const [path, body] of routes) {
      const r = await httpRequest(eng.url, { path, localAddress: OUTSIDE, ...(body ? { body } : {}) });
      seen[path] = r.status;
      expect(r.status, path).toBe(403);
      expect(r.json?.error?.code).toBe('HYDRA_ERR_FORBIDDEN');
    }
    const after = await httpRequest(eng.url, { path: '/control/status' });
    expect((after.json as { epoch: number }).epoch).toBe(epoch);
    // the public API is not behind the control allowlist
    const v1 = await httpRequest(eng.url, { path: '/v1/models', localAddress: OUTSIDE });
    expect(v1.status).toBe(200);
    fig.controlRoutes = seen;
  });
});
