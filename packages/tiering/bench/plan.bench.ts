/**
 * Plans per second for a 60-key CONFIGURE delta. There is no upstream equivalent (llama.cpp has no
 * runtime reconfigure), so the anchor is a structuredClone of the same delta in the same run: the
 * cheapest thing that still touches every key and value once.
 */
import { execSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Bench, type Task } from 'tinybench';
import { defaults, FIELDS, type FieldSpec, isRuntimeField, type Params, plan } from '../src/index.js';

const FORMATTED: Record<string, unknown> = {
  rpc_servers: ['10.0.0.2:50052'],
  override_tensors: ['blk\\..*\\.ffn_.*_exps\\.weight=RPC0', 'token_embd=CPU'],
  kv_overrides: ['tokenizer.ggml.add_bos_token=bool:false'],
  tensor_split: [25, 40],
  'sampling.logit_bias': { '15043': -1.5 },
  'sampling.samplers': ['top_k', 'temperature'],
  'sampling.grammar': 'root ::= [a-z]+',
};

/** A valid value that differs from the default, so every key of the delta is a change. */
function changed(spec: FieldSpec): unknown {
  if (spec.key in FORMATTED) return FORMATTED[spec.key];
  const t = spec.type;
  const d = spec.default;
  switch (t.kind) {
    case 'int':
      return (d as number) + 1 <= t.max ? (d as number) + 1 : (d as number) - 1;
    case 'number':
      return ((d as number) + ((d as number) + 0.5 <= t.max ? 0.5 : -0.5)) as number;
    case 'bool':
      return !d;
    case 'string':
      return `${d as string}x`;
    case 'enum':
      return t.values[(t.values.indexOf(d as string) + 1) % t.values.length];
    case 'list':
      return t.of.kind === 'enum' ? [t.of.values[1]] : t.of.kind === 'string' ? ['x'] : [1];
    case 'map':
      return { k: 'v' };
  }
}

// 60 fields spread over the registry so all three runtime tiers are in the delta.
const runtime = FIELDS.filter(isRuntimeField);
const stride = runtime.length / 60;
const delta: Params = {};
for (let i = 0; i < 60; i++) {
  const spec = runtime[Math.floor(i * stride)]!;
  delta[spec.key] = changed(spec);
}
const applied = defaults();
const check = plan(applied, delta);
if (Object.keys(delta).length !== 60 || check.changes.length !== 60 || check.tier !== 'T3') {
  throw new Error(`bench delta is not 60 changes across tiers: ${check.changes.length} ${check.tier}`);
}

const bench = new Bench({ name: 'tiering plan', time: 2000, warmupTime: 500 });
bench.add('plan, 60-key delta', () => {
  plan(applied, delta);
});
bench.add('structuredClone, same 60-key delta (anchor)', () => {
  structuredClone(delta);
});
await bench.run();

function stats(task: Task | undefined) {
  const r = task?.result;
  if (r === undefined || !('latency' in r)) throw new Error(`task ${task?.name} did not complete`);
  return r;
}
const planR = stats(bench.getTask('plan, 60-key delta'));
const anchorR = stats(bench.getTask('structuredClone, same 60-key delta (anchor)'));
const anchorNote = 'structuredClone of the same 60-key delta, same run (no upstream equivalent)';
const ns = (ms: number) => Math.round(ms * 1e6);
const figures = [
  {
    name: 'plan throughput, 60-key delta',
    unit: 'plans/s',
    samples: planR.throughput.samplesCount,
    median: Math.round(planR.throughput.p50),
    p99: Math.round(planR.throughput.p99),
    mean: Math.round(planR.throughput.mean),
    anchor: {
      name: anchorNote,
      unit: 'clones/s',
      median: Math.round(anchorR.throughput.p50),
      ratio: planR.throughput.p50 / anchorR.throughput.p50,
    },
  },
  {
    name: 'plan latency, 60-key delta',
    unit: 'ns',
    samples: planR.latency.samplesCount,
    median: ns(planR.latency.p50),
    p99: ns(planR.latency.p99),
    mean: ns(planR.latency.mean),
    anchor: {
      name: anchorNote,
      unit: 'ns',
      median: ns(anchorR.latency.p50),
      ratio: planR.latency.p50 / anchorR.latency.p50,
    },
  },
  {
    name: 'structuredClone latency, 60-key delta (the anchor)',
    unit: 'ns',
    samples: anchorR.latency.samplesCount,
    median: ns(anchorR.latency.p50),
    p99: ns(anchorR.latency.p99),
    mean: ns(anchorR.latency.mean),
    anchor: null,
  },
];

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../../../..');
let commit = 'unknown';
try {
  commit = execSync('git rev-parse HEAD', { cwd: root, encoding: 'utf8' }).trim();
} catch {}
const cpus = os.cpus();
const out = {
  name: 'tiering-plan',
  commit,
  machine: {
    cpu: cpus[0]?.model ?? 'unknown',
    cores: cpus.length,
    os: `${os.type()} ${os.release()}`,
    node: process.version,
  },
  date: new Date().toISOString(),
  figures,
};
const file = resolve(root, 'benchmarks/results/tiering-plan.json');
mkdirSync(dirname(file), { recursive: true });
writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
console.table(bench.table());
console.log(
  `plan: ${figures[0]!.median} plans/s median (anchor ${figures[0]!.anchor!.median} clones/s); wrote ${file}`,
);
