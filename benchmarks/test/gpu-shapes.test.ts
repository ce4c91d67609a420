import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { jsonShape, shapeDiff } from './json-shape.js';

// The GPU benchmark entries run on the CPU build (tiny synthetic models, tiny sizes), and their
// results files must have the shape of the files that the code before the harness split wrote with
// the same flags (fixtures/gpu-shapes/, written at a7ea5ba): the dashboard and older results read
// these keys. The flags below are the ones the fixtures were written with.
const root = new URL('../../', import.meta.url).pathname;
const bin = join(root, 'packages/native-ggml/build/bin');
const gpu = join(root, 'benchmarks/gpu');
const fixture = (name: string) =>
  JSON.parse(readFileSync(new URL(`./fixtures/gpu-shapes/${name}`, import.meta.url), 'utf8')) as unknown;

// Maps whose keys are data (model names, budgets, levels, environment variables), not schema.
const COLLAPSE = [
  /^\.notes\.(models|combine\.placements|stall\.runs|concurrency\.runs(\.[^.]+)?|concurrency\.batched_bench\.s_tg|environment)$/,
  /^\.machine\.devices\[\]$/,
];
// A nullable sample (decode_only is null when noise made the short run the longer one).
const nullable = (p: string) => p.endsWith('[]: null');

function compare(before: unknown, after: unknown) {
  const d = shapeDiff(jsonShape(before, COLLAPSE), jsonShape(after, COLLAPSE));
  return { onlyBefore: d.onlyA.filter((p) => !nullable(p)), onlyAfter: d.onlyB.filter((p) => !nullable(p)) };
}

function node(args: string[], timeoutMs: number): Promise<string> {
  return new Promise((ok, ko) =>
    execFile(
      process.execPath,
      args,
      {
        cwd: root,
        timeout: timeoutMs,
        env: { ...process.env, HYDRA_BENCH_CPU: '1', HYDRA_BENCH_COMMIT: 'shape-test' },
      },
      (err, _stdout, stderr) =>
        err ? ko(new Error(`${args[0]}: ${err.message}\n${stderr.slice(-3000)}`)) : ok(stderr),
    ),
  );
}

const only = (dir: string) => {
  const files = readdirSync(dir).filter((f) => f.endsWith('.json'));
  expect(files).toHaveLength(1);
  return JSON.parse(readFileSync(join(dir, files[0] as string), 'utf8')) as unknown;
};

describe('GPU benchmark results keep their shape (CPU, tiny model)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'hydra-gpu-shapes-'));
  const models = join(dir, 'models');
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('has the CPU build and the engine it runs', () => {
    for (const f of ['llama-bench', 'ggml-rpc-server', 'hydra_ggml.node'])
      expect(existsSync(join(bin, f)), `${bin}/${f}: build native-ggml`).toBe(true);
    expect(
      existsSync(join(root, 'apps/engine/dist/cli.js')),
      'apps/engine/dist/cli.js: build the engine',
    ).toBe(true);
  });

  it('run.mjs: synth, solo, boot and control', { timeout: 300_000 }, async () => {
    const out = join(dir, 'run');
    await node(
      [
        join(gpu, 'run.mjs'),
        ...[
          '--only',
          'synth,solo,boot,control',
          '--shapes',
          'tiny',
          '--moe-shape',
          'tiny',
          '--rpc-shape',
          'tiny',
        ],
        ...[
          '--load-shape',
          'tiny',
          '--combine-shapes',
          'tiny',
          '--reps',
          '1',
          '--ngl',
          '0',
          '--models',
          models,
        ],
        ...['--tools', bin, '--out', out, '--budget-s', '200'],
      ],
      280_000,
    );
    const r = only(out);
    expect(compare(fixture('run.json'), r)).toEqual({ onlyBefore: [], onlyAfter: [] });
    expect((r as { figures: unknown[] }).figures).toHaveLength(8);
  });

  it('native-port.mjs: memory and hello', { timeout: 200_000 }, async () => {
    const out = join(dir, 'native-port.json');
    await node(
      [
        join(gpu, 'native-port.mjs'),
        ...['--shapes', 'tiny', '--only', 'memory,hello', '--models', models, '--bin', bin],
        ...['--stock-devices', 'CPU', '--memory-ctx', '1024', '--out', out],
      ],
      180_000,
    );
    const r = JSON.parse(readFileSync(out, 'utf8')) as unknown;
    expect(compare(fixture('native-port.json'), r)).toEqual({ onlyBefore: [], onlyAfter: [] });
  });

  it(
    'serving.mjs: concurrency, engine only (no llama-batched-bench in --tools: its anchor is skipped)',
    { timeout: 200_000 },
    async () => {
      const out = join(dir, 'serving');
      // The fixture is the engine-only shape; the CPU build has llama-batched-bench too, so the tools
      // folder given here is one without it.
      const noTools = mkdtempSync(join(dir, 'no-tools-'));
      await node(
        [
          join(gpu, 'serving.mjs'),
          ...['--model', join(models, 'llama-tiny-q4_0.gguf'), '--tools', noTools, '--servers', 'engine'],
          ...['--only', 'concurrency', '--ngl', '0', '--threads', '2', '--np', '2', '--levels', '1,2'],
          ...['--conc-tokens', '16', '--reps', '1', '--out', out],
        ],
        180_000,
      );
      const r = only(out) as { skipped: { name: string }[] };
      expect(compare(fixture('serving.json'), r)).toEqual({ onlyBefore: [], onlyAfter: [] });
      expect(r.skipped.map((s) => s.name)).toEqual(['concurrency: llama-batched-bench anchor']);
    },
  );
});
