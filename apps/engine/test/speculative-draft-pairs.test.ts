import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineWith } from './helpers.js';

// The synthetic speculative pairs of SYNTH.md: the tiny model (the draft) against the tiny model
// plus 4 blocks whose output projections have `extraScale` times the usual deviation (the target).
// The scale sets the acceptance: measured on CPU with n_max 4, p_min 0, greedy, fixed prompts.
type Eng = Awaited<ReturnType<typeof engineWith>>;
const PAIRS = [
  { scale: 0.02, about: 0.95, min: 0.85, max: 1 },
  { scale: 0.07, about: 0.75, min: 0.6, max: 0.88 },
  { scale: 0.3, about: 0.3, min: 0.15, max: 0.45 },
];
const PROMPTS = [
  'Once upon a time',
  'The quick brown fox jumps over',
  'hello world, this is',
  'In the beginning',
  'one two three',
];
let dir: string;
let draft: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'hydra-spec-pairs-'));
  draft = join(dir, 'draft.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 0, out: draft });
});

async function metric(eng: Eng, name: string): Promise<number> {
  const text = await (await fetch(`${eng.url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  if (!m) throw new Error(`${name} not in /metrics`);
  return Number(m[1]);
}

/** The texts of PROMPTS (64 greedy tokens each) and the decode rate over them. */
async function run(eng: Eng): Promise<{ texts: string[]; tokPerS: number }> {
  const texts: string[] = [];
  let tokens = 0;
  const t0 = performance.now();
  for (const prompt of PROMPTS) {
    const res = await fetch(`${eng.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt, max_tokens: 64, temperature: 0, ignore_eos: true, cache_prompt: false }),
    });
    const json = (await res.json()) as { choices: { text: string }[]; usage: { completion_tokens: number } };
    texts.push(json.choices[0]!.text);
    tokens += json.usage.completion_tokens;
  }
  return { texts, tokPerS: (tokens * 1000) / (performance.now() - t0) };
}

describe('synthetic speculative pairs', () => {
  const engines: Eng[] = [];
  afterAll(async () => {
    for (const e of engines) await e.close();
  });

  it.each(PAIRS)('extraScale $scale gives about $about acceptance', async ({ scale, min, max }) => {
    const target = join(dir, `target-${scale}.gguf`);
    await writeSyntheticModel({
      arch: 'llama',
      shape: 'tiny',
      quant: 'q8_0',
      seed: 0,
      out: target,
      extraLayers: 4,
      extraScale: scale,
    });
    const flags = ['-m', target, '-c', '2048'];
    const spec = await engineWith([...flags, '-md', draft, '--spec-draft-n-max', '4']);
    engines.push(spec);
    const plain = await engineWith(flags);
    engines.push(plain);
    const d0 = await metric(spec, 'hydra_spec_drafted_total');
    const a0 = await metric(spec, 'hydra_spec_accepted_total');
    const withSpec = await run(spec);
    const drafted = (await metric(spec, 'hydra_spec_drafted_total')) - d0;
    const accepted = (await metric(spec, 'hydra_spec_accepted_total')) - a0;
    const without = await run(plain);
    expect(withSpec.texts).toEqual(without.texts);
    const acceptance = accepted / drafted;
    console.log(
      `pair extraScale ${scale}: drafted ${drafted} accepted ${accepted} acceptance ${acceptance.toFixed(3)}; ` +
        `CPU ${withSpec.tokPerS.toFixed(1)} tok/s with the draft, ${without.tokPerS.toFixed(1)} without`,
    );
    expect(acceptance).toBeGreaterThanOrEqual(min);
    expect(acceptance).toBeLessThanOrEqual(max);
  });
});
