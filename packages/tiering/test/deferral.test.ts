import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  DEFAULT_DRAIN_TIMEOUT_MS,
  type Decision,
  DeferralPolicy,
  defaults,
  type HydraError,
  normalize,
  type Params,
  parseDrainTimeout,
  plan,
} from '../src/index.js';
import { validDelta } from './arbitraries.js';
import { code } from './codes.js';

describe('parseDrainTimeout', () => {
  it('reads bare numbers as seconds and honours unit suffixes', () => {
    expect(parseDrainTimeout(undefined)).toBe(DEFAULT_DRAIN_TIMEOUT_MS);
    expect(parseDrainTimeout('  ')).toBe(DEFAULT_DRAIN_TIMEOUT_MS);
    expect(parseDrainTimeout('30')).toBe(30_000);
    expect(parseDrainTimeout('30s')).toBe(30_000);
    expect(parseDrainTimeout('1.5')).toBe(1_500);
    expect(parseDrainTimeout('1500ms')).toBe(1_500);
    expect(parseDrainTimeout(' 2m ')).toBe(120_000);
    expect(parseDrainTimeout('0')).toBe(0);
  });

  it('rejects anything else with HYDRA_ERR_BAD_VALUE naming the variable', () => {
    for (const raw of ['-1', 'abc', '10h', '1e3', '25h', 'Infinity', '90000s']) {
      expect(code(() => parseDrainTimeout(raw))).toBe('HYDRA_ERR_BAD_VALUE');
    }
    try {
      parseDrainTimeout('x');
    } catch (error) {
      expect((error as HydraError).keys).toEqual(['HYDRA_COORD_PROFILE_SWITCH_DRAIN_TIMEOUT']);
    }
  });
});

describe('DeferralPolicy', () => {
  it('validates its options', () => {
    expect(code(() => new DeferralPolicy({ drainTimeoutMs: -1 }))).toBe('HYDRA_ERR_BAD_OPTION');
    expect(code(() => new DeferralPolicy({ drainTimeoutMs: Number.NaN }))).toBe('HYDRA_ERR_BAD_OPTION');
    expect(code(() => new DeferralPolicy({ drainTimeoutMs: 1, epoch: 1.5 }))).toBe('HYDRA_ERR_BAD_OPTION');
  });

  it('rejects events out of contract', () => {
    const p = new DeferralPolicy({ drainTimeoutMs: 10 });
    expect(code(() => p.slotFree(0))).toBe('HYDRA_ERR_BAD_EVENT');
    p.tick(5);
    expect(code(() => p.tick(4))).toBe('HYDRA_ERR_BAD_EVENT');
    expect(code(() => p.setBusySlots(-1, 6))).toBe('HYDRA_ERR_BAD_EVENT');
    const forged = {
      changes: [{ key: 'port', from: 1, to: 2, tier: 'T1' as const, via: 'engine' as const }],
    };
    expect(code(() => p.submit(forged, 6))).toBe('HYDRA_ERR_BAD_EVENT');
    const wrongTier = {
      changes: [{ key: 'n_ctx', from: 0, to: 2, tier: 'T1' as const, via: 'context' as const }],
    };
    expect(code(() => p.submit(wrongTier, 6))).toBe('HYDRA_ERR_BAD_EVENT');
  });

  it('applies everything at once when idle and bumps the epoch once per event', () => {
    const p = new DeferralPolicy({ drainTimeoutMs: 1000, epoch: 6 });
    const { plan: r, decision } = p.configure({ sampling: { temp: 0.5 }, n_ctx: 8192 }, 0);
    expect(r.tier).toBe('T2');
    expect(decision).toMatchObject({ rebuild: 'context', endRunning: false, deferredKeys: [], epoch: 7 });
    expect(decision.apply.map((c) => c.key)).toEqual(['sampling.temp', 'n_ctx']);
    expect(p.applied.n_ctx).toBe(8192);
    expect(p.configure({ n_ctx: 8192 }, 1).decision).toMatchObject({ apply: [], epoch: 7 });
  });

  it('applies T1 at once and defers T2/T3 while a slot is busy, until it frees', () => {
    const p = new DeferralPolicy({ drainTimeoutMs: 1000 });
    p.slotBusy(0);
    const d = p.configure({ seed: 42, n_ctx: 8192, model: '/m.gguf' }, 10).decision;
    expect(d.apply.map((c) => c.key)).toEqual(['seed']);
    expect(d.rebuild).toBe('sampler');
    expect(d.deferredKeys).toEqual(['n_ctx', 'model']);
    expect(d.epoch).toBe(1);
    expect(p.deadlineMs).toBe(1010);
    expect(p.applied.n_ctx).toBe(0);
    expect(p.target.n_ctx).toBe(8192);
    expect(p.tick(500).apply).toEqual([]);
    const freed = p.slotFree(600);
    expect(freed.apply.map((c) => [c.key, c.from, c.to])).toEqual([
      ['n_ctx', 0, 8192],
      ['model', '', '/m.gguf'],
    ]);
    expect(freed).toMatchObject({ rebuild: 'model', deferredKeys: [], epoch: 2, endRunning: false });
    expect(p.deadlineMs).toBeNull();
  });

  it('merges a second delta into the pending one without extending the deadline', () => {
    const p = new DeferralPolicy({ drainTimeoutMs: 100 });
    p.setBusySlots(2, 0);
    p.configure({ n_ctx: 8192, cache_type_k: 'q8_0' }, 0);
    const second = p.configure({ n_ctx: 16384, cache_type_k: 'f16', n_batch: 1024 }, 50).decision;
    // cache_type_k went back to its applied value: nothing left to do for it.
    expect(second.deferredKeys).toEqual(['n_ctx', 'n_batch']);
    expect(p.pending.map((c) => [c.key, c.from, c.to])).toEqual([
      ['n_ctx', 0, 16384],
      ['n_batch', 2048, 1024],
    ]);
    expect(p.deadlineMs).toBe(100);
  });

  it('asks to end running requests once when the drain timeout expires, then applies when slots free', () => {
    const p = new DeferralPolicy({ drainTimeoutMs: 100 });
    p.setBusySlots(2, 0);
    p.configure({ n_gpu_layers: 99 }, 10);
    expect(p.tick(109).endRunning).toBe(false);
    expect(p.draining).toBe(false);
    const expired = p.tick(110);
    expect(expired).toMatchObject({ endRunning: true, apply: [], deferredKeys: ['n_gpu_layers'] });
    expect(p.draining).toBe(true);
    expect(p.tick(120).endRunning).toBe(false);
    expect(p.slotFree(121).apply).toEqual([]);
    const last = p.slotFree(122);
    expect(last.apply.map((c) => c.key)).toEqual(['n_gpu_layers']);
    expect(last.rebuild).toBe('model');
    expect(p.draining).toBe(false);
  });

  it('with a zero timeout asks to end running requests on the deferring event itself', () => {
    const p = new DeferralPolicy({ drainTimeoutMs: 0 });
    p.slotBusy(0);
    expect(p.configure({ n_ctx: 4096 }, 1).decision).toMatchObject({ endRunning: true, apply: [] });
  });

  it('changes nothing when a delta is rejected', () => {
    const p = new DeferralPolicy({ drainTimeoutMs: 100 });
    p.slotBusy(0);
    p.configure({ n_ctx: 4096 }, 0);
    const before = [p.applied, p.pending, p.epoch, p.deadlineMs];
    expect(code(() => p.configure({ n_ctx: 8192, port: 1 }, 1))).toBe('HYDRA_ERR_T4_FIELD');
    expect([p.applied, p.pending, p.epoch, p.deadlineMs]).toEqual(before);
  });

  type Event =
    | { kind: 'submit'; delta: Params; dt: number }
    | { kind: 'busy'; dt: number }
    | { kind: 'free'; dt: number }
    | { kind: 'set'; n: number; dt: number }
    | { kind: 'tick'; dt: number };
  const dt = fc.integer({ min: 0, max: 60 });
  const event: fc.Arbitrary<Event> = fc.oneof(
    fc.record({ kind: fc.constant('submit' as const), delta: validDelta(6), dt }),
    fc.record({ kind: fc.constant('busy' as const), dt }),
    fc.record({ kind: fc.constant('free' as const), dt }),
    fc.record({ kind: fc.constant('set' as const), n: fc.integer({ min: 0, max: 3 }), dt }),
    fc.record({ kind: fc.constant('tick' as const), dt }),
  );

  it('never loses a delta and never applies T2/T3 while a slot is busy', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 200 }), fc.array(event, { maxLength: 40 }), (timeout, events) => {
        const p = new DeferralPolicy({ drainTimeoutMs: timeout });
        // The reference: every accepted delta folded over the defaults, last value per key wins.
        const expected = defaults();
        let now = 0;
        let epoch = 0;
        const check = (d: Decision) => {
          if (d.apply.some((c) => c.tier !== 'T1')) expect(p.busySlots).toBe(0);
          if (d.endRunning) {
            expect(p.busySlots).toBeGreaterThan(0);
            expect(now).toBeGreaterThanOrEqual(p.deadlineMs!);
          }
          epoch += d.apply.length > 0 ? 1 : 0;
          expect(d.epoch).toBe(epoch);
          expect(p.target).toEqual(expected);
          if (p.busySlots === 0) expect(p.pending).toEqual([]);
          for (const c of p.pending) expect(c.tier).not.toBe('T1');
        };
        for (const e of events) {
          now += e.dt;
          if (e.kind === 'submit') {
            Object.assign(expected, normalize(e.delta));
            check(p.submit(plan(p.target, e.delta), now));
          } else if (e.kind === 'busy') check(p.slotBusy(now));
          else if (e.kind === 'free') {
            if (p.busySlots > 0) check(p.slotFree(now));
          } else if (e.kind === 'set') check(p.setBusySlots(e.n, now));
          else check(p.tick(now));
        }
        check(p.setBusySlots(0, now + 1));
        expect(p.applied).toEqual(expected);
        expect(p.deferredKeys).toEqual([]);
      }),
      { numRuns: 200 },
    );
  });
});
