import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeSyntheticModel } from '../src/synth/index.js';

// The stock upstream tools built from the pin load and run every tiny synthetic variant. Without
// the tools this suite is skipped, unless HYDRA_REQUIRE_NATIVE=1 makes their absence a failure.

const run = promisify(execFile);
const pkg = new URL('..', import.meta.url).pathname;
const toolDirs = [process.env.HYDRA_LLAMA_TOOLS, join(pkg, 'build/Release'), join(pkg, 'build/bin')].filter(
  (d): d is string => typeof d === 'string' && d.length > 0,
);
const tool = (name: string): string | undefined =>
  toolDirs.map((d) => join(d, name)).find((p) => existsSync(p));
const simple = tool('llama-simple');
const bench = tool('llama-bench');
const required = process.env.HYDRA_REQUIRE_NATIVE === '1';

it.runIf(required)('finds the stock llama-simple and llama-bench', () => {
  expect({ simple, bench }).toEqual({ simple: expect.any(String), bench: expect.any(String) });
});

const PROMPT = 'Hello world, the quick brown fox';
const VARIANTS = [
  { arch: 'llama', quant: 'f32' },
  { arch: 'llama', quant: 'f16' },
  { arch: 'llama', quant: 'q8_0' },
  { arch: 'llama', quant: 'q4_0' },
  { arch: 'moe', quant: 'f16' },
  { arch: 'moe', quant: 'q8_0' },
  { arch: 'moe', quant: 'q4_0' },
] as const;

describe.skipIf(simple === undefined || bench === undefined)(
  'upstream tools on tiny synthetic models',
  () => {
    let dir: string;
    beforeAll(() => {
      dir = mkdtempSync(join(tmpdir(), 'hydra-synth-upstream-'));
    });
    afterAll(() => {
      rmSync(dir, { recursive: true, force: true });
    });

    describe.each(VARIANTS)('$arch $quant', ({ arch, quant }) => {
      let model: string;
      beforeAll(async () => {
        model = join(dir, `tiny-${arch}-${quant}.gguf`);
        await writeSyntheticModel({ arch, shape: 'tiny', quant, seed: 7, out: model });
      });

      it('llama-simple loads it and generates greedily, the same text twice', async () => {
        const args = ['-m', model, '-n', '8', PROMPT];
        const first = await run(simple!, args, { timeout: 60_000 });
        const decoded = /decoded (\d+) tokens/.exec(first.stderr);
        expect(decoded, first.stderr).not.toBeNull();
        expect(Number(decoded![1])).toBeGreaterThan(0);
        // The prompt is echoed token by token after <s>: the vocabulary round-trips ordinary English.
        const echoed = first.stdout.indexOf(PROMPT);
        expect(echoed, first.stdout).toBeGreaterThanOrEqual(0);
        expect(first.stdout.slice(echoed + PROMPT.length).trim().length).toBeGreaterThan(0);
        const second = await run(simple!, args, { timeout: 60_000 });
        expect(second.stdout).toBe(first.stdout);
      }, 120_000);

      it('llama-bench runs prompt processing and generation on it', async () => {
        const { stdout } = await run(bench!, ['-m', model, '-p', '16', '-n', '8', '-r', '1', '-o', 'json'], {
          timeout: 60_000,
        });
        const results = JSON.parse(stdout) as Array<{ n_prompt: number; n_gen: number; avg_ts: number }>;
        expect(results.map((r) => [r.n_prompt, r.n_gen])).toEqual([
          [16, 0],
          [0, 8],
        ]);
        for (const r of results) expect(r.avg_ts).toBeGreaterThan(0);
      }, 120_000);
    });
  },
);
