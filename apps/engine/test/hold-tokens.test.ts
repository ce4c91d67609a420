import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Scheduler } from '../src/core/scheduler.js';
import { newCounters } from '../src/core/types.js';
import { engineWith, tinyModel, waitFor } from './helpers.js';

// One release per holder of admission (issue 20): a holder's second release must not end
// another holder's hold, and a forgotten release shows in STATUS `holds`.
describe('scheduler hold tokens', () => {
  const scheduler = () =>
    new Scheduler({ maxQueue: 4, counters: newCounters(), epoch: () => 0, pipeline: false });

  it('stays held until every holder released; a second release is a no-op', () => {
    const s = scheduler();
    const a = s.hold('a');
    const b = s.hold('b');
    expect(s.held).toBe(true);
    expect(s.holders.map((h) => h.reason)).toEqual(['a', 'b']);
    a();
    expect(s.held).toBe(true);
    a();
    expect(s.held).toBe(true);
    expect(s.holders.map((h) => h.reason)).toEqual(['b']);
    b();
    expect(s.held).toBe(false);
    expect(s.holders).toEqual([]);
  });

  it('lists two holders of the same reason apart', () => {
    const s = scheduler();
    const a = s.hold('same');
    s.hold('same');
    a();
    a();
    expect(s.holders.map((h) => h.reason)).toEqual(['same']);
  });
});

describe('engine hold tokens with a queued request', () => {
  let eng: Awaited<ReturnType<typeof engineWith>>;
  beforeAll(async () => {
    eng = await engineWith(['-m', await tinyModel(), '-c', '512']);
  }, 60_000);
  afterAll(async () => {
    await eng?.close();
  });

  const status = async () =>
    (await (await fetch(`${eng.url}/control/status`)).json()) as {
      holds: { reason: string; held_ms: number }[];
      slots: { busy: number; queued: number };
    };

  it('admits the queued request only once both holders released, and STATUS names them', async () => {
    const engine = eng.engine;
    const first = engine.hold('test: first');
    const second = engine.hold('test: second');
    const done = engine.submit(engine.tokenize('the long day'), {
      maxTokens: 2,
      stop: [],
      sampler: { temp: 0 },
      ignoreEos: true,
    });
    let settled = false;
    void done.then(() => {
      settled = true;
    });
    expect((await status()).holds.map((h) => h.reason)).toEqual(['test: first', 'test: second']);
    first();
    // Twice: with a shared counter this would end the second holder's hold too.
    first();
    await new Promise((r) => setTimeout(r, 300));
    const s = await status();
    expect(settled).toBe(false);
    expect(s.slots).toMatchObject({ busy: 0, queued: 1 });
    expect(s.holds.map((h) => h.reason)).toEqual(['test: second']);
    second();
    const r = await done;
    expect(r.completionTokens).toBe(2);
    await waitFor(async () => (await status()).holds.length === 0, 5000);
  });
});
