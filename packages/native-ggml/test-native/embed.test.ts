import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Context, initBackend, Model, type PoolingType } from '../src/index.js';
import { writeSyntheticModel } from '../src/synth/index.js';
import { binDir, maxAbsDiff, runToFile, tinyModel } from './helpers.js';

// Embeddings through the binding equal what the pinned tree's own llama-embedding prints for the
// same model, prompts, pooling and normalization.

const PROMPTS = ['Hello world, this is a test', 'the cat sat on the mat'];
const tool = join(binDir, 'llama-embedding');

/**
 * llama-embedding's printed embeddings (`--embd-output-format array`). Its log thread may still be
 * printing when main returns (common_log is never destroyed), which cut the output short through a
 * pipe on a loaded machine: stdout goes to a file (see runToFile), and a run whose output still does
 * not parse to every row is run again, at most 20 times.
 */
async function reference(
  path: string,
  pooling: string,
  normalize: number,
  prompts = PROMPTS,
  rows = 2,
): Promise<number[][]> {
  let last = '';
  for (let attempt = 0; attempt < 20; attempt++) {
    const stdout = await runToFile(
      tool,
      [
        '-m',
        path,
        '--pooling',
        pooling,
        '--embd-normalize',
        String(normalize),
        '--embd-output-format',
        'array',
        '-c',
        '512',
        '-p',
        prompts.join('\n'),
      ],
      120_000,
    );
    last = stdout;
    const start = stdout.indexOf('[[');
    const end = stdout.lastIndexOf(']]');
    if (start < 0 || end < 0) continue;
    try {
      const parsed = JSON.parse(stdout.slice(start, end + 2)) as number[][];
      if (parsed.length === rows && parsed.every((r) => r.length === 256)) return parsed;
    } catch {}
  }
  throw new Error(`llama-embedding printed no complete output in 20 runs; last: ${last.slice(-200)}`);
}

describe.skipIf(!existsSync(tool))('embedBatch on the tiny f32 model', () => {
  let path: string;
  let model: Model;
  const contexts = new Map<string, Context>();
  beforeAll(async () => {
    initBackend();
    path = await tinyModel('f32');
    model = await Model.load({ path });
  });
  afterAll(async () => {
    for (const ctx of contexts.values()) await ctx.dispose();
    model.dispose();
  });
  async function ctxFor(pooling: PoolingType): Promise<Context> {
    let ctx = contexts.get(pooling);
    if (!ctx) {
      ctx = await model.createContext({
        nCtx: 512,
        nBatch: 512,
        nUbatch: 512,
        nSeqMax: 4,
        embeddings: true,
        poolingType: pooling,
      });
      contexts.set(pooling, ctx);
    }
    return ctx;
  }
  const tokens = (p: string) => model.tokenize(p, { addSpecial: true, parseSpecial: true });

  it.each([
    ['mean', 2],
    ['mean', -1],
    ['mean', 0],
    ['mean', 1],
    ['mean', 3],
    ['cls', 2],
    ['last', 2],
  ] as const)('pooling %s, embd_normalize %d: equals llama-embedding', async (pooling, normalize) => {
    const ctx = await ctxFor(pooling);
    expect(ctx.embedInfo.poolingType).toBe(pooling);
    const got = await ctx.embed(
      PROMPTS.map((p, seq) => ({ seq, tokens: tokens(p) })),
      normalize,
    );
    const want = await reference(path, pooling, normalize);
    expect(got).toHaveLength(2);
    for (let i = 0; i < 2; i++) {
      expect(got[i]!.length).toBe(256);
      // llama-embedding prints 7 decimals (0 for the int16 scale).
      expect(maxAbsDiff(Array.from(got[i]!), want[i]!)).toBeLessThan(normalize === 0 ? 1 : 2e-6);
    }
    if (normalize === 2) {
      const norm = Math.hypot(...got[0]!);
      expect(norm).toBeCloseTo(1, 5);
    }
    // Each input in its own emptied sequence: alone it gives the same row.
    const alone = await ctx.embed([{ seq: 3, tokens: tokens(PROMPTS[1]!) }], normalize);
    expect(maxAbsDiff(Array.from(alone[0]!), Array.from(got[1]!))).toBeLessThan(1e-5);
  });

  it('pooling none returns every token row, unnormalized, as llama-embedding', async () => {
    const ctx = await ctxFor('none');
    const t = tokens(PROMPTS[0]!);
    const [rows] = await ctx.embed([{ seq: 0, tokens: t }], 2);
    expect(rows!.length).toBe(t.length * 256);
    const want = await reference(path, 'none', -1, [PROMPTS[0]!], t.length);
    expect(want).toHaveLength(t.length);
    expect(maxAbsDiff(Array.from(rows!), want.flat())).toBeLessThan(2e-6);
  });

  it('decode steps on an embeddings context still return the greedy tokens of a plain one', async () => {
    const ctx = await ctxFor('mean');
    const plain = await model.createContext({ nCtx: 512, nBatch: 512, nSeqMax: 4 });
    const sampler = model.createSampler({ temp: 0 });
    try {
      const t = tokens(PROMPTS[0]!);
      const a = await ctx.decode([{ seq: 1, pos: 0, tokens: t, sampler }]);
      const b = await plain.decode([{ seq: 1, pos: 0, tokens: t, sampler }]);
      expect(a.tokens[0]).toBe(b.tokens[0]);
      ctx.removeSequence(1);
    } finally {
      sampler.dispose();
      await plain.dispose();
    }
  });

  it('refuses inputs that do not fit one ubatch, bad tokens and repeated seqs', async () => {
    const ctx = await model.createContext({
      nCtx: 512,
      nBatch: 16,
      nUbatch: 16,
      nSeqMax: 2,
      embeddings: true,
      poolingType: 'mean',
    });
    try {
      await expect(ctx.embed([{ seq: 0, tokens: new Int32Array(17).fill(5) }])).rejects.toMatchObject({
        code: 'HYDRA_ERR_BAD_ARGUMENT',
      });
      await expect(ctx.embed([{ seq: 0, tokens: Int32Array.of(1, 99999) }])).rejects.toMatchObject({
        code: 'HYDRA_ERR_BAD_ARGUMENT',
      });
      await expect(
        ctx.embed([
          { seq: 0, tokens: Int32Array.of(1, 5) },
          { seq: 0, tokens: Int32Array.of(1, 6) },
        ]),
      ).rejects.toMatchObject({ code: 'HYDRA_ERR_BAD_ARGUMENT' });
      await expect(ctx.embed([{ seq: 2, tokens: Int32Array.of(1, 5) }])).rejects.toMatchObject({
        code: 'HYDRA_ERR_BAD_ARGUMENT',
      });
      // Still usable afterwards.
      expect((await ctx.embed([{ seq: 1, tokens: Int32Array.of(1, 5, 6) }]))[0]!.length).toBe(256);
    } finally {
      await ctx.dispose();
    }
  });

  it('the llama tiny model has no rank head', async () => {
    expect((await ctxFor('mean')).embedInfo.hasRankHead).toBe(false);
  });
});

describe.skipIf(!existsSync(tool))('rank pooling on the synthetic qwen3 reranker', () => {
  let path: string;
  let model: Model;
  let ctx: Context;
  beforeAll(async () => {
    initBackend();
    path = join(mkdtempSync(join(tmpdir(), 'hydra-rerank-')), 'rerank.gguf');
    await writeSyntheticModel({
      arch: 'llama',
      shape: 'tiny',
      quant: 'f32',
      seed: 7,
      out: path,
      head: 'rank',
    });
    model = await Model.load({ path });
    ctx = await model.createContext({
      nCtx: 512,
      nBatch: 512,
      nUbatch: 512,
      nSeqMax: 4,
      embeddings: true,
      poolingType: 'rank',
    });
  });
  afterAll(async () => {
    await ctx?.dispose();
    model?.dispose();
  });

  it('loads with a classification head and scores one value per input, as llama-embedding', async () => {
    const info = ctx.embedInfo;
    expect(info).toMatchObject({ poolingType: 'rank', hasRankHead: true, nClsOut: 2 });
    const got = await ctx.embed(
      PROMPTS.map((p, seq) => ({ seq, tokens: model.tokenize(p, { addSpecial: true, parseSpecial: true }) })),
      2,
    );
    expect(got.map((r) => r.length)).toEqual([2, 2]);
    // qwen3's head ends in a softmax over its labels (yes, no): the score is P(yes).
    for (const r of got) expect(r[0]! + r[1]!).toBeCloseTo(1, 5);
    expect(got[0]![0]).not.toBe(got[1]![0]);
    // llama-embedding prints each label's score with 3 decimals ("rerank score N: %8.3f [label]").
    // It normalizes a row of n_embd floats whatever the pooling, so a rank row of 2 scores only
    // prints as llama.cpp returned it without normalization (-1), as llama-server uses it.
    // Run again while its output is cut short, as reference() does.
    let scores: number[] = [];
    for (let attempt = 0; attempt < 20 && scores.length < 2; attempt++) {
      const stdout = await runToFile(
        tool,
        ['-m', path, '--pooling', 'rank', '--embd-normalize', '-1', '-c', '512', '-p', PROMPTS.join('\n')],
        120_000,
      );
      scores = [...stdout.matchAll(/rerank score (\d+):\s+(-?[\d.]+) \[yes\]/g)].map((m) => Number(m[2]));
    }
    expect(scores).toHaveLength(2);
    for (let i = 0; i < 2; i++) expect(Math.abs(got[i]![0]! - scores[i]!)).toBeLessThan(6e-4);
  });
});
