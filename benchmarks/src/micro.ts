// `pnpm bench` (through turbo, after build): micro benchmarks of the frame codec and of one binding
// call, each against an anchor measured in the same run. Writes benchmarks/results/micro-*.json.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  decodePayload,
  encodeFrame,
  encodePayload,
  FrameReader,
  HEADER_BYTES,
  OPCODES,
} from '@hydra-engine/hydra-rpc';
import { Bench, type Task } from 'tinybench';
import { newResult, repoRoot, writeResult } from './results.js';
import { type Figure, makeFigure, type Skipped } from './schema.js';

const TIME_MS = Number(process.env.HYDRA_BENCH_TIME_MS) || 1500;

// A CONFIGURE delta of realistic size: sampling, context and placement keys.
const DELTA = {
  sampling: { temp: 0.7, top_k: 40, top_p: 0.95, min_p: 0.05, repeat_penalty: 1.1 },
  seed: 42,
  n_ctx: 8192,
  n_batch: 2048,
  n_ubatch: 512,
  n_parallel: 4,
  flash_attn: 'on',
  cache_type_k: 'q8_0',
  cache_type_v: 'q8_0',
  n_gpu_layers: 99,
  tensor_split: [0.6, 0.4],
  rpc_servers: ['10.0.0.2:50052'],
  override_tensors: ['blk\\.(\\d+)\\.ffn_.*_exps=CPU'],
};

function samplesOf(task: Task | undefined): number[] {
  const r = task?.result;
  if (!r || (r.state !== 'completed' && r.state !== 'aborted-with-statistics')) {
    throw new Error(
      `benchmark ${task?.name}: ${r?.state ?? 'missing'}${r && 'error' in r ? ` ${String(r.error)}` : ''}`,
    );
  }
  // tinybench keeps latencies in ms; report ns for sub-microsecond operations.
  return [...(r.latency.samples ?? [])].map((ms) => ms * 1e6);
}

async function codecFigures(): Promise<Figure[]> {
  const bench = new Bench({ time: TIME_MS, warmupTime: 200, retainSamples: true });
  const json = encodeFrame(OPCODES.CONFIGURE, encodePayload(DELTA, 'json'));
  const msgpack = encodeFrame(OPCODES.CONFIGURE, encodePayload(DELTA, 'msgpack'));
  const jsonBody = json.subarray(HEADER_BYTES);
  let sink = 0;
  const decodeFrame = (frame: Buffer) => {
    const reader = new FrameReader(64 << 20);
    reader.push(frame);
    const r = reader.next();
    if (r.kind !== 'frame') throw new Error(`codec bench: ${r.kind}`);
    sink += Object.keys(decodePayload(r.frame.payload).value).length;
  };
  bench
    .add('encode json', () => {
      sink += encodeFrame(OPCODES.CONFIGURE, encodePayload(DELTA, 'json')).byteLength;
    })
    .add('encode msgpack', () => {
      sink += encodeFrame(OPCODES.CONFIGURE, encodePayload(DELTA, 'msgpack')).byteLength;
    })
    .add('anchor encode', () => {
      sink += Buffer.from(JSON.stringify(DELTA), 'utf8').byteLength;
    })
    .add('decode json', () => decodeFrame(json))
    .add('decode msgpack', () => decodeFrame(msgpack))
    .add('anchor decode', () => {
      sink += Object.keys(JSON.parse(jsonBody.toString('utf8'))).length;
    });
  const tasks = await bench.run();
  if (sink === 0) throw new Error('codec bench: nothing was encoded');
  const by = (n: string) => samplesOf(tasks.find((t) => t.name === n));
  const encAnchor = {
    name: 'JSON.stringify + Buffer.from of the same delta',
    unit: 'ns',
    samples: by('anchor encode'),
  };
  const decAnchor = {
    name: 'JSON.parse of the same payload bytes',
    unit: 'ns',
    samples: by('anchor decode'),
  };
  return [
    makeFigure({
      name: 'frame encode, CONFIGURE delta, json',
      unit: 'ns',
      samples: by('encode json'),
      anchor: encAnchor,
    }),
    makeFigure({
      name: 'frame encode, CONFIGURE delta, msgpack',
      unit: 'ns',
      samples: by('encode msgpack'),
      anchor: encAnchor,
    }),
    makeFigure({
      name: 'frame decode, CONFIGURE delta, json',
      unit: 'ns',
      samples: by('decode json'),
      anchor: decAnchor,
    }),
    makeFigure({
      name: 'frame decode, CONFIGURE delta, msgpack',
      unit: 'ns',
      samples: by('decode msgpack'),
      anchor: decAnchor,
    }),
  ];
}

function findTool(name: string): string | undefined {
  const root = repoRoot();
  const dirs = [
    process.env.HYDRA_LLAMA_TOOLS,
    join(root, 'packages/native-ggml/build-cuda/bin'),
    join(root, 'packages/native-ggml/build/bin'),
  ];
  return dirs
    .filter((d): d is string => !!d)
    .map((d) => join(d, name))
    .find((p) => existsSync(p));
}

async function nativeFigures(skipped: Skipped[], notes: Record<string, unknown>): Promise<Figure[]> {
  let native: typeof import('@hydra-engine/native-ggml');
  let synth: typeof import('@hydra-engine/native-ggml/synth');
  try {
    native = await import('@hydra-engine/native-ggml');
    synth = await import('@hydra-engine/native-ggml/synth');
    native.listDevices();
  } catch (err) {
    const reason = `native addon unavailable: ${(err as Error).message.split('\n')[0]}`;
    if (process.env.HYDRA_REQUIRE_NATIVE === '1') throw err;
    for (const name of ['binding call: model.tokenize', 'one decode step, tiny q4_0'])
      skipped.push({ name, reason });
    return [];
  }
  const dir = mkdtempSync(join(tmpdir(), 'hydra-micro-'));
  const figures: Figure[] = [];
  try {
    const modelPath = join(dir, 'tiny-q4_0.gguf');
    await synth.writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q4_0', seed: 1, out: modelPath });
    const threads = Math.min(4, availableParallelism());
    notes.model = 'synthetic llama tiny q4_0 (seed 1)';
    notes.threads = threads;

    const model = await native.Model.load({ path: modelPath, nGpuLayers: 0 });
    const text = 'hello world, the quick brown fox jumps over the lazy dog';
    const bench = new Bench({ time: TIME_MS, warmupTime: 200, retainSamples: true });
    let sink = 0;
    bench
      .add('tokenize', () => {
        sink += model.tokenize(text).length;
      })
      .add('listDevices', () => {
        sink += native.listDevices().length;
      });
    const tasks = await bench.run();
    if (sink === 0) throw new Error('binding bench: nothing tokenized');
    figures.push(
      makeFigure({
        name: 'binding call: model.tokenize (12 words)',
        unit: 'ns',
        samples: samplesOf(tasks[0]),
        anchor: { name: 'no-op N-API call: listDevices()', unit: 'ns', samples: samplesOf(tasks[1]) },
      }),
    );

    // One decode step = one native ctx.decode of one token with greedy sampling, positions 0..15 as
    // llama-bench's tg16 (which the anchor runs on the same file with the same thread count).
    const ctx = await model.createContext({
      nCtx: 256,
      nBatch: 64,
      nSeqMax: 1,
      nThreads: threads,
      nThreadsBatch: threads,
    });
    const sampler = model.createSampler({ temp: 0 });
    const stepMs: number[] = [];
    const deadline = performance.now() + TIME_MS * 2;
    for (let round = 0; round < 2 || (performance.now() < deadline && round < 200); round++) {
      ctx.removeSequence(0);
      let token = model.tokenize('hello')[0] ?? 1;
      for (let pos = 0; pos < 16; pos++) {
        const t0 = performance.now();
        const out = await ctx.decode([{ seq: 0, pos, tokens: [token], sampler }]);
        const dt = performance.now() - t0;
        if (round > 0) stepMs.push(dt); // round 0 warms up, as llama-bench does
        token = out.tokens[0] ?? token;
      }
    }
    sampler.dispose();
    await ctx.dispose();
    model.dispose();

    const bench16 = findTool('llama-bench');
    if (!bench16) {
      skipped.push({ name: 'one decode step, tiny q4_0', reason: 'llama-bench not built' });
    } else {
      const out = execFileSync(
        bench16,
        [
          '-m',
          modelPath,
          '-p',
          '0',
          '-n',
          '16',
          '-r',
          '10',
          '-t',
          String(threads),
          '-ngl',
          '0',
          '-o',
          'json',
        ],
        {
          encoding: 'utf8',
          stdio: ['ignore', 'pipe', 'ignore'],
          timeout: 120_000,
        },
      );
      const rows = JSON.parse(out) as { n_gen: number; samples_ts: number[] }[];
      const tg = rows.find((r) => r.n_gen === 16);
      if (!tg) throw new Error('llama-bench gave no tg16 row');
      figures.push(
        makeFigure({
          name: 'one decode step, tiny q4_0 (ctx.decode, greedy)',
          unit: 'ms',
          samples: stepMs,
          anchor: {
            name: 'llama-bench -p 0 -n 16, same file and threads (1000 / t/s)',
            unit: 'ms',
            samples: tg.samples_ts.map((ts) => 1000 / ts),
          },
        }),
        makeFigure({
          name: 'decode tok/s, tiny q4_0 (ctx.decode, greedy)',
          unit: 'tok/s',
          samples: stepMs.map((ms) => 1000 / ms),
          anchor: {
            name: 'llama-bench tg16 t/s, same file and threads',
            unit: 'tok/s',
            samples: tg.samples_ts,
          },
        }),
      );
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return figures;
}

async function main(): Promise<void> {
  const started = new Date();
  const skipped: Skipped[] = [];
  const notes: Record<string, unknown> = { time_ms_per_task: TIME_MS };
  console.error('micro: frame codec');
  const figures = await codecFigures();
  console.error('micro: binding call and decode step');
  figures.push(...(await nativeFigures(skipped, notes)));
  const path = writeResult(newResult('micro', figures, skipped, notes, started));
  for (const f of figures) {
    const ratio = f.ratio === null ? '' : `  x${f.ratio.toFixed(2)} of ${f.anchor?.name}`;
    console.log(
      `${f.name}: median ${f.median.toPrecision(4)} ${f.unit}, p99 ${f.p99.toPrecision(4)}${ratio}`,
    );
  }
  for (const s of skipped) console.log(`skipped ${s.name}: ${s.reason}`);
  console.log(`wrote ${path}`);
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
