// PLAN's fit against a real load (issue 23): per model, a head engine and model-less peer engines on
// loopback; CONFIGURE loads the model with `tensor_split: "auto"` under a memory cap on one device
// that forces a split, then the bench compares STATUS `memory` (what llama.cpp allocated, per
// device) with the `fit` the CONFIGURE reply planned, per device: weights, KV, compute and the
// whole. Then a split with one layer more on the capped device must be refused with
// HYDRA_ERR_WONT_FIT before anything is unloaded (same epoch, the model still answers).
// Run after `pnpm run build:ts`:
//   node bench/fit-check-bench.mjs [--model GGUF ...] [--peers 1] [--local-device CUDA0|none]
//     [--capped CUDA0] [--cap-share 0.6] [--ctx 4096] [--threads N] [--head-env K=V ...]
//     [--peer-env K=V ...] [--out FILE]
// --local-device none: every layer on the peers (the CPU check: two peers, the last one capped).
// --cap-share: the capped device may hold this share of what the whole model needs there (weights,
// KV, compute, as PLAN predicts it for that device alone). With no --model the tiny synthetic
// model is written and used. From the device bundle (benchmarks/dist/gpu) its sibling cli.cjs.
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { argv, engineCli, envOf, many, one, resultDoc, startEngine } from './figures.mjs';

const CLI = engineCli();

const localDevice = one('--local-device', 'none');
const nPeers = Number(one('--peers', localDevice === 'none' ? '2' : '1'));
const capShare = Number(one('--cap-share', '0.6'));
const nCtx = Number(one('--ctx', '4096'));
const threads = one('--threads');
const out = resolve(one('--out', join(tmpdir(), `fit-check-${Date.now()}.json`)));
if (!(capShare > 0 && capShare < 1)) throw new Error('--cap-share must be in (0, 1)');
if (localDevice === 'none' && nPeers < 2) throw new Error('--local-device none needs --peers 2 or more');
// llama.cpp lists the RPC devices first, in --rpc order, then the local ones.
const devices = [
  ...Array.from({ length: nPeers }, (_, i) => `RPC${i}`),
  ...(localDevice === 'none' ? [] : [localDevice]),
];
const capped = one('--capped', devices.at(-1));
if (!devices.includes(capped)) throw new Error(`--capped ${capped} is not one of ${devices.join(',')}`);

let models = many('--model');
if (models.length === 0) {
  const m = join(mkdtempSync(join(tmpdir(), 'hydra-fit-check-')), 'tiny.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3, out: m });
  models = [m];
}

const engine = (flags, env) => startEngine(CLI, threads ? ['-t', threads, ...flags] : flags, env);

const stop = (child) =>
  new Promise((r) => {
    if (child.exitCode !== null) return r();
    child.once('exit', () => r());
    child.kill('SIGTERM');
    setTimeout(() => child.kill('SIGKILL'), 10_000).unref();
  });

async function post(url, path, body) {
  const r = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return r.json();
}

const planned = (d) => ({
  weights: d.weight_bytes,
  kv: d.kv_bytes + d.recurrent_bytes,
  compute: d.compute_bytes,
  total: d.weight_bytes + d.kv_bytes + d.recurrent_bytes + d.compute_bytes,
});

function measured(memory, device) {
  const rows = memory.filter((m) => m.device === device);
  const sum = (k) => rows.reduce((a, m) => a + m[k], 0);
  const weights = sum('model_bytes');
  const kv = sum('context_bytes');
  const compute = sum('compute_bytes');
  return {
    weights,
    kv,
    compute,
    total: weights + kv + compute,
    buffer_types: rows.map((m) => m.buffer_type),
  };
}

const figures = [];
const results = [];
const ratioFigure = (name, value, anchor) => ({
  name,
  unit: 'bytes',
  samples: 1,
  median: value,
  p99: value,
  mean: value,
  anchor: { name: "PLAN's prediction", unit: 'bytes', median: anchor, p99: anchor, mean: anchor, samples: 1 },
  ratio: anchor > 0 ? value / anchor : null,
  better: 'lower',
});

function write() {
  mkdirSync(dirname(out), { recursive: true });
  const notes = {
    command: `node apps/engine/bench/fit-check-bench.mjs ${argv.join(' ')}`.trim(),
    devices,
    capped,
    cap_share: capShare,
    n_ctx: nCtx,
    measured: 'STATUS memory (llama_get_memory_breakdown of the model and context in force), per device',
    results,
  };
  writeFileSync(out, `${JSON.stringify(resultDoc('fit-check', figures, notes), null, 2)}\n`);
}

for (const model of models) {
  const label = basename(model, '.gguf');
  const peers = [];
  for (let i = 0; i < nPeers; i++) peers.push(await engine([], envOf(many('--peer-env'))));
  // Started with the model: PLAN reads a peer's devices once the peer has served a load.
  const head = await engine(
    ['-m', model, '-ngl', '999', '-c', String(nCtx), '-np', '1', '--rpc', peers.map((p) => p.rpc).join(',')],
    envOf(many('--head-env')),
  );
  try {
    const base = { model, n_ctx: nCtx, n_gpu_layers: 999 };
    // What the capped device would need for the whole model, alone: the split that gives it all.
    const alone = await post(head.url, '/control/plan', {
      ...base,
      tensor_split: devices.map((d) => (d === capped ? 1 : 0)),
    });
    if (!alone.success || !alone.fit?.devices)
      throw new Error(`PLAN gave no fit: ${JSON.stringify(alone.error ?? alone.fit)}`);
    const need = planned(alone.fit.devices.find((d) => d.name === capped)).total;
    const capMib = Math.floor((need * capShare) / 2 ** 20);
    const t0 = performance.now();
    const r = await post(head.url, '/control/configure', {
      ...base,
      tensor_split: 'auto',
      device_memory_cap: [`${capped}=${capMib}`],
    });
    const loadMs = performance.now() - t0;
    if (!r.success) throw new Error(`CONFIGURE auto failed: ${JSON.stringify(r.error)}`);
    const st = await (await fetch(`${head.url}/control/status`)).json();
    const perDevice = {};
    for (const d of r.fit.devices) {
      const p = planned(d);
      const m = measured(st.memory ?? [], d.name);
      perDevice[d.name] = {
        planned: p,
        measured: m,
        layers: d.layers,
        output: d.output,
        cap_bytes: d.cap_bytes,
      };
      for (const part of ['total', 'weights', 'kv', 'compute'])
        if (p[part] > 0)
          figures.push(
            ratioFigure(`fit-check ${label} ${d.name} ${part}: allocated vs planned`, m[part], p[part]),
          );
      const within = p.total > 0 ? Math.abs(m.total - p.total) / p.total : 0;
      console.log(
        `${label} ${d.name}: planned ${(p.total / 2 ** 20).toFixed(1)} MiB, allocated ${(m.total / 2 ** 20).toFixed(1)} MiB (${(100 * within).toFixed(2)}% off; compute ${(m.compute / 2 ** 20).toFixed(1)} vs ${(p.compute / 2 ** 20).toFixed(1)})`,
      );
    }
    // One layer more on the capped device than auto chose: refused, nothing unloaded.
    const slots = r.fit.devices.map((d) => (d.layers?.count ?? 0) + (d.output ? 1 : 0));
    const ci = r.fit.devices.findIndex((d) => d.name === capped);
    const donor = slots.findIndex((n, i) => i !== ci && n > 0);
    let refusal = { tried: false };
    if (donor >= 0) {
      const split = [...slots];
      split[ci] += 1;
      split[donor] -= 1;
      const refused = await post(head.url, '/control/configure', { tensor_split: split });
      const after = await (await fetch(`${head.url}/control/status`)).json();
      const still = await fetch(`${head.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: 'still here', max_tokens: 2, temperature: 0 }),
      });
      refusal = {
        tried: true,
        split,
        code: refused.success ? null : refused.error.code,
        same_epoch: after.epoch === st.epoch,
        still_serving: still.status === 200,
      };
      console.log(`${label}: one layer more on ${capped} ${JSON.stringify(refusal)}`);
    }
    results.push({
      model,
      cap: { device: capped, mib: capMib, whole_model_needs_bytes: need },
      auto_chosen: r.auto_chosen,
      load_ms: Math.round(loadMs),
      per_device: perDevice,
      one_layer_more: refusal,
    });
    write();
  } finally {
    await stop(head.child);
    for (const p of peers) await stop(p.child);
  }
}
write();
console.log(`wrote ${out}`);
