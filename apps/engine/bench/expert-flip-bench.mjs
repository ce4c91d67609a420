// MoE expert placement flip (SET_EXPERT_MODE) against a full T3 reload of the same model, same run.
// A head engine loads the tiny synthetic MoE model with the stock ggml-rpc-server as its peer
// (both placements resident); 50 flips idle, 50 flips while a greedy stream runs (the slot's KV is
// copied between the contexts), and 5 full reloads as the anchor. Run after `pnpm run build:ts`:
//   node bench/expert-flip-bench.mjs [--out ../../benchmarks/results/engine-expert-flip.json]
import { execSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { probeRpcServer } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { parseServeArgs, startEngine } from '../dist/index.js';
import { freePort, summary } from './figures.mjs';

const outArg = process.argv.indexOf('--out');
const out = resolve(
  outArg > 0
    ? process.argv[outArg + 1]
    : new URL('../../../benchmarks/results/engine-expert-flip.json', import.meta.url).pathname,
);
const RPC_SERVER = new URL('../../../packages/native-ggml/build/bin/ggml-rpc-server', import.meta.url)
  .pathname;

const dir = mkdtempSync(join(tmpdir(), 'hydra-flip-bench-'));
const moe = join(dir, 'moe.gguf');
await writeSyntheticModel({ arch: 'moe', shape: 'tiny', quant: 'q8_0', seed: 4, out: moe });
const port = await freePort();
const endpoint = `127.0.0.1:${port}`;
const server = spawn(RPC_SERVER, ['-p', String(port), '-t', '1'], { stdio: 'ignore' });
for (let i = 0; ; i++) {
  try {
    await probeRpcServer(endpoint, 500);
    break;
  } catch (err) {
    if (i > 50) throw err;
    await new Promise((r) => setTimeout(r, 100));
  }
}
const head = await startEngine(
  parseServeArgs(['--port', '0', '--progress', 'off', '-t', '1', '-c', '2048', '-m', moe, '--rpc', endpoint]),
  { log: { write: () => true } },
);
await head.loaded;
if (!head.engine.dualPlacement) throw new Error('the head did not keep both placements');
const url = `http://127.0.0.1:${head.httpPort}`;
const flip = async (i) => {
  const t0 = performance.now();
  const r = await head.controller.setExpertMode({ mode: i % 2 === 0 ? 'solo' : 'combined' });
  if (r.reloaded !== false) throw new Error('reloaded');
  return performance.now() - t0;
};

const reloads = [];
for (let i = 0; i < 5; i++) {
  const t0 = performance.now();
  await head.engine.load();
  reloads.push(performance.now() - t0);
}
const anchorFig = summary('full T3 reload of the same model (both placements)', 'ms', reloads);
const anchor = { name: anchorFig.name, median: anchorFig.median, p99: anchorFig.p99 };

for (let i = 0; i < 10; i++) await flip(i);
const idle = [];
for (let i = 0; i < 50; i++) idle.push(await flip(i));

const busy = [];
const gen = fetch(`${url}/v1/completions`, {
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ prompt: 'Hello world', max_tokens: 1500, temperature: 0, ignore_eos: true }),
}).then((r) => r.json());
while (head.engine.slots.busy === 0) await new Promise((r) => setTimeout(r, 1));
for (let i = 0; busy.length < 50 && head.engine.slots.busy > 0; i++) busy.push(await flip(i));
await gen;
await head.close();
server.kill('SIGKILL');

const commit = execSync('git rev-parse --short HEAD', { encoding: 'utf8' }).trim();
const result = {
  name: 'engine-expert-flip',
  commit,
  machine: { cpu: cpus()[0]?.model ?? 'unknown', cores: cpus().length, node: process.version },
  date: new Date().toISOString(),
  figures: [
    summary('SET_EXPERT_MODE flip, idle (tiny MoE q8_0, stock ggml-rpc-server peer)', 'ms', idle, anchor),
    summary('SET_EXPERT_MODE flip, one slot generating (KV copied)', 'ms', busy, anchor),
    anchorFig,
  ],
};
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, `${JSON.stringify(result, null, 2)}\n`);
for (const f of result.figures)
  console.log(
    `${f.name}: median ${f.median.toFixed(3)} ms, p99 ${f.p99.toFixed(3)} ms (${f.samples} samples)`,
  );
