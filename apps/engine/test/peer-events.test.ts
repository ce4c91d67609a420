import { ConfigLayers } from '@hydra-engine/tiering';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Controller } from '../src/control/controller.js';
import { Engine, type PeerEvents, type PeerLossEvent } from '../src/engine.js';
import { engineWith as engineWith2, tinyModel } from './helpers.js';

// Peer loss is an event the runtime emits and the controller answers (issue 20, "one owner, one
// direction"): the runtime never writes the configuration layers itself, and the controller's
// deferral policy sees the failover's changes without being built again.
const PEER = '127.0.0.1:9';
const quiet = { info: () => undefined, warn: () => undefined };
const code = async (p: Promise<unknown>) =>
  p.then(
    () => 'resolved',
    (e: { code?: string }) => e.code,
  );

function engineWith(startup: Record<string, unknown>): Engine {
  return new Engine({ layers: new ConfigLayers(startup), logger: quiet });
}

describe('the runtime emits peer loss and builds what the answer says', () => {
  it('reports the peers, the reason, the cause and what it does at once; writes no layer itself', async () => {
    const engine = engineWith({ rpc_servers: [PEER], failover_policy: 'solo' });
    const seen: PeerLossEvent[] = [];
    const events: PeerEvents = {
      lost: (e) => {
        seen.push(e);
        return { build: 'none', decision: undefined, rejoin: false };
      },
      rejoined: () => undefined,
      rejoinFailed: () => undefined,
    };
    engine.setPeerEvents(events);
    expect(() => engine.setPeerEvents(events)).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' }),
    );
    await engine.failOver('test loss', [PEER]);
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({
      peers: [PEER],
      reason: 'test loss',
      cause: 'watchdog',
      atOnce: { endRequests: 0, freeStandby: false },
      facts: undefined,
    });
    expect(seen[0]!.atOnce.abandon.length).toBeGreaterThan(0);
    // The listener kept the peer in the layers: the runtime did not drop it behind its back.
    expect(engine.layers.get('rpc_servers')).toEqual([PEER]);
    // Answered "none": nothing rebuilt, requests refused saying why.
    expect(engine.state).toBe('error');
    expect(engine.lastError).toMatch(/failover_policy is none/);
    expect(engine.degraded).toMatchObject({ peers: [PEER], reason: 'test loss', rejoin: { enabled: false } });
  });

  it('still acts at once when the listener throws (nothing is rebuilt)', async () => {
    const engine = engineWith({ rpc_servers: [PEER] });
    engine.setPeerEvents({
      lost: () => {
        throw new Error('listener broke');
      },
      rejoined: () => undefined,
      rejoinFailed: () => undefined,
    });
    await engine.failOver('test loss', [PEER]);
    expect(engine.state).toBe('error');
    expect(engine.degraded?.peers).toEqual([PEER]);
  });
});

describe('the controller answers a peer loss', () => {
  it('drops the peers from its layers and its policy (the same policy: its epoch goes on) and answers per failover_policy', async () => {
    const engine = engineWith({ rpc_servers: [PEER], failover_policy: 'none', peer_rejoin: false });
    const controller = new Controller({ engine, drainTimeoutMs: 1000, log: () => undefined });
    try {
      // A T1 change first, so a policy built again (epoch 0) would show.
      await controller.configure({ 'sampling.temp': 0.5 });
      const epoch = controller.policyEpoch;
      expect(epoch).toBeGreaterThan(0);
      await engine.failOver('test loss', [PEER]);
      expect(engine.layers.get('rpc_servers')).toEqual([]);
      expect(engine.layers.sourceOf('rpc_servers')).toBe('configure');
      // The earlier change is still in force and the failover was one more applied change set.
      expect(engine.layers.get('sampling.temp')).toBe(0.5);
      expect(controller.policyEpoch).toBe(epoch + 1);
      // The policy plans against the failover's state: dropping the peers again changes nothing,
      // naming the peer again is a change from [].
      expect((await controller.plan({ rpc_servers: [] })).changes).toEqual([]);
      expect((await controller.plan({ rpc_servers: [PEER] })).changes).toEqual([
        { key: 'rpc_servers', from: [], to: [PEER], tier: 'T3' },
      ]);
      expect(controller.deferredKeys).toEqual([]);
      // failover_policy none: nothing reloaded; peer_rejoin false: no probes.
      expect(engine.state).toBe('error');
      expect(engine.degraded?.rejoin).toEqual({ enabled: false, probes: 0 });
    } finally {
      controller.close();
    }
  });

  it('solo without a model loaded: the peers are dropped, then the reload says there is no model', async () => {
    const engine = engineWith({ rpc_servers: [PEER], failover_policy: 'solo', peer_rejoin: false });
    const controller = new Controller({ engine, drainTimeoutMs: 1000, log: () => undefined });
    try {
      expect(await code(engine.failOver('test loss', [PEER]))).toBe('HYDRA_ERR_NO_MODEL');
      expect(engine.layers.get('rpc_servers')).toEqual([]);
      expect(controller.policyEpoch).toBe(1);
      expect(engine.holders).toEqual([]);
    } finally {
      controller.close();
    }
  });
});

describe('a peer loss while a change waits for the slots', () => {
  let eng: Awaited<ReturnType<typeof engineWith2>>;
  beforeAll(async () => {
    eng = await engineWith2([
      '-m',
      await tinyModel(),
      '-c',
      '4096',
      '--failover-policy',
      'solo',
      '--no-peer-rejoin',
    ]);
  }, 60_000);
  afterAll(async () => {
    await eng?.close();
  });

  it('drops the waiting change before the requests end (no second rebuild beside the failover load)', async () => {
    const { engine, controller } = eng;
    let first: () => void = () => undefined;
    const started = new Promise<void>((r) => {
      first = r;
    });
    const running = engine
      .submit(
        engine.tokenize('the long day'),
        { maxTokens: 4000, stop: [], sampler: { temp: 0 }, ignoreEos: true },
        {
          onToken: () => {
            first();
            // Slow enough (at most 500 tokens/s) that the request still runs while the test acts.
            const until = performance.now() + 2;
            while (performance.now() < until);
          },
        },
      )
      .then(
        () => 'finished',
        (e: { code?: string }) => e.code,
      );
    await started;
    const reply = await controller.configure({ n_ctx: 2048 });
    expect(reply.deferred_keys).toEqual(['n_ctx']);
    const epoch = controller.policyEpoch;
    await engine.failOver('test loss', [PEER]);
    expect(await running).toBe('HYDRA_ERR_PEER_LOST');
    expect(controller.deferredKeys).toEqual([]);
    expect(engine.layers.get('n_ctx')).toBe(4096);
    expect(engine.layers.get('rpc_servers')).toEqual([]);
    expect(controller.policyEpoch).toBe(epoch);
    expect(controller.lastRebuildFailure).toBeUndefined();
    expect(engine.state).toBe('ready');
    expect(engine.degraded).toMatchObject({ peers: [PEER], failover: { policy: 'solo' } });
    expect(engine.holders).toEqual([]);
    const again = await engine.submit(engine.tokenize('the long day'), {
      maxTokens: 4,
      stop: [],
      sampler: { temp: 0 },
      ignoreEos: true,
    });
    expect(again.completionTokens).toBe(4);
    expect(engine.slots.nCtxSeq).toBe(4096);
  }, 60_000);
});
