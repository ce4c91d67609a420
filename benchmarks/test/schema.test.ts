import { readFileSync } from 'node:fs';
import { undocumentedCodes } from '@hydra-engine/errors';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ERROR_CODES } from '../src/errors.js';
import { makeFigure, normalizeResult, SCHEMA_VERSION, summarize } from '../src/schema.js';

const results = new URL('../results/', import.meta.url);
const read = (name: string) => JSON.parse(readFileSync(new URL(name, results), 'utf8')) as unknown;

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return (err as { code?: string }).code;
  }
  return undefined;
}

it('documents every error code in README.md', () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  expect(undocumentedCodes(ERROR_CODES, readme)).toEqual([]);
});

describe('normalizeResult', () => {
  it('reads tiering-plan.json (ratio inside the anchor)', () => {
    const r = normalizeResult(read('tiering-plan.json'));
    expect(r.schema).toBe(SCHEMA_VERSION);
    expect(r.suite).toBe('tiering-plan');
    expect(r.machine.memory_gib).toBeNull();
    const f = r.figures[0]!;
    expect(f.anchor?.unit).toBe('clones/s');
    expect(f.ratio).toBeCloseTo(f.median / f.anchor!.median, 2);
    expect(f.better).toBe('higher');
    expect(r.figures[2]!.anchor).toBeNull();
    expect(r.figures[2]!.ratio).toBeNull();
  });

  it('reads hydra-rpc-port.json (anchor without unit, ratio_median, platform)', () => {
    const r = normalizeResult(read('hydra-rpc-port.json'));
    expect(r.suite).toBe('hydra-rpc-port');
    expect(r.machine.os).toBe('linux-x64');
    for (const f of r.figures) {
      expect(f.anchor?.unit).toBe(f.unit);
      expect(f.ratio).toBeCloseTo(f.median / f.anchor!.median, 6);
    }
    expect(r.figures.find((f) => f.unit === 'ms')?.better).toBe('lower');
  });

  it('round-trips what makeFigure builds', () => {
    const fig = makeFigure({
      name: 'x',
      unit: 'tok/s',
      samples: [3, 1, 2],
      anchor: { name: 'a', samples: [4, 4] },
    });
    expect(fig).toMatchObject({ median: 2, mean: 2, samples: 3, ratio: 0.5, better: 'higher' });
    expect(fig.anchor).toMatchObject({ name: 'a', unit: 'tok/s', median: 4 });
    const raw = {
      schema: 1,
      suite: 's',
      commit: 'c',
      date: '2026-11-29T00:00:00Z',
      machine: { cpu: 'c', cores: 1, memory_gib: 1, os: 'o', node: 'v20' },
      figures: [fig],
      skipped: [],
    };
    expect(normalizeResult(JSON.parse(JSON.stringify(raw))).figures[0]).toEqual(fig);
  });

  it('keeps the sweep position of a figure through makeFigure and normalizeResult', () => {
    const sweep = { family: 'stall: max gap', key: 'budget (n_batch)', value: 256 };
    const fig = makeFigure({ name: 'g', unit: 'ms', samples: [5], sweep });
    expect(fig.sweep).toEqual(sweep);
    const raw = {
      suite: 's',
      commit: 'c',
      date: '2026-11-29T00:00:00Z',
      machine: { cpu: 'c', cores: 1, node: 'v20' },
      figures: [fig],
    };
    expect(normalizeResult(JSON.parse(JSON.stringify(raw))).figures[0]!.sweep).toEqual(sweep);
    expect(makeFigure({ name: 'h', unit: 'ms', samples: [5] })).not.toHaveProperty('sweep');
  });

  it.each<[string, unknown]>([
    ['not an object', []],
    ['no suite', { commit: 'c', date: '2026-01-01', machine: {}, figures: [] }],
    [
      'bad date',
      { suite: 's', commit: 'c', date: 'yesterday', machine: { cpu: 'c', cores: 1, node: 'v' }, figures: [] },
    ],
    [
      'wrong schema',
      {
        schema: 2,
        suite: 's',
        commit: 'c',
        date: '2026-01-01',
        machine: { cpu: 'c', cores: 1, node: 'v' },
        figures: [],
      },
    ],
    [
      'figure without median',
      {
        suite: 's',
        commit: 'c',
        date: '2026-01-01',
        machine: { cpu: 'c', cores: 1, node: 'v' },
        figures: [{ name: 'f', unit: 'ms', samples: 1, p99: 1, mean: 1 }],
      },
    ],
    [
      'anchor without median',
      {
        suite: 's',
        commit: 'c',
        date: '2026-01-01',
        machine: { cpu: 'c', cores: 1, node: 'v' },
        figures: [{ name: 'f', unit: 'ms', samples: 1, median: 1, p99: 1, mean: 1, anchor: { name: 'a' } }],
      },
    ],
    ...(['a string', { family: 'f', key: 'k' }, { family: 'f', key: 'k', value: 'x' }] as const).map(
      (sweep): [string, unknown] => [
        `sweep ${JSON.stringify(sweep)}`,
        {
          suite: 's',
          commit: 'c',
          date: '2026-01-01',
          machine: { cpu: 'c', cores: 1, node: 'v' },
          figures: [{ name: 'f', unit: 'ms', samples: 1, median: 1, p99: 1, mean: 1, sweep }],
        },
      ],
    ),
  ])('rejects %s with HYDRA_ERR_BAD_RESULT', (_what, raw) => {
    expect(codeOf(() => normalizeResult(raw))).toBe('HYDRA_ERR_BAD_RESULT');
  });
});

describe('summarize', () => {
  it('orders min <= median <= p99 <= max and keeps the mean in range', () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ min: -1e9, max: 1e9, noNaN: true }), { minLength: 1, maxLength: 300 }),
        (xs) => {
          const s = summarize(xs);
          const min = Math.min(...xs);
          const max = Math.max(...xs);
          expect(s.samples).toBe(xs.length);
          expect(s.median).toBeGreaterThanOrEqual(min);
          expect(s.p99).toBeGreaterThanOrEqual(s.median);
          expect(s.p99).toBeLessThanOrEqual(max);
          expect(s.mean).toBeGreaterThanOrEqual(min - 1e-6);
          expect(s.mean).toBeLessThanOrEqual(max + 1e-6);
        },
      ),
    );
  });

  it('refuses no samples with HYDRA_ERR_BENCH_FAILED', () => {
    expect(codeOf(() => summarize([]))).toBe('HYDRA_ERR_BENCH_FAILED');
  });
});
