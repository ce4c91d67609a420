import { describe, expect, it } from 'vitest';
import { runBenchClient, runPlan } from '../src/tools.js';
import { tinyModel } from './helpers.js';

// plan and bench-client read their words with serve's scanner (src/args/argv.ts).
const io = { stdout: { write: () => true }, stderr: { write: () => true } };

async function refusal(p: Promise<unknown>): Promise<{ code?: string; keys?: string[] }> {
  try {
    await p;
  } catch (err) {
    const e = err as { code?: string; keys?: string[] };
    return { code: e.code, keys: e.keys };
  }
  throw new Error('expected a refusal');
}

describe('plan and bench-client flags', () => {
  it('refuse a value on a switch, a flag given twice under two names, a missing value, an unknown flag', async () => {
    const bad = { code: 'HYDRA_ERR_BAD_ARGUMENT' };
    expect(await refusal(runPlan(['--json=1'], io))).toEqual({ ...bad, keys: ['--json'] });
    expect(await refusal(runPlan(['-m', 'a.gguf', '--model', 'b.gguf'], io))).toEqual({
      ...bad,
      keys: ['--model'],
    });
    expect(await refusal(runPlan(['-c', '5', '--ctx', '6'], io))).toEqual({ ...bad, keys: ['--ctx'] });
    expect(await refusal(runPlan(['--model'], io))).toEqual({ ...bad, keys: ['--model'] });
    expect(await refusal(runPlan(['--model='], io))).toEqual({ ...bad, keys: ['--model'] });
    expect(await refusal(runPlan(['--nope'], io))).toEqual({ ...bad, keys: ['--nope'] });
    expect(await refusal(runBenchClient(['--json=yes'], io))).toEqual({ ...bad, keys: ['--json'] });
    expect(await refusal(runBenchClient(['--prompt', '--json'], io))).toEqual({ ...bad, keys: ['--prompt'] });
    expect(await refusal(runBenchClient(['--requests', '0'], io))).toEqual({ ...bad, keys: ['--requests'] });
  });

  it("plan's -ub and -fa size the compute buffer; another -fa value is refused by name", async () => {
    const model = await tinyModel();
    const compute = async (extra: string[]) => {
      let out = '';
      const capture = { stdout: { write: (s: string) => ((out += s), true) }, stderr: io.stderr };
      await runPlan(['-m', model, '--device', 'CPU=4096', '-c', '4096', '--json', ...extra], capture);
      return JSON.parse(out).devices[0].compute_bytes as number;
    };
    const base = await compute([]);
    expect(await compute(['-ub', '128'])).toBeLessThan(base);
    expect(await compute(['-fa', 'off'])).toBeGreaterThan(base);
    expect(await compute(['-fa', 'on'])).toBe(base);
    expect(await compute(['-fa', 'auto'])).toBe(base);
    expect(await refusal(runPlan(['-m', model, '--device', 'CPU=4096', '-fa', 'maybe'], io))).toEqual({
      code: 'HYDRA_ERR_BAD_ARGUMENT',
      keys: ['--flash-attn'],
    });
  });
});
