import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeSyntheticModel } from '../src/synth/index.js';
import { binDir, freePort } from './helpers.js';

// The stock upstream tools built from the pin load and run every tiny synthetic variant. Without
// the tools this suite is skipped, unless HYDRA_REQUIRE_NATIVE=1 makes their absence a failure.

const run = promisify(execFile);
const pkg = new URL('..', import.meta.url).pathname;
const toolDirs = [binDir, join(pkg, 'build/Release'), join(pkg, 'build/bin')].filter(
  (d): d is string => typeof d === 'string' && d.length > 0,
);
const tool = (name: string): string | undefined =>
  toolDirs.map((d) => join(d, name)).find((p) => existsSync(p));
const simple = tool('llama-simple');
const bench = tool('llama-bench');
const rpcServer = tool('ggml-rpc-server');
const required = process.env.HYDRA_REQUIRE_NATIVE === '1';

it.runIf(required)('finds the stock llama-simple, llama-bench and ggml-rpc-server', () => {
  expect({ simple, bench, rpcServer }).toEqual({
    simple: expect.any(String),
    bench: expect.any(String),
    rpcServer: expect.any(String),
  });
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
  { arch: 'qwen35', quant: 'f32' },
  { arch: 'qwen35', quant: 'q8_0' },
  { arch: 'qwen35', quant: 'q4_0' },
  { arch: 'qwen35moe', quant: 'f16' },
  { arch: 'qwen35moe', quant: 'q8_0' },
  { arch: 'qwen35moe', quant: 'q4_0' },
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

// With every layer on a stock ggml-rpc-server device the weights sit in a plain CPU buffer there,
// so this also runs where the local CPU backend repacks weights for AMX or similar kernels.
describe.skipIf(bench === undefined || rpcServer === undefined)(
  'llama-bench through a stock ggml-rpc-server',
  () => {
    let dir: string;
    let server: ChildProcess;
    let endpoint: string;
    beforeAll(async () => {
      dir = mkdtempSync(join(tmpdir(), 'hydra-synth-rpc-'));
      const port = await freePort();
      endpoint = `127.0.0.1:${port}`;
      server = spawn(rpcServer!, ['-H', '127.0.0.1', '-p', String(port), '-t', '2'], { stdio: 'ignore' });
      // The server is ready once it accepts a connection.
      const deadline = Date.now() + 10_000;
      for (;;) {
        const up = await new Promise<boolean>((ok) => {
          const s = createServer();
          s.once('error', () => ok(true));
          s.listen(port, '127.0.0.1', () => s.close(() => ok(false)));
        });
        if (up) break;
        if (Date.now() > deadline) throw new Error('ggml-rpc-server did not start');
        await new Promise((r) => setTimeout(r, 100));
      }
    }, 20_000);
    afterAll(() => {
      server?.kill();
      rmSync(dir, { recursive: true, force: true });
    });

    it.each(VARIANTS)('$arch $quant: pp16 and tg8 with all layers on the RPC device', async ({
      arch,
      quant,
    }) => {
      const model = join(dir, `tiny-${arch}-${quant}.gguf`);
      await writeSyntheticModel({ arch, shape: 'tiny', quant, seed: 7, out: model });
      const args = [
        '-m',
        model,
        '--rpc',
        endpoint,
        '-ngl',
        '99',
        '-p',
        '16',
        '-n',
        '8',
        '-r',
        '1',
        '-o',
        'json',
      ];
      const { stdout } = await run(bench!, args, { timeout: 60_000 });
      const results = JSON.parse(stdout) as Array<{
        n_prompt: number;
        n_gen: number;
        avg_ts: number;
        n_gpu_layers: number;
      }>;
      expect(results.map((r) => [r.n_prompt, r.n_gen, r.n_gpu_layers])).toEqual([
        [16, 0, 99],
        [0, 8, 99],
      ]);
      for (const r of results) expect(r.avg_ts).toBeGreaterThan(0);
    }, 120_000);
  },
);
