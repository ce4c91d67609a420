import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { initBackend, Model } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { defaults, type Params, plan } from '@hydra-engine/tiering';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { contextParamsFrom } from '../src/core/params.js';

// cpuparams(.batch).cpumask / strict_cpu reach ggml's threadpool: the affinity the kernel holds
// for this process's threads (/proc/self/task/*/status) is what the compute threads run on.

const cpusOf = (status: string) => /^Cpus_allowed_list:\s*(\S+)/m.exec(status)?.[1] ?? '';

/** Cpus_allowed_list of every thread of this process but the main one, which ggml never pins. */
function threadCpus(): string[] {
  const out: string[] = [];
  for (const tid of readdirSync('/proc/self/task')) {
    if (Number(tid) === process.pid) continue;
    try {
      out.push(cpusOf(readFileSync(`/proc/self/task/${tid}/status`, 'utf8')));
    } catch {
      // the thread ended between the listing and the read
    }
  }
  return out;
}

const own = cpusOf(readFileSync('/proc/self/status', 'utf8'));
const multiCpu = own.includes('-') || own.includes(',');

const dir = mkdtempSync(join(tmpdir(), 'hydra-cpu-placement-'));
let model: Model;

beforeAll(async () => {
  initBackend();
  const path = join(dir, 'tiny.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 7, out: path });
  model = await Model.load({ path, nGpuLayers: 0 });
}, 60_000);
afterAll(() => model?.dispose());

/** A context from the registry keys (as the engine builds it), fed a prompt then one token. */
async function run(delta: Params, after: 'prompt' | 'token'): Promise<string[]> {
  const cfg = plan(defaults(), {
    n_ctx: 256,
    'cpuparams.n_threads': 2,
    'cpuparams_batch.n_threads': 2,
    ...delta,
  }).next;
  const ctx = await model.createContext(contextParamsFrom(cfg));
  const s = model.createSampler({ temp: 0 });
  try {
    const prompt = Array.from(model.tokenize('Once upon a time there was', { addSpecial: true }));
    const r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler: s }]);
    if (after === 'prompt') return threadCpus();
    await ctx.decode([{ seq: 0, pos: prompt.length, tokens: [r.tokens[0]!], sampler: s }]);
    return threadCpus();
  } finally {
    s.dispose();
    await ctx.dispose();
  }
}

// Needs a process allowed on CPUs 0 and 1 (the 2-core CI box and any larger one).
describe.runIf(multiCpu && own.startsWith('0'))('CPU placement of the compute threads', () => {
  it('cpumask pins the compute threads, and a later context without one unpins them', async () => {
    expect(await run({}, 'token')).not.toContain('0');
    expect(await run({ 'cpuparams.cpumask': '0x1' }, 'token')).toContain('0');
    // The OpenMP workers outlive a context: the next one resets them to the process's own CPUs.
    expect(await run({}, 'token')).not.toContain('0');
  });

  it('strict_cpu gives each compute thread one CPU of the mask', async () => {
    const loose = await run({ 'cpuparams.cpumask': '0x3' }, 'token');
    expect(loose).not.toContain('0');
    expect(loose).not.toContain('1');
    const strict = await run({ 'cpuparams.cpumask': '0x3', 'cpuparams.strict_cpu': true }, 'token');
    expect(strict).toEqual(expect.arrayContaining(['0', '1']));
  });

  it('the batch group takes its own mask for prompts', async () => {
    const batch = { 'cpuparams.cpumask': '0x1', 'cpuparams_batch.cpumask': '0x2' };
    // The prompt ran on the batch pool (CPU 1); the next token on the generation pool (CPU 0).
    expect(await run(batch, 'prompt')).toContain('1');
    const token = await run(batch, 'token');
    expect(token).toContain('0');
    const strict = await run(
      { 'cpuparams.cpumask': '0x3', 'cpuparams_batch.cpumask': '0x3', 'cpuparams_batch.strict_cpu': true },
      'prompt',
    );
    expect(strict).toEqual(expect.arrayContaining(['0', '1']));
  });

  it('refuses a mask that is not hex, by its key', () => {
    expect(() => plan(defaults(), { 'cpuparams.cpumask': '0xZZ' })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_VALUE' }),
    );
  });
});
