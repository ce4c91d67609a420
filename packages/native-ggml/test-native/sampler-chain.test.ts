import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Context, initBackend, jsonSchemaToGrammar, Model, type SamplerParams } from '../src/index.js';
import { hasGpu, tinyModel } from './helpers.js';

// The sampler chain of common_params_sampling: which stages llama.cpp runs, and that a chain gives
// the same tokens whether it runs on the device (backendSampling: llama.cpp offloads logit bias,
// penalties, temperature and greedy) or on the host.

let model: Model;
let onDevice: Context;
let onHost: Context;

beforeAll(async () => {
  initBackend();
  model = await Model.load({ path: await tinyModel('f32'), nGpuLayers: hasGpu() ? -1 : 0 });
  onDevice = await model.createContext({ nCtx: 256, backendSampling: true });
  onHost = await model.createContext({ nCtx: 256, backendSampling: false });
});
afterAll(async () => {
  await onDevice?.dispose();
  await onHost?.dispose();
  model?.dispose();
});

async function generate(ctx: Context, params: SamplerParams, n = 16): Promise<number[]> {
  const s = model.createSampler(params);
  try {
    const prompt = Array.from(model.tokenize('Once upon a time there was', { addSpecial: true }));
    ctx.removeSequence(0, 0, -1);
    let r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler: s }]);
    const out = [r.tokens[0]!];
    while (out.length < n) {
      // Queued ahead, as the engine's decode loop does: the device feeds its own sampled token.
      r = await ctx.decode([{ seq: 0, pos: prompt.length + out.length - 1, follow: true, sampler: s }]);
      out.push(r.tokens[0]!);
    }
    return out;
  } finally {
    s.dispose();
  }
}

describe('sampler chains', () => {
  it.each([
    [{ temp: 0 }, ['greedy']],
    [{ temp: 0, logitBias: [{ token: 100, bias: 100 }] }, ['logit-bias', 'greedy']],
    [{ temp: 0, penaltyRepeat: 1.5 }, ['penalties', 'greedy']],
    [{ temp: 0, typP: 0.5, topK: 5 }, ['typical', 'greedy']],
    [{ temp: 0, dryMultiplier: 1 }, ['dry', 'greedy']],
    [{ temp: 0, xtcProbability: 0.5 }, ['xtc', 'greedy']],
    [{ temp: 0.8, seed: 1 }, ['top-k', 'top-p', 'min-p', 'temp', 'dist']],
    [{ temp: 0.8, seed: 1, dynatempRange: 0.5 }, ['top-k', 'top-p', 'min-p', 'temp-ext', 'dist']],
    [
      { temp: 0.8, seed: 1, topNSigma: 1, xtcProbability: 0.1 },
      ['top-n-sigma', 'top-k', 'top-p', 'min-p', 'xtc', 'temp', 'dist'],
    ],
    [
      { temp: 0.8, seed: 1, samplers: ['min_p', 'temperature', 'adaptive_p'] },
      ['min-p', 'temp', 'adaptive-p'],
    ],
    [{ temp: 0.8, seed: 1, mirostat: 1 }, ['temp', 'mirostat']],
    [{ temp: 0.8, seed: 1, mirostat: 2, samplers: ['top_k'] }, ['temp', 'mirostat-v2']],
    [
      { temp: 0, grammar: 'root ::= [a-c]+', logitBias: [{ token: 5, bias: 1 }] },
      ['grammar', 'logit-bias', 'greedy'],
    ],
  ] as [SamplerParams, string[]][])('%j runs %j', (params, names) => {
    const s = model.createSampler(params);
    expect(s.names()).toEqual(names);
    s.dispose();
  });

  it.each([
    { temp: 0, logitBias: [{ token: 100, bias: 3 }] },
    { temp: 0, penaltyRepeat: 1.3, penaltyLastN: -1 },
    // An offloadable prefix (bias, penalties) before a host-only stage: the prefix counts once.
    { temp: 0, logitBias: [{ token: 100, bias: 8 }], dryMultiplier: 2 },
    { temp: 0, penaltyRepeat: 3, typP: 0.3 },
    { temp: 0, logitBias: [{ token: 100, bias: 1.5 }], xtcProbability: 1, xtcThreshold: 0.01 },
    { temp: 0, grammar: 'root ::= [a-c]+', logitBias: [{ token: 100, bias: 2 }] },
  ] as SamplerParams[])('%j: the same tokens on the device and on the host', async (params) => {
    const device = await generate(onDevice, params);
    const host = await generate(onHost, params);
    expect(device).toEqual(host);
    // And the stage changed something: the same chain without it gives other tokens.
    expect(host).not.toEqual(await generate(onHost, { temp: 0 }));
  });

  it('feeds prompt history to every stage but the grammar', async () => {
    const s = model.createSampler({ temp: 0, grammar: 'root ::= [a-c]+', penaltyRepeat: 1.5 });
    // A prompt the grammar would refuse: accepted into the grammar, it would throw.
    s.accept(model.tokenize('Zzz 123', { addSpecial: true }));
    s.dispose();
  });

  it.each([
    [{ grammar: 'root ::= (' }, /grammar/],
    [{ logitBias: [{ token: 1_000_000, bias: 1 }] }, /logitBias/],
    [{ logitBias: [{ token: 1.5, bias: 1 }] }, /logitBias/],
    [{ samplers: ['nope'] }, /samplers/],
    [{ mirostat: 3 }, /mirostat/],
  ] as [SamplerParams, RegExp][])('%j is HYDRA_ERR_BAD_ARGUMENT', (params, message) => {
    let err: { code?: string; message?: string } | undefined;
    try {
      model.createSampler(params);
    } catch (e) {
      err = e as { code?: string; message?: string };
    }
    expect(err?.code).toBe('HYDRA_ERR_BAD_ARGUMENT');
    expect(err?.message).toMatch(message);
  });

  it('jsonSchemaToGrammar gives a grammar llama.cpp builds a chain for, and refuses what it cannot convert', async () => {
    const grammar = jsonSchemaToGrammar({
      type: 'object',
      properties: { n: { type: 'integer' } },
      required: ['n'],
    });
    expect(grammar).toMatch(/^root ::= /m);
    const tokens = await generate(onHost, { temp: 0, grammar }, 24);
    expect(model.detokenize(Int32Array.from(tokens))).toMatch(/^\{\s*"n"/);
    for (const bad of [{ type: 'frob' }, { $ref: '#/missing' }]) {
      expect(() => jsonSchemaToGrammar(bad)).toThrow(
        expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' }),
      );
    }
    expect(() => jsonSchemaToGrammar({ pad: 'x'.repeat(1 << 20) })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' }),
    );
  });
});
