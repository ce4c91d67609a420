import { writeFileSync } from 'node:fs';
import { cpus, hostname, totalmem } from 'node:os';
import { join } from 'node:path';
import type { Device } from '@hydra-engine/native-ggml';
import type { Skipped } from '../../schema.js';
import {
  choiceOf,
  type FlagTable,
  freeLoopbackPort,
  type Harness,
  type LlamaBenchResult,
  parseLlamaBenchJson,
  postJson,
  type ResultSink,
  read,
  runTool,
  type Server,
  sseEvents,
  startEngine,
  startRpcServer,
  usageOf,
} from '../harness/index.js';

export const USAGE = `usage: node benchmarks/dist/gpu/native-port.cjs --models DIR --out FILE [--only native,http,hello,rpc,memory]
     [--shapes 8b,27b] [--bin packages/native-ggml/build-cuda/bin] [--stock-devices CUDA0] [--memory-ctx 4096,32768]
     [--modes chained,none,...] [--reps 5] [--threads N] [--log-level debug] [--js DIR] [--budget-s 570]`;

export const STEPS = ['native', 'http', 'hello', 'rpc', 'memory'] as const;
export type Step = (typeof STEPS)[number];

export interface NativePortOptions {
  only: Step[];
  memoryCtx: number[];
  shapes: string[];
  models: string;
  bin: string;
  /** The folder of the engine bundle cli.cjs (default: beside this bundle, else apps/engine/dist/cli.js). */
  js: string | undefined;
  reps: number;
  threads: number | undefined;
  modes: string[] | undefined;
  logLevel: 'debug' | 'info' | 'warn' | 'error' | undefined;
  stockDevices: string;
  out: string | undefined;
  budgetS: number;
}

export const DEFAULTS: NativePortOptions = {
  only: ['native', 'http', 'hello', 'rpc'],
  memoryCtx: [4096, 32768],
  shapes: ['8b'],
  models: '/tmp/hydra-models',
  bin: 'packages/native-ggml/build-cuda/bin',
  js: undefined,
  reps: 5,
  threads: undefined,
  modes: undefined,
  logLevel: undefined,
  stockDevices: 'CUDA0',
  out: undefined,
  budgetS: 570,
};

export const FLAGS: FlagTable<NativePortOptions> = {
  '--only': ['only', read.oneOf(STEPS)],
  '--memory-ctx': ['memoryCtx', read.ints(1)],
  '--shapes': ['shapes', read.list],
  '--models': ['models', read.string],
  '--bin': ['bin', read.string],
  '--js': ['js', read.string],
  '--reps': ['reps', read.int(1)],
  '--threads': ['threads', read.int(1)],
  '--modes': ['modes', read.list],
  '--log-level': ['logLevel', (v) => read.oneOf(['debug', 'info', 'warn', 'error'] as const)(v)[0]],
  '--stock-devices': ['stockDevices', read.string],
  '--out': ['out', read.string],
  '--budget-s': ['budgetS', read.int(0)],
};

/** A figure of a native-port results file: anchor and ratio only where there is an anchor. */
export interface NativeFigure {
  name: string;
  unit: string;
  samples: number;
  median: number;
  p99: number;
  mean: number;
  better: 'higher' | 'lower';
  anchor?: { name: string; unit: string; median: number; p99?: number };
  ratio?: number;
}

/** Nearest-rank summary as these runs have always computed it (the upper median of an even count). */
export function nativeFigure(
  name: string,
  unit: string,
  samples: readonly number[],
  anchor?: NativeFigure['anchor'],
): NativeFigure {
  const sorted = [...samples].sort((a, b) => a - b);
  const q = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] as number;
  const mean = samples.reduce((a, b) => a + b, 0) / samples.length;
  const f: NativeFigure = {
    name,
    unit,
    samples: samples.length,
    median: q(0.5),
    p99: q(0.99),
    mean,
    better: unit.includes('/s') ? 'higher' : 'lower',
  };
  if (anchor) {
    f.anchor = anchor;
    f.ratio = f.median / anchor.median;
  }
  return f;
}

export const describeNativeFigure = (f: NativeFigure): string =>
  `${f.name} ${JSON.stringify({ median: f.median, p99: f.p99, anchor: f.anchor?.median, ratio: f.ratio })}`;

/** The head of a native-port results file (suite `gpu-native-port`), its `seconds` set at the end. */
export interface NativePortHeader {
  suite: 'gpu-native-port';
  commit: string;
  date: string;
  machine: Record<string, unknown>;
  seconds?: number;
}

export function nativePortHeader(devices: Device[]): NativePortHeader {
  return {
    suite: 'gpu-native-port',
    commit: process.env.HYDRA_BENCH_COMMIT ?? 'unknown',
    date: new Date().toISOString(),
    machine: {
      cpu: cpus()[0]?.model ?? 'unknown',
      cores: cpus().length,
      memory_gib: Math.round((totalmem() / 2 ** 30) * 10) / 10,
      os: 'linux',
      node: process.version,
      gpus: devices.filter((d) => d.type === 'gpu').map((d) => d.description),
      host: hostname(),
      devices,
    },
  };
}

/** Writes `{...header, figures, notes, skipped (when any), seconds}` to `file` (nothing without --out). */
export function nativePortSink(header: NativePortHeader, file: string | undefined): ResultSink<NativeFigure> {
  return {
    write({ figures, skipped, notes }) {
      if (!file) return undefined;
      const { seconds, ...head } = header;
      const out: Record<string, unknown> = { ...head, figures, notes };
      if (skipped.length > 0) out.skipped = skipped as Skipped[];
      if (seconds !== undefined) out.seconds = seconds;
      writeJson(file, out);
      return file;
    },
  };
}

function writeJson(file: string, value: unknown): void {
  writeFileSync(file, `${JSON.stringify(value, null, 2)}\n`);
}

/** The parts of the split planner's output the memory check compares (resolver's DevicePlan). */
export interface DevicePlanLike {
  weightBytes: number;
  kvBytes: number;
  recurrentBytes: number;
  computeBytes: number;
  [key: string]: unknown;
}

/**
 * The resolver's split planner, handed in by the entry script (benchmarks does not depend on the
 * resolver or the engine: their built output is bundled from the entry).
 */
export interface Planner {
  factsOf(path: string): Promise<unknown>;
  planSplit(
    facts: unknown,
    options: {
      devices: { name: string; freeBytes: number }[];
      nCtx: number;
      cacheTypeK: string;
      cacheTypeV: string;
      nParallel: number;
      nUbatch: number;
      flashAttn: boolean;
      nGpuLayers: number;
    },
  ): { devices: DevicePlanLike[] };
}

/** One native-port run. */
export class NativePortContext {
  readonly h: Harness<NativeFigure>;
  readonly opts: NativePortOptions;
  readonly planner: Planner;
  /** The engine CLI: `--js DIR`/cli.cjs, else found as the other benchmarks find it. */
  readonly engineCli: string | undefined;

  constructor(
    h: Harness<NativeFigure>,
    opts: NativePortOptions,
    planner: Planner,
    engineCli: string | undefined,
  ) {
    this.h = h;
    this.opts = opts;
    this.planner = planner;
    this.engineCli = engineCli;
  }

  tool(name: string): string {
    return join(this.opts.bin, name);
  }

  /** `llama-bench -m model -p 512 -n 128 -o json ...extra`: its pp512 and tg128 tests. */
  async llamaBench(model: string, extra: readonly string[] = []): Promise<LlamaBenchPair> {
    const { stdout } = await runTool(
      this.tool('llama-bench'),
      ['-m', model, '-p', '512', '-n', '128', '-o', 'json', ...extra],
      600_000,
    );
    return pairOf(parseLlamaBenchJson(stdout, { pp: 512, tg: 128 }));
  }

  /** An engine with the model (`-ngl 99 -c 4096 -np 1`, an HTTP and a merged RPC port), once ready. */
  async startEngine(model: string): Promise<Server & { rpcPort: number }> {
    const rpcPort = await freeLoopbackPort();
    const s = await startEngine(this.h.processes, this.engineCli, {
      args: (port) => [
        '-m',
        model,
        '-ngl',
        '99',
        '-c',
        '4096',
        '-np',
        '1',
        '--port',
        String(port),
        '--rpc-port',
        String(rpcPort),
      ],
      timeoutMs: 300_000,
      pollMs: 200,
    });
    return { ...s, rpcPort };
  }

  /** A model-less engine lending its device over its merged port. */
  async startPeer(): Promise<Server & { rpcPort: number }> {
    const rpcPort = await freeLoopbackPort();
    const s = await startEngine(this.h.processes, this.engineCli, {
      args: (port) => ['--port', String(port), '--rpc-port', String(rpcPort)],
      state: 'empty',
      timeoutMs: 60_000,
      pollMs: 200,
    });
    return { ...s, rpcPort };
  }

  startStock(): ReturnType<typeof startRpcServer> {
    return startRpcServer(this.h.processes, this.tool('ggml-rpc-server'), {
      devices: this.opts.stockDevices,
      timeoutMs: 10_000,
    });
  }
}

/** A llama-bench run's pp512 and tg128: median (llama-bench's avg_ts) and samples. */
export interface LlamaBenchPair {
  pp: { median: number; samples: number[] };
  tg: { median: number; samples: number[] };
}

function pairOf(r: LlamaBenchResult): LlamaBenchPair {
  if (r.ppAvg === undefined || r.tgAvg === undefined)
    throw new Error('llama-bench printed no pp512 or tg128 row');
  return { pp: { median: r.ppAvg, samples: r.pp }, tg: { median: r.tgAvg, samples: r.tg } };
}

/**
 * Decode tok/s of one stream: the tokens after the first over the time from the first token's
 * chunk to the chunk that ends the stream (finish_reason), which is sent when the last token is.
 * Counted from usage, not from chunks: the finish chunk carries no token, and a token that ends
 * inside a UTF-8 sequence sends none. Repetition 0 warms up, as llama-bench does.
 */
export async function httpDecode(url: string, reps: number): Promise<number[]> {
  const rates: number[] = [];
  for (let rep = 0; rep <= reps; rep++) {
    const res = await postJson(`${url}/v1/completions`, {
      prompt: 'The history of',
      max_tokens: 128,
      temperature: 0,
      ignore_eos: true,
      stream: true,
      stream_options: { include_usage: true },
    });
    let first = 0;
    let finish = 0;
    let usage: ReturnType<typeof usageOf>;
    for await (const ev of sseEvents(res.body as AsyncIterable<Uint8Array>)) {
      usage = usageOf(ev.data) ?? usage;
      const choice = choiceOf(ev.data);
      if (!choice) continue;
      if (!first) first = ev.at;
      if (choice.finish_reason) finish = ev.at;
    }
    if (!usage || !finish) throw new Error('stream ended without usage or finish_reason');
    if (rep > 0) rates.push((usage.completion_tokens - 1) / ((finish - first) / 1000));
  }
  return rates;
}
