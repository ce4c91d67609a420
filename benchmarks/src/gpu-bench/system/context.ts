import { execFileSync } from 'node:child_process';
import { join, resolve } from 'node:path';
import { planSyntheticModel, SYNTH_ARCH_SHAPES, type SynthShape } from '@hydra-engine/native-ggml/synth';
import type { Figure } from '../../schema.js';
import {
  badFlag,
  choiceOf,
  type FlagTable,
  type FlagValue,
  type Harness,
  type LlamaBenchResult,
  type Locations,
  localDevice,
  parseListDevices,
  parseLlamaBenchJson,
  postJson,
  read,
  runTool,
  type Server,
  sseEvents,
  startEngine,
  toolPath,
  usageOf,
} from '../harness/index.js';

export const PARTS = ['synth', 'solo', 'rpc', 'combine', 'boot', 'control', 'switch', 'load'] as const;
export type PartName = (typeof PARTS)[number];

export const USAGE = `usage: node benchmarks/gpu/run.mjs [--only ${PARTS.join(',')}] [--shapes 8b,27b] [--moe-shape 8b]
  [--hybrid-shapes qwen35-27b,qwen35moe-35b-a3b]
  [--rpc-shape 8b] [--combine-shapes 8b] [--peer-gpu N] [--load-shape 27b] [--reps 3] [--ngl 99] [--models DIR] [--tools DIR] [--out DIR]
  [--bandwidth-gbs N] [--budget-s 570] [--cold-reps 1] [--dry-run]`;

export interface SystemOptions {
  only: PartName[];
  shapes: string[];
  moeShape: string;
  /** Hybrid (recurrent + attention) models for synth and solo, as `<arch>-<shape>`; none by default. */
  hybridShapes: HybridModel[];
  rpcShape: string;
  combineShapes: string[];
  peerGpu: number | undefined;
  loadShape: string;
  reps: number;
  coldReps: number;
  ngl: number;
  models: string | undefined;
  tools: string | undefined;
  out: string | undefined;
  bandwidthGbs: number | undefined;
  budgetS: number;
  dryRun: boolean;
}

export const DEFAULTS: SystemOptions = {
  only: [...PARTS],
  shapes: ['8b', '27b'],
  moeShape: '8b',
  hybridShapes: [],
  rpcShape: '8b',
  combineShapes: ['8b'],
  peerGpu: undefined,
  loadShape: '27b',
  reps: 3,
  coldReps: 1,
  ngl: 99,
  models: undefined,
  tools: undefined,
  out: undefined,
  bandwidthGbs: undefined,
  budgetS: 570,
  dryRun: false,
};

const path = (v: Parameters<typeof read.string>[0]) => resolve(v.value());

/** The archs a benchmark model is written in: the dense and MoE llama layouts, and the hybrids. */
export type BenchArch = 'llama' | 'moe' | 'qwen35' | 'qwen35moe';
export type HybridModel = readonly ['qwen35' | 'qwen35moe', string];

function readHybrid(v: FlagValue): HybridModel[] {
  return read.list(v).map((item) => {
    const m = /^(qwen35moe|qwen35)-(.+)$/.exec(item);
    const arch = m?.[1] as 'qwen35' | 'qwen35moe' | undefined;
    if (!arch || !m?.[2] || !(SYNTH_ARCH_SHAPES[arch] as readonly string[]).includes(m[2]))
      throw badFlag(
        v.flag,
        `unknown ${item} (one of ${(['qwen35', 'qwen35moe'] as const).flatMap((a) => SYNTH_ARCH_SHAPES[a].map((s) => `${a}-${s}`)).join(',')})`,
      );
    return [arch, m[2]] as const;
  });
}

export const FLAGS: FlagTable<SystemOptions> = {
  '--only': ['only', read.oneOf(PARTS)],
  '--shapes': ['shapes', read.list],
  '--moe-shape': ['moeShape', read.string],
  '--hybrid-shapes': ['hybridShapes', readHybrid],
  '--rpc-shape': ['rpcShape', read.string],
  '--peer-gpu': ['peerGpu', read.int(0)],
  '--combine-shapes': ['combineShapes', read.list],
  '--load-shape': ['loadShape', read.string],
  '--reps': ['reps', (v) => Math.max(1, read.int(0)(v))],
  '--cold-reps': ['coldReps', read.int(0)],
  '--ngl': ['ngl', read.int(0)],
  '--models': ['models', path],
  '--tools': ['tools', path],
  '--out': ['out', path],
  '--bandwidth-gbs': ['bandwidthGbs', read.positiveNumber],
  '--budget-s': ['budgetS', read.int(0)],
};

/** The notes of a `gpu` results file (benchmarks/README.md). */
export interface SystemNotes {
  parts: PartName[];
  tools: string | undefined;
  engine: string | undefined;
  reps: number;
  ngl: number;
  models: Record<string, { bytes: number; params: number; synth_seconds: number }>;
  bandwidth?: { value: number; source: string } | string;
  rpc?: { model: string; local_device: string | null; client: string };
  combine?: { local_device: string; peer_gpu: number | 'shared'; placements: Record<string, unknown> };
  cold_method?: string;
  [key: string]: unknown;
}

/** One system benchmark run: what every part of run.mjs shares. */
export class SystemContext {
  readonly h: Harness<Figure>;
  readonly opts: SystemOptions;
  readonly loc: Locations;
  readonly notes: SystemNotes;
  readonly modelsDir: string;
  /** The addon the engines load (HYDRA_NATIVE_ADDON, else hydra_ggml.node of the tools folder). */
  readonly addon: string | undefined;

  constructor(h: Harness<Figure>, opts: SystemOptions, loc: Locations, notes: SystemNotes) {
    this.h = h;
    this.opts = opts;
    this.loc = loc;
    this.notes = notes;
    this.modelsDir = opts.models ?? join(loc.root, 'models/bench');
    this.addon =
      process.env.HYDRA_NATIVE_ADDON ?? (loc.toolsDir ? join(loc.toolsDir, 'hydra_ggml.node') : undefined);
  }

  tool(name: string): string {
    return toolPath(this.loc.toolsDir, name);
  }

  modelPath(arch: string, shape: string): string {
    return join(this.modelsDir, `${arch}-${shape}-q4_0.gguf`);
  }

  /** `llama-bench ... -o json`: per-repetition tok/s of its prefill and decode tests. */
  async llamaBench(
    args: readonly string[],
    timeoutMs: number,
    env: Record<string, string> = {},
  ): Promise<LlamaBenchResult> {
    const { stdout } = await runTool(this.tool('llama-bench'), [...args, '-o', 'json'], timeoutMs, env);
    return parseLlamaBenchJson(stdout);
  }

  /** The first local device llama-bench lists (CUDA0), undefined on a CPU-only build. */
  async localGpu(): Promise<string | undefined> {
    try {
      const { stdout } = await runTool(this.tool('llama-bench'), ['--list-devices'], 60_000);
      return localDevice(parseListDevices(stdout));
    } catch {
      return undefined;
    }
  }

  /** Starts an engine (`--port P --progress off` + args); resolves once /health says `state`. */
  startEngine(
    args: readonly string[],
    options: { state?: string; timeoutMs?: number; env?: Record<string, string> } = {},
  ): Promise<Server> {
    return startEngine(this.h.processes, this.loc.engineCli, {
      args: (port) => ['--port', String(port), '--progress', 'off', ...args],
      state: options.state ?? 'ready',
      timeoutMs: options.timeoutMs ?? 300_000,
      env: { ...(this.addon ? { HYDRA_NATIVE_ADDON: this.addon } : {}), ...options.env },
    });
  }

  /** The flags every serving engine of these benchmarks gets: one slot, a 4K context, FA on. */
  servingArgs(model: string): string[] {
    return ['-m', model, '-ngl', String(this.opts.ngl), '-fa', 'on', '-c', '4096', '-np', '1'];
  }

  /** Decode tok/s and prefill tok/s of `reps` streams through an engine's HTTP API (after a warm-up). */
  async httpRates(url: string): Promise<{ decode: number[]; prefill: number[] }> {
    await complete(url, promptOf(32, 999), 8); // warm-up, as llama-bench warms up
    const decode: number[] = [];
    const prefill: number[] = [];
    for (let r = 0; r < this.opts.reps; r++) {
      const d = await complete(url, promptOf(16, r), 128);
      decode.push(((d.completion - 1) * 1000) / d.decodeMs);
      const p = await complete(url, promptOf(512, 100 + r), 1);
      prefill.push((p.prompt * 1000) / p.ttftMs);
    }
    return { decode, prefill };
  }
}

const WORDS =
  'the of and to in is that it was for on are with as his they be at one have this from or had by word but what some we can out other were all there when up use your how said an each she which do their time if will way about many then them would write like so these her long make thing see him two has look more day could go come did my sound no most number who over know water than call first people may down side been now find'.split(
    ' ',
  );

/** A prompt of about `n` tokens of the synthetic vocabulary (whole English words are one token each). */
export function promptOf(n: number, salt: number): string {
  const words = [`${WORDS[salt % WORDS.length]}${salt}`];
  for (let i = 0; words.length < n - 2; i++) words.push(WORDS[(i * 7 + salt) % WORDS.length] as string);
  return words.join(' ');
}

/** One streamed completion; returns prompt/completion tokens, ttft and decode ms. */
export async function complete(
  url: string,
  prompt: string,
  maxTokens: number,
): Promise<{ prompt: number; completion: number; ttftMs: number; decodeMs: number }> {
  const t = performance.now();
  const res = await postJson(`${url}/v1/completions`, {
    prompt,
    max_tokens: maxTokens,
    temperature: 0,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  });
  let first: number | undefined;
  let last: number | undefined;
  let usage: ReturnType<typeof usageOf>;
  for await (const ev of sseEvents(res.body as AsyncIterable<Uint8Array>)) {
    usage = usageOf(ev.data) ?? usage;
    if (choiceOf(ev.data)) {
      first ??= ev.at;
      last = ev.at;
    }
  }
  if (!usage) throw new Error('no usage in the stream');
  return {
    prompt: usage.prompt_tokens,
    completion: usage.completion_tokens,
    ttftMs: (first ?? performance.now()) - t,
    decodeMs: (last ?? first ?? 0) - (first ?? 0),
  };
}

/** Bytes read per decoded token: the whole file for dense models, the active experts' share for MoE. */
export function bytesPerToken(arch: BenchArch, shape: string): number {
  const plan = planSyntheticModel({ arch, shape: shape as SynthShape, quant: 'q4_0' });
  const h = plan.hparams;
  if (h.nExpert === 0) return plan.bytes;
  const expertBytes = (3 * h.nLayer * h.nEmbd * h.nFf * h.nExpert * 18) / 32;
  return plan.bytes - expertBytes * (1 - h.nExpertUsed / h.nExpert);
}

export function gpuNames(): string[] {
  try {
    return execFileSync('nvidia-smi', ['--query-gpu=name', '--format=csv,noheader'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    })
      .split('\n')
      .map((s) => s.trim())
      .filter(Boolean);
  } catch {
    return [];
  }
}

export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? Number.NaN;
}
