import { existsSync } from 'node:fs';
import { fitToWire, formatFitTable, modelFactsFromGguf, planFit } from '@hydra-engine/resolver';
import { badArgument, scanArgv } from './args/argv.js';
import { HydraError } from './errors.js';
import { readGgufFile } from './placement.js';
import { sseData } from './sse.js';

type Io = { stdout: { write(t: string): unknown }; stderr: { write(t: string): unknown } };

/** One flag of a tool command: its names (the last one keys it), and how it takes a value. */
interface ToolFlag {
  names: readonly string[];
  takes: 'value' | 'none' | 'repeat';
}

/** A tool's flags as given: by the flag's last name, the name used and every value (`true` for a switch). */
type ToolFlags = Map<string, { name: string; values: string[] }>;

function takeFlags(argv: readonly string[], table: readonly ToolFlag[]): ToolFlags {
  const out: ToolFlags = new Map();
  const hits = scanArgv(
    argv,
    (name) => table.find((f) => f.names.includes(name)),
    (f) => ({ takes: f.takes === 'none' ? 'none' : 'value' }),
    (name) => badArgument(name, `unknown flag ${name}`),
  );
  for (const { flag, name, raw } of hits) {
    if (raw === '') throw badArgument(name, `${name} needs a value`);
    const key = flag.names.at(-1)!;
    const seen = out.get(key);
    if (seen && flag.takes !== 'repeat') throw badArgument(name, `${name} given twice`);
    if (seen) seen.values.push(raw!);
    else out.set(key, { name, values: [raw ?? 'true'] });
  }
  return out;
}

function intFlag(flags: ToolFlags, key: string, fallback: number, min = 0): number {
  const given = flags.get(key);
  if (given === undefined) return fallback;
  const raw = given.values[0]!;
  if (!/^-?\d+$/.test(raw) || Number(raw) < min)
    throw badArgument(given.name, `${given.name} must be an integer >= ${min}, got ${raw}`);
  return Number(raw);
}

const PLAN_HELP = `hydra-engine plan --model FILE --device NAME=FREE_MIB [--device ...] [options]

Predicts, from the GGUF header alone, where llama.cpp puts each layer and what every device must
hold (weights, KV cache, recurrent state, compute buffer) against its free memory. Devices are
given in llama.cpp's order (RPC devices first, the local one last). Exits 0 when the plan fits,
1 when it does not, 2 on a usage error.

  -m, --model FILE            the GGUF to plan
  --device NAME=FREE_MIB      a device and its free memory in MiB (repeatable, in order)
  -c, --ctx N                 context size (default 4096)
  --cache-type-k T            KV cache type of K (default f16)
  --cache-type-v T            KV cache type of V (default f16)
  -np, --parallel N           sequences (default 1)
  -ub, --ubatch-size N        tokens per compute step, which sizes the compute buffer (default 512)
  -fa, --flash-attn on|off|auto  flash attention (auto is planned as on); without it the compute
                              buffer holds every head's scores (default on)
  -ngl, --n-gpu-layers N|auto layers offloaded, counting the output layer (default all)
  -ts, --tensor-split A,B|auto split proportions, or the split with the most layers on --fit-prefer
  --fit-target MIB            MiB each device keeps free beyond the plan (default 0)
  --fit-prefer NAME           the device auto favours (default the last one)
  --device-memory-cap NAME=MIB plan at most this much on a device (repeatable)
  --kv-placement layer|rounded-fraction  KV with its layer (the pinned llama.cpp), or round(f x n)
  --json                      the plan as JSON (sizes in bytes)
  -h, --help                  this text
`;

function mibPair(flag: string, v: string): [string, number] {
  const m = /^([^=]+)=(\d+(?:\.\d+)?)$/.exec(v);
  if (!m)
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `${flag} must be NAME=MIB, got ${v}`, { keys: [flag] });
  return [m[1]!, Math.round(Number(m[2]) * 1024 * 1024)];
}

/**
 * `hydra-engine plan`: the resolver's fit verdict for a GGUF over named devices, as a table or
 * JSON. Resolves with the exit code: 0 when it fits, 1 when it does not.
 */
export async function runPlan(argv: readonly string[], io: Io): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    io.stdout.write(PLAN_HELP);
    return 0;
  }
  const flags = takeFlags(argv, [
    { names: ['-m', '--model'], takes: 'value' },
    { names: ['--device'], takes: 'repeat' },
    { names: ['-c', '--ctx'], takes: 'value' },
    { names: ['--cache-type-k'], takes: 'value' },
    { names: ['--cache-type-v'], takes: 'value' },
    { names: ['-np', '--parallel'], takes: 'value' },
    { names: ['-ub', '--ubatch-size'], takes: 'value' },
    { names: ['-fa', '--flash-attn'], takes: 'value' },
    { names: ['-ngl', '--n-gpu-layers'], takes: 'value' },
    { names: ['-ts', '--tensor-split'], takes: 'value' },
    { names: ['--fit-target'], takes: 'value' },
    { names: ['--fit-prefer'], takes: 'value' },
    { names: ['--device-memory-cap'], takes: 'repeat' },
    { names: ['--kv-placement'], takes: 'value' },
    { names: ['--json'], takes: 'none' },
  ]);
  const value = (key: string) => flags.get(key)?.values[0];
  const model = value('--model');
  if (!model)
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'plan needs --model FILE', { keys: ['--model'] });
  if (!existsSync(model))
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `no such model file: ${model}`, { keys: ['--model'] });
  const caps = new Map(
    (flags.get('--device-memory-cap')?.values ?? []).map((c) => mibPair('--device-memory-cap', c)),
  );
  const devices = (flags.get('--device')?.values ?? []).map((d) => {
    const [name, freeBytes] = mibPair('--device', d);
    const cap = caps.get(name);
    return { name, freeBytes, ...(cap !== undefined ? { capBytes: cap } : {}) };
  });
  if (devices.length === 0)
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'plan needs at least one --device NAME=FREE_MIB', {
      keys: ['--device'],
    });
  for (const name of caps.keys()) {
    if (!devices.some((d) => d.name === name))
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `--device-memory-cap names no --device: ${name}`, {
        keys: ['--device-memory-cap'],
      });
  }
  const facts = modelFactsFromGguf(await readGgufFile(model));
  const ts = value('--tensor-split');
  const ngl = value('--n-gpu-layers');
  const numbers = (flag: string, raw: string) => {
    const parts = raw.split(/[,/]/).map(Number);
    if (parts.some((x) => !Number.isFinite(x)))
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `${flag} must be numbers A,B,... or auto, got ${raw}`, {
        keys: [flag],
      });
    return parts;
  };
  let nGpuLayers: number | 'auto' | undefined;
  if (ngl === 'auto') nGpuLayers = 'auto';
  else if (ngl === 'all') nGpuLayers = -1;
  else if (ngl !== undefined) nGpuLayers = intFlag(flags, '--n-gpu-layers', -1, -1);
  const placement = value('--kv-placement');
  if (placement !== undefined && placement !== 'layer' && placement !== 'rounded-fraction')
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', '--kv-placement must be layer or rounded-fraction', {
      keys: ['--kv-placement'],
    });
  const prefer = value('--fit-prefer');
  const fa = value('--flash-attn');
  // auto is planned as on, as the engine plans a load (placement.ts).
  if (fa !== undefined && fa !== 'on' && fa !== 'off' && fa !== 'auto')
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', '--flash-attn must be on, off or auto', {
      keys: ['--flash-attn'],
    });
  const fit = planFit(facts, {
    devices,
    nCtx: intFlag(flags, '--ctx', 4096, 1),
    nParallel: intFlag(flags, '--parallel', 1, 1),
    nUbatch: intFlag(flags, '--ubatch-size', 512, 1),
    flashAttn: fa !== 'off',
    marginBytes: intFlag(flags, '--fit-target', 0, 0) * 1024 * 1024,
    ...(flags.has('--cache-type-k') ? { cacheTypeK: value('--cache-type-k')! } : {}),
    ...(flags.has('--cache-type-v') ? { cacheTypeV: value('--cache-type-v')! } : {}),
    ...(ts
      ? { tensorSplit: ts === 'auto' ? ('auto' as const) : numbers(flags.get('--tensor-split')!.name, ts) }
      : {}),
    ...(nGpuLayers !== undefined ? { nGpuLayers } : {}),
    ...(placement ? { kvPlacement: placement } : {}),
    ...(prefer ? { prefer } : {}),
  });
  io.stdout.write(flags.has('--json') ? `${JSON.stringify(fitToWire(fit))}\n` : formatFitTable(fit));
  return fit.fits ? 0 : 1;
}

/** Figures of one `bench-client` run. */
export interface BenchResult {
  requests: number;
  concurrency: number;
  completionTokens: number;
  seconds: number;
  tokensPerSecond: number;
  perStreamTokensPerSecond: number;
  ttftMsMedian: number;
}

/** Streams one completion; returns tokens (SSE chunks with text) and time to the first one. */
async function streamOne(
  url: string,
  body: object,
  apiKey?: string,
): Promise<{ tokens: number; ttftMs: number; ms: number }> {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
  });
  if (!res.ok || !res.body)
    throw new HydraError('HYDRA_ERR_BAD_REQUEST', `engine answered ${res.status}: ${await res.text()}`);
  let ttft = -1;
  let tokens = 0;
  for await (const data of sseData(res.body as unknown as AsyncIterable<Uint8Array>)) {
    const obj = JSON.parse(data) as { usage?: { completion_tokens: number }; choices: { text?: string }[] };
    if (obj.usage) tokens = obj.usage.completion_tokens;
    else if (ttft < 0 && obj.choices[0]?.text) ttft = performance.now() - t0;
  }
  return { tokens, ttftMs: ttft, ms: performance.now() - t0 };
}

const BENCH_HELP = `hydra-engine bench-client [options]

Streams completions from a running engine's HTTP API and prints tokens/s.

  --url URL            the engine (default http://127.0.0.1:8080)
  --requests N         completions in all (default 8)
  --concurrency N      completions at once (default 4)
  --max-tokens N       tokens per completion (default 64)
  --prompt TEXT        the prompt
  --api-key KEY        sent as a Bearer token
  --json               the figures as JSON
  -h, --help           this text
`;

/** `hydra-engine bench-client`: drives an engine's HTTP API and prints tokens/s (undefined after --help). */
export async function runBenchClient(argv: readonly string[], io: Io): Promise<BenchResult | undefined> {
  if (argv.includes('--help') || argv.includes('-h')) {
    io.stdout.write(BENCH_HELP);
    return undefined;
  }
  const flags = takeFlags(argv, [
    { names: ['--url'], takes: 'value' },
    { names: ['--requests'], takes: 'value' },
    { names: ['--concurrency'], takes: 'value' },
    { names: ['--max-tokens'], takes: 'value' },
    { names: ['--prompt'], takes: 'value' },
    { names: ['--api-key'], takes: 'value' },
    { names: ['--json'], takes: 'none' },
  ]);
  const url = (flags.get('--url')?.values[0] ?? 'http://127.0.0.1:8080').replace(/\/+$/, '');
  const requests = intFlag(flags, '--requests', 8, 1);
  const concurrency = intFlag(flags, '--concurrency', 4, 1);
  const maxTokens = intFlag(flags, '--max-tokens', 64, 1);
  const prompt = flags.get('--prompt')?.values[0] ?? 'Once upon a time, in a land far away, there was a';
  const apiKey = flags.get('--api-key')?.values[0];
  const body = { prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true };
  let next = 0;
  const runs: { tokens: number; ttftMs: number; ms: number }[] = [];
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: Math.min(concurrency, requests) }, async () => {
      while (next < requests) {
        next++;
        runs.push(await streamOne(url, body, apiKey));
      }
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  const completionTokens = runs.reduce((s, r) => s + r.tokens, 0);
  const ttfts = runs.map((r) => r.ttftMs).sort((a, b) => a - b);
  const result: BenchResult = {
    requests,
    concurrency,
    completionTokens,
    seconds: Number(seconds.toFixed(3)),
    tokensPerSecond: Number((completionTokens / seconds).toFixed(1)),
    perStreamTokensPerSecond: Number(
      (runs.reduce((s, r) => s + (r.tokens * 1000) / Math.max(r.ms - r.ttftMs, 1), 0) / runs.length).toFixed(
        1,
      ),
    ),
    ttftMsMedian: Number((ttfts[Math.floor(ttfts.length / 2)] ?? 0).toFixed(1)),
  };
  io.stdout.write(
    flags.has('--json')
      ? `${JSON.stringify(result)}\n`
      : `bench-client: ${requests} requests, concurrency ${concurrency}: ${completionTokens} tokens in ${result.seconds} s = ` +
          `${result.tokensPerSecond} tok/s (per stream ${result.perStreamTokensPerSecond} tok/s, median TTFT ${result.ttftMsMedian} ms)\n`,
  );
  return result;
}
