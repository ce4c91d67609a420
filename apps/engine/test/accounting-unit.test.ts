// PeerAccounting's per-step window (combine/accounting.ts) and the controller's lifecycle listener,
// in process, without a model.
import type { RpcAccounting, RpcPeerAccounting } from '@hydra-engine/native-ggml';
import { ConfigLayers } from '@hydra-engine/tiering';
import { describe, expect, it } from 'vitest';
import { PeerAccounting } from '../src/combine/accounting.js';
import { Controller } from '../src/control/controller.js';
import { Engine } from '../src/engine.js';
import type { LifecycleEvent } from '../src/log.js';

const PEER = '127.0.0.1:9';

function peer(n: number): RpcPeerAccounting {
  const zero = {
    set_tensor: 0,
    set_tensor_hash: 0,
    get_tensor: 0,
    copy_tensor: 0,
    graph_compute: 0,
    graph_recompute: 0,
    memset_tensor: 0,
    buffer_clear: 0,
    init_tensor: 0,
    alloc_buffer: 0,
  };
  return {
    endpoint: PEER,
    commands: { ...zero, get_tensor: 2 * n, graph_recompute: n },
    commandBytes: zero,
    roundTrips: 2 * n,
    syncs: n,
    graphNodes: 0,
    waitReplyMs: 0.5 * n,
    waitReplyCalls: n,
    waitSendMs: 0.1 * n,
    waitSendCalls: n,
    serializeMs: 0.01 * n,
    enqueueMs: 0,
    tcp: {
      fd: 3,
      bytesSent: 100 * n,
      bytesAcked: 100 * n,
      bytesReceived: 4000 * n,
      segsOut: 0,
      segsIn: 0,
      dataSegsOut: 0,
      dataSegsIn: 0,
      rttUs: 30,
      rttVarUs: 5,
      minRttUs: 4,
      retransmits: 0,
    },
  };
}

describe('PeerAccounting', () => {
  it('averages per decode step over a window of one to two windowMs, whoever reads', () => {
    let t = 0;
    let steps = 0;
    const acc = new PeerAccounting({
      read: (): RpcAccounting => ({ peers: [peer(steps)], local: [] }),
      progress: () => ({ steps, tokens: steps, decodeSeconds: steps * 0.002 }),
      windowMs: 1000,
      now: () => t,
    });
    acc.snapshot();
    expect(acc.status(PEER)!.per_step).toBeNull(); // one sample: nothing to compare with
    expect(acc.status('127.0.0.1:10')).toBeNull();
    // Reads every 100 ms while 10 steps a read run: the window never shrinks below 1 s.
    for (let i = 0; i < 30; i++) {
      t += 100;
      steps += 10;
      acc.snapshot();
      const p = acc.status(PEER)!.per_step!;
      expect(p.window_ms).toBeLessThanOrEqual(2100);
      if (t >= 1100) expect(p.window_ms).toBeGreaterThanOrEqual(1000);
      expect(p.round_trips).toBe(2);
      expect(p.commands).toBe(3);
      expect(p.bytes_received).toBe(4000);
      expect(p.wait_ms).toBeCloseTo(0.6, 6);
      expect(p.step_ms).toBeCloseTo(2, 6);
    }
    // No step in the window: no per-step figures (not a division by zero).
    t += 5000;
    acc.snapshot();
    t += 5000;
    acc.snapshot();
    expect(acc.status(PEER)!.per_step).toBeNull();
    expect(acc.status(PEER)!.commands.get_tensor).toBe(2 * steps);
  });

  it('refuses options it cannot use', () => {
    const read = () => ({ peers: [], local: [] });
    const progress = () => ({ steps: 0, tokens: 0, decodeSeconds: 0 });
    const bad = expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' });
    expect(() => new PeerAccounting({ read: 1 as never, progress })).toThrow(bad);
    expect(() => new PeerAccounting({ read, progress: undefined as never })).toThrow(bad);
    expect(() => new PeerAccounting({ read, progress, windowMs: -1 })).toThrow(bad);
  });
});

describe('the controller tells its lifecycle listener', () => {
  it('of a failover with its cause, peers and action', async () => {
    const engine = new Engine({
      layers: new ConfigLayers({ rpc_servers: [PEER], failover_policy: 'none', peer_rejoin: false }),
      logger: { info: () => undefined, warn: () => undefined },
    });
    const seen: LifecycleEvent[] = [];
    const controller = new Controller({
      engine,
      drainTimeoutMs: 1000,
      log: () => undefined,
      lifecycle: (e) => seen.push(e),
    });
    try {
      await controller.configure({ 'sampling.temp': 0.5 });
      expect(seen).toEqual([
        expect.objectContaining({ event: 'reconfigure', cause: 'configure', keys: ['sampling.temp'] }),
      ]);
      await engine.failOver('test loss', [PEER]);
      expect(seen.at(-1)).toEqual({
        event: 'failover',
        cause: 'watchdog',
        reason: 'test loss',
        peers: [PEER],
        action: 'none',
        ended_requests: 0,
        rejoin: false,
      });
    } finally {
      controller.close();
    }
    expect(
      () => new Controller({ engine, drainTimeoutMs: 0, lifecycle: 'x' as never, log: () => undefined }),
    ).toThrow(expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' }));
  });
});
