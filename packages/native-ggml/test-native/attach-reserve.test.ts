import { type ChildProcess, spawn } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tinyModel } from './helpers.js';

// Attaching a sampler chain to a sequence for on-device sampling (llama_set_sampler) makes
// llama.cpp reserve the context's graphs again before the next decode, with a new scheduler (every
// compute buffer and the pinned input buffer allocated anew). On a GPU context with a large -kvu
// cache that is a step 2-3x its neighbours, stalling every running stream; so the addon attaches
// the first chain to every sequence that never sampled, in the reserve that attach pays anyway.
// Counted from llama.cpp's own "sched_reserve: reserving" log lines of a child process (the
// CPU backend samples on the device too when asked: backendSampling true).

let modelPath: string;
const procs: ChildProcess[] = [];

beforeAll(async () => {
  modelPath = await tinyModel('f32');
});
afterAll(() => {
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
});

/**
 * Runs `body` in a child with llama.cpp's info log on stderr; `mark(name)` ends the log section
 * `name` (what was logged since the mark before it).
 */
async function inChild(body: string): Promise<{ sections: Map<string, string>; result: unknown }> {
  const script = `
    const n = await import(${JSON.stringify(join(import.meta.dirname, '../dist/index.js'))});
    n.initBackend({ logLevel: 'info' });
    const mark = (name) => process.stderr.write('\\n@@MARK ' + name + '\\n');
    const model = await n.Model.load({ path: ${JSON.stringify(modelPath)}, nGpuLayers: 0 });
    const prompt = (salt, len = 12) => Int32Array.from({ length: len }, (_, j) => 300 + ((salt * 31 + j * 7) % 600));
    const result = await (async () => { ${body} })();
    mark('end');
    process.send(result, () => n.exitNow(0));
  `;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
  });
  procs.push(child);
  let err = '';
  child.stderr!.on('data', (d) => {
    err += d;
  });
  let result: unknown;
  child.on('message', (m) => {
    result = m;
  });
  const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
  expect(code, err.slice(-2000)).toBe(0);
  const sections = new Map<string, string>();
  const parts = err.split('\n@@MARK ');
  let text = parts[0]!;
  for (const p of parts.slice(1)) {
    const nl = p.indexOf('\n');
    sections.set(p.slice(0, nl), text);
    text = p.slice(nl + 1);
  }
  return { sections, result };
}

const reserves = (log: string | undefined): number =>
  (log ?? '').split('sched_reserve: reserving').length - 1;

/** Greedy steps over four sequences that take their slots one after another, on `ctxParams`. */
const slotsOneAfterAnother = (ctxParams: string) => `
  const ctx = await model.createContext(${ctxParams});
  const greedy = () => model.createSampler({ temp: 0 });
  const s = [greedy()];
  const tokens = [[], [], [], []];
  const pos = [12, 0, 0, 0];
  let r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt(0), sampler: s[0] }]);
  tokens[0].push(r.tokens[0]);
  mark('first-attach');
  // seq 0 decodes; seqs 1, 2 and 3 arrive later with their own greedy samplers (as new requests do).
  for (let k = 1; k <= 3; k++) {
    s[k] = greedy();
    const entries = [];
    for (let q = 0; q < k; q++) entries.push({ seq: q, pos: pos[q]++, tokens: Int32Array.of(tokens[q].at(-1)), sampler: s[q] });
    entries.push({ seq: k, pos: 0, tokens: prompt(k), sampler: s[k] });
    pos[k] = 12;
    r = await ctx.decode(entries);
    for (let q = 0; q <= k; q++) tokens[q].push(r.tokens[q]);
    for (let i = 0; i < 3; i++) {
      r = await ctx.decode(Array.from({ length: k + 1 }, (_, q) => ({ seq: q, pos: pos[q]++, tokens: Int32Array.of(tokens[q].at(-1)), sampler: s[q] })));
      for (let q = 0; q <= k; q++) tokens[q].push(r.tokens[q]);
    }
  }
  mark('later-slots');
`;

describe('on-device sampler attach', () => {
  it('a sequence that never sampled costs no graph reserve when a request takes it; tokens equal the host sampler', async () => {
    const run = (backendSampling: boolean) =>
      inChild(`${slotsOneAfterAnother(
        `{ nCtx: 1024, nSeqMax: 4, kvUnified: true, backendSampling: ${backendSampling} }`,
      )}
        // Another chain on seq 1 (finished, sampled before): it is attached anew, so one reserve.
        const other = model.createSampler({ temp: 0, logitBias: [{ token: 400, bias: 5 }] });
        r = await ctx.decode([{ seq: 1, pos: pos[1]++, tokens: Int32Array.of(tokens[1].at(-1)), sampler: other }]);
        tokens[1].push(r.tokens[0]);
        mark('other-chain');
        r = await ctx.decode([{ seq: 1, pos: pos[1]++, tokens: Int32Array.of(tokens[1].at(-1)), sampler: other }]);
        tokens[1].push(r.tokens[0]);
        return tokens;`);
    const device = await run(true);
    const host = await run(false);
    expect(reserves(device.sections.get('first-attach'))).toBeGreaterThanOrEqual(1);
    // Three later requests on three sequences that never sampled: no reserve (was one per step
    // that attached a new sequence's chain: 3).
    expect(reserves(device.sections.get('later-slots'))).toBe(0);
    expect(reserves(device.sections.get('other-chain'))).toBe(1);
    expect(reserves(device.sections.get('end'))).toBe(0);
    expect((device.result as number[][]).map((t) => t.length)).toEqual([13, 14, 8, 4]);
    expect(device.result).toEqual(host.result);
  }, 60_000);

  it.each([
    ['created for embeddings', 'embeddings: true, '],
    ['created without (as the engine does)', ''],
  ])(
    'an embed runs on sequences that sampled or never did, on a context %s; generation goes on as on the host',
    async (_, flag) => {
      const run = (backendSampling: boolean) =>
        inChild(`
        const ctx = await model.createContext({ nCtx: 1024, nSeqMax: 4, ${flag}poolingType: 'mean', backendSampling: ${backendSampling} });
        const first = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt(0), sampler: model.createSampler({ temp: 0 }) }]);
        // Every token of an input is an output: more than an attached chain allows per sequence.
        const rows = await ctx.embed([{ seq: 0, tokens: prompt(1, 8) }, { seq: 1, tokens: prompt(2, 8) }]);
        mark('embedded');
        const later = await ctx.decode([1, 2].map((seq) => ({ seq, pos: 0, tokens: prompt(seq + 2), sampler: model.createSampler({ temp: 0 }) })));
        return { tokens: [first.tokens[0], ...later.tokens], rows: rows.map((r) => Array.from(r.slice(0, 4))) };
      `);
      const device = await run(true);
      const host = await run(false);
      expect(device.sections.has('embedded')).toBe(true);
      expect((device.result as { rows: number[][] }).rows).toHaveLength(2);
      expect(device.result).toEqual(host.result);
    },
    60_000,
  );
});
