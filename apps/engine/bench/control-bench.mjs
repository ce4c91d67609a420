// Control-plane latency: T1 CONFIGURE and STATUS round trips over the merged port (JSON), the time
// from a T3 CONFIGURE to `ready` for the tiny model, and a bare HydraPort STATUS handler returning
// a constant (same run) as the anchor. Run after `pnpm run build:ts`:
//   node bench/control-bench.mjs [--out ../../benchmarks/results/engine-control.json]
import { execSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { HydraClient, HydraPort } from '@hydra-engine/hydra-rpc';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { parseServeArgs, startEngine } from '../dist/index.js';
import { freePort, summary } from './figures.mjs';

const outArg = process.argv.indexOf('--out');
const out = resolve(
  outArg > 0
    ? process.argv[outArg + 1]
    : new URL('../../../benchmarks/results/engine-control.json', import.meta.url).pathname,
);
const N = 2000;
const WARM = 200;

async function roundTrips(fn) {
  for (let i = 0; i < WARM; i++) await fn(i);
  const samples = [];
  for (let i = 0; i < N; i++) {
    const t0 = performance.now();
    await fn(i);
    samples.push((performance.now() - t0) * 1000);
  }
  return samples;
}

// Anchor: a bare port whose STATUS handler returns a constant.
const bare = new HydraPort({
  handlers: { STATUS: () => ({ state: 'ready', epoch: 0 }) },
  logger: { info() {}, warn() {}, error() {} },
});
const { port: barePort } = await bare.listen();
const bc = await HydraClient.connect({ port: barePort });
const anchorSamples = await roundTrips(() => bc.status());
bc.close();
await bare.close();
const anchor = summary('bare HydraPort STATUS (constant handler)', 'us', anchorSamples);

const dir = mkdtempSync(join(tmpdir(), 'hydra-control-bench-'));
const model = join(dir, 'tiny.gguf');
await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3, out: model });
const rpcPort = await freePort();
const eng = await startEngine(
  parseServeArgs([
    '--port',
    '0',
    '--progress',
    'off',
    '-t',
    '1',
    '-m',
    model,
    '-c',
    '1024',
    '-np',
    '2',
    '--rpc-port',
    String(rpcPort),
  ]),
  { log: { write: () => true } },
);
await eng.loaded;
const c = await HydraClient.connect({ port: rpcPort });
const status = summary('STATUS round trip (engine)', 'us', await roundTrips(() => c.status()), anchor);
const t1 = summary(
  'T1 CONFIGURE round trip (sampling.temp alternating)',
  'us',
  await roundTrips((i) => c.configure({ 'sampling.temp': i % 2 ? 0.5 : 0.7 })),
  anchor,
);
const reloads = [];
for (let i = 0; i < 20; i++) {
  const t0 = performance.now();
  const r = await c.configure({ use_mmap: i % 2 !== 0 });
  if (r.tier !== 'T3' || eng.engine.state !== 'ready')
    throw new Error(`unexpected ${JSON.stringify(r)} ${eng.engine.state}`);
  reloads.push(performance.now() - t0);
}
const t3 = summary('T3 CONFIGURE to ready (tiny q8_0 reload, use_mmap toggled)', 'ms', reloads);
c.close();
await eng.close();

let commit = 'unknown';
try {
  commit = execSync('git rev-parse --short HEAD', { encoding: 'utf8' }).trim();
} catch {}
const result = {
  name: 'engine-control',
  commit,
  machine: { cpu: cpus()[0]?.model ?? 'unknown', cores: cpus().length, node: process.version },
  date: new Date().toISOString(),
  figures: [status, t1, t3, anchor],
};
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, `${JSON.stringify(result, null, 2)}\n`);
for (const f of result.figures)
  console.log(
    `${f.name}: median ${f.median.toFixed(1)} ${f.unit}, p99 ${f.p99.toFixed(1)} ${f.unit}, mean ${f.mean.toFixed(1)} ${f.unit}`,
  );
console.log(`wrote ${out}`);
