import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { listDevices, Model } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { modelFactsFromGguf, planSplit } from '@hydra-engine/resolver';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { contextParamsFrom } from '../src/core/params.js';
import { checkContext, fitOf, readGgufFile } from '../src/placement.js';
import { complete, metric } from './compare-helpers.js';
import { engineWith } from './helpers.js';

// Speculative decoding on the hybrid synthetic models (qwen35, qwen35moe): a rejected guess leaves
// the recurrent state through llama.cpp's n_rs_seq snapshots (the context keeps one per token a
// step may guess), so greedy text with speculation must equal the text without, and the guesses
// must actually be made (before n_rs_seq a recurrent model was never speculated: 0 drafted).
type Eng = Awaited<ReturnType<typeof engineWith>>;

const dir = mkdtempSync(join(tmpdir(), 'hydra-hybrid-spec-'));
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

const REPETITIVE = 'one two three four one two three four one two three four one two three four one two';

// Per arch, a seed and cut whose echoed run the target follows for a few tokens (see echoPrompt).
describe.each([
  ['qwen35', 7, 40],
  ['qwen35moe', 3, 20],
] as const)('tiny %s', (arch, seed, cut) => {
  let path: string;
  let plain: Eng;
  beforeAll(async () => {
    path = join(dir, `${arch}.gguf`);
    await writeSyntheticModel({ arch, shape: 'tiny', quant: 'f32', seed, out: path });
    plain = await engineWith(['-m', path, '-np', '2', '-c', '2048']);
  }, 60_000);
  afterAll(async () => {
    await plain?.close();
  });

  it.each([
    [0, 1],
    [4, 1],
    [16, 2],
  ] as const)('n_rs_seq %i, %i sequences: the context reports it and PLAN sizes the recurrent state as llama.cpp', async (nRsSeq, nSeq) => {
    const facts = modelFactsFromGguf(await readGgufFile(path));
    const plan = planSplit(facts, {
      devices: [{ name: 'CPU', freeBytes: 64 * 2 ** 30 }],
      nCtx: 1024,
      nParallel: nSeq,
      nGpuLayers: 0,
      nRsSeq,
    });
    const base = planSplit(facts, {
      devices: [{ name: 'CPU', freeBytes: 64 * 2 ** 30 }],
      nCtx: 1024,
      nParallel: nSeq,
      nGpuLayers: 0,
    });
    const model = await Model.load({ path, nGpuLayers: 0 });
    try {
      const ctx = await model.createContext({ nCtx: 1024, nSeqMax: nSeq, nRsSeq });
      const state = ctx.memory().reduce((a, m) => a + m.context, 0);
      expect(ctx.info.nRsSeq).toBe(nRsSeq);
      await ctx.dispose();
      // Exact: the attention KV plus (1 + n_rs_seq) recurrent row sets per sequence.
      expect(plan.host.kvBytes).toBe(state);
      const recurrentLayers = facts.layers.filter((l) => l.kind === 'recurrent').length;
      expect(plan.host.kvBytes - base.host.kvBytes).toBe(
        nRsSeq * recurrentLayers * 4 * (facts.nEmbdR + facts.nEmbdS) * nSeq,
      );
      console.log(
        `${arch} n_rs_seq ${nRsSeq} x${nSeq}: context state ${state} B (without snapshots ${base.host.kvBytes} B)`,
      );
    } finally {
      model.dispose();
    }
  });

  it("PLAN's fit of a speculative configuration counts the snapshots the engine's context holds", async () => {
    const facts = modelFactsFromGguf(await readGgufFile(path));
    const cfg = {
      model: path,
      n_ctx: 1024,
      n_parallel: 2,
      n_gpu_layers: -1,
      tensor_split: [],
      'speculative.types': ['ngram_simple'],
      'speculative.ngram_size_m': 6,
    };
    const recurrent = (c: Record<string, unknown>) => {
      const fit = fitOf(facts, c, {
        devices: listDevices().filter((d) => d.type === 'cpu'),
        peerDevices: () => undefined,
        fit: {},
      });
      if (!('report' in fit)) throw new Error(fit.unknown);
      return fit.report.devices[0]!.recurrentBytes;
    };
    const { 'speculative.types': _t, ...off } = cfg;
    expect(recurrent(cfg)).toBe(7 * recurrent(off));
    // What the engine builds from the same keys (contextParamsFrom): the fit's KV + recurrent bytes.
    const model = await Model.load({ path, nGpuLayers: 0 });
    try {
      const ctx = await model.createContext(contextParamsFrom(cfg));
      expect(ctx.info.nRsSeq).toBe(6);
      const state = ctx.memory().reduce((a, m) => a + m.context, 0);
      await ctx.dispose();
      const fit = fitOf(facts, cfg, {
        devices: listDevices().filter((d) => d.type === 'cpu'),
        peerDevices: () => undefined,
        fit: {},
      });
      if (!('report' in fit)) throw new Error(fit.unknown);
      const d = fit.report.devices[0]!;
      expect(d.kvBytes + d.recurrentBytes).toBe(state);
    } finally {
      model.dispose();
    }
  });

  // Random weights guess nothing of their own text, so the guesses come from a prompt holding an
  // earlier greedy run T: P + T[0:60] + P + T[0:cut]. The n-gram lookup proposes T[cut:], which
  // the target follows for a few tokens and then leaves (the context differs): guesses accepted,
  // then rejected inside one step, whose rejected part the snapshots roll back.
  async function tokens(eng: Eng, prompt: unknown, n: number): Promise<number[]> {
    const res = await fetch(`${eng.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        prompt,
        max_tokens: n,
        temperature: 0,
        ignore_eos: true,
        return_tokens: true,
        cache_prompt: false,
      }),
    });
    expect(res.status).toBe(200);
    return ((await res.json()) as { choices: { tokens: number[] }[] }).choices[0]!.tokens;
  }
  async function echoPrompt(): Promise<number[]> {
    const res = await fetch(`${plain.url}/tokenize`, {
      method: 'POST',
      body: JSON.stringify({ content: 'hello world', add_special: true }),
    });
    const p = ((await res.json()) as { tokens: number[] }).tokens;
    const t = await tokens(plain, p, 80);
    return [...p, ...t.slice(0, 60), ...p, ...t.slice(0, cut)];
  }

  it("ngram_simple: the plain engine's greedy tokens, guesses accepted and rejected inside a step", async () => {
    const spec = await engineWith([
      '-m',
      path,
      '-np',
      '2',
      '-c',
      '2048',
      '--spec-type',
      'ngram-simple',
      '--spec-ngram-simple-size-n',
      '2',
      '--spec-ngram-simple-size-m',
      '8',
    ]);
    try {
      const prompt = await echoPrompt();
      expect(await tokens(spec, prompt, 40)).toEqual(await tokens(plain, prompt, 40));
      const drafted = await metric(spec, 'hydra_spec_drafted_total');
      const accepted = await metric(spec, 'hydra_spec_accepted_total');
      // 0 drafted when a recurrent model was never speculated.
      expect(drafted).toBeGreaterThan(0);
      expect(accepted).toBeGreaterThan(0);
      expect(accepted).toBeLessThan(drafted);
      // Two streams at once (two sequences' snapshots), and a stop string inside the guessed run.
      const other = { prompt: REPETITIVE, max_tokens: 200, ignore_eos: true };
      const body = { prompt, max_tokens: 40, ignore_eos: true };
      const two = await Promise.all([complete(spec, body), complete(spec, other)]);
      expect(two).toEqual(await Promise.all([complete(plain, body), complete(plain, other)]));
      const stop = { ...body, stop: [two[0]!.text.slice(3, 6)] };
      const cut = await complete(spec, stop);
      expect(cut).toEqual(await complete(plain, stop));
      expect(cut.finish).toBe('stop');
      // cache_prompt: the slot's prompt checkpoints (issue 24) beside the snapshots; a second
      // request extends the first one's prompt and text, read from a restored checkpoint.
      const first = await complete(spec, { ...body, cache_prompt: true, id_slot: 0 });
      expect(first).toEqual(await complete(plain, body));
      const longer = { prompt: [...prompt, 7, 8, 9], max_tokens: 40, ignore_eos: true };
      const again = await complete(spec, { ...longer, cache_prompt: true, id_slot: 0 });
      expect(again.text).toBe((await complete(plain, longer)).text);
      expect(again.cached).toBeGreaterThan(0);
      console.log(`${arch} cache_prompt with speculation: ${again.cached} prompt tokens reused`);
      const st = (await (await fetch(`${spec.url}/control/status`)).json()) as {
        speculative: { drafted: number; accepted: number };
      };
      expect(st.speculative.drafted).toBeGreaterThan(drafted);
      console.log(
        `${arch} ngram_simple: first request drafted ${drafted} accepted ${accepted}; all ${st.speculative.drafted} / ${st.speculative.accepted}`,
      );
    } finally {
      await spec.close();
    }
  }, 180_000);

  it("ngram_mod: the plain engine's greedy text; a repeated request is guessed from the shared hash", async () => {
    const spec = await engineWith([
      '-m',
      path,
      '-np',
      '2',
      '-c',
      '2048',
      '--spec-type',
      'ngram-mod',
      '--spec-ngram-mod-n-match',
      '4',
      '--spec-ngram-mod-n-max',
      '16',
      '--spec-ngram-mod-n-min',
      '2',
    ]);
    try {
      const bodies = [
        { prompt: REPETITIVE, max_tokens: 96, ignore_eos: true },
        { prompt: 'hello world', max_tokens: 200, ignore_eos: true },
      ];
      const want = await Promise.all(bodies.map((b) => complete(plain, b)));
      for (let i = 0; i < bodies.length; i++) expect(await complete(spec, bodies[i]!)).toEqual(want[i]);
      expect(await Promise.all(bodies.map((b) => complete(spec, b)))).toEqual(want);
      const drafted = await metric(spec, 'hydra_spec_drafted_total');
      const accepted = await metric(spec, 'hydra_spec_accepted_total');
      expect(drafted).toBeGreaterThan(0);
      expect(accepted).toBeGreaterThan(0);
      console.log(`${arch} ngram_mod: drafted ${drafted} accepted ${accepted}`);
    } finally {
      await spec.close();
    }
  }, 180_000);

  it("a llama draft model (same vocabulary): the plain engine's greedy tokens", async () => {
    const draft = join(dir, `draft-for-${arch}.gguf`);
    await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 7, out: draft });
    const spec = await engineWith([
      '-m',
      path,
      '-np',
      '2',
      '-c',
      '2048',
      '-md',
      draft,
      '--spec-draft-n-max',
      '4',
    ]);
    try {
      const prompt = await echoPrompt();
      const bodies = [
        { prompt, max_tokens: 40, ignore_eos: true },
        { prompt: 'hello world', max_tokens: 120, ignore_eos: true },
      ];
      const want = await Promise.all(bodies.map((b) => complete(plain, b)));
      expect(await Promise.all(bodies.map((b) => complete(spec, b)))).toEqual(want);
      const drafted = await metric(spec, 'hydra_spec_drafted_total');
      const accepted = await metric(spec, 'hydra_spec_accepted_total');
      // A random draft agrees with a random target by chance only: guesses made, rolled back.
      expect(drafted).toBeGreaterThan(0);
      console.log(`${arch} draft_simple (tiny llama draft): drafted ${drafted} accepted ${accepted}`);
    } finally {
      await spec.close();
    }
  }, 180_000);

  it('refuses, by name, a draft length n_ubatch cannot hold with its snapshots', async () => {
    const facts = modelFactsFromGguf(await readGgufFile(path));
    const cfg = {
      n_ctx: 1024,
      n_ubatch: 16,
      'speculative.types': ['ngram_mod'],
      'speculative.ngram_mod.n_max': 16,
    };
    const cpu = [{ name: 'CPU', description: 'CPU', type: 'cpu', free: 2 ** 34, total: 2 ** 34 }] as never;
    expect(() => checkContext(facts, cfg, cpu, undefined, 2 ** 34)).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_VALUE' }),
    );
    // The engine's load is refused so, instead of llama.cpp's abort at the first decode.
    const eng = await engineWith([
      '-m',
      path,
      '-ub',
      '16',
      '--spec-type',
      'ngram-mod',
      '--spec-ngram-mod-n-max',
      '16',
    ]);
    try {
      expect(eng.loadError).toMatchObject({ code: 'HYDRA_ERR_BAD_VALUE' });
      expect(eng.engine.model).toBeUndefined();
    } finally {
      await eng.close();
    }
    // One snapshot fewer fits (llama.cpp needs n_ubatch > 1 + n_rs_seq).
    expect(() =>
      checkContext(facts, { ...cfg, 'speculative.ngram_mod.n_max': 14 }, cpu, undefined, 2 ** 34),
    ).not.toThrow();
  });
});
