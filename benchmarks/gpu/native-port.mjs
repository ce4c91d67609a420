// GPU figures of the native boundary and the merged port, each against its upstream anchor measured
// in the same run on the same machine (bundled by pack.mjs, run on the device machine):
//   native decode loop (one ctx.decode per token)     vs  llama-bench -p 512 -n 128 (pp512, tg128)
//   one stream through the engine's HTTP API           vs  llama-bench tg128
//   ggml-RPC HELLO connect-to-reply through our port  vs  stock ggml-rpc-server
//   llama-bench --rpc through our port                 vs  through stock ggml-rpc-server
// Usage (after build.sh; bundle.mjs makes dist/gpu/native-port.cjs):
//   node benchmarks/dist/gpu/native-port.cjs --models DIR --out FILE [--only native,http,hello,rpc]
//        [--shapes 8b,27b] [--bin packages/native-ggml/build-cuda/bin] [--stock-devices CUDA0]
//        [--memory-ctx 4096,32768]   (--only memory: the split planner's prediction vs the real load)
//        [--modes chained,none,...]  (--only native: which decode loops, in order, default all;
//                                     `chained#2` runs one again, `reload` loads the model anew)
//        [--reps 5] [--threads N] [--log-level debug]
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { cpus, hostname, totalmem } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readGgufFile } from '../../apps/engine/dist/placement.js';
import {
  freeLoopbackPort as freePort,
  initBackend,
  listDevices,
  Model,
} from '../../packages/native-ggml/dist/index.js';
import { writeSyntheticModel } from '../../packages/native-ggml/dist/synth/index.js';
import { modelFactsFromGguf, planSplit } from '../../packages/resolver/dist/index.js';
import { summarize } from '../dist/schema.js';

const args = {};
for (const [i, a] of process.argv.entries()) {
  if (i >= 2 && a.startsWith('--')) args[a.slice(2)] = process.argv[i + 1];
}
const only = new Set((args.only ?? 'native,http,hello,rpc').split(','));
const memoryCtx = (args['memory-ctx'] ?? '4096,32768').split(',').map(Number);
const shapes = (args.shapes ?? '8b').split(',');
const modelsDir = args.models ?? '/tmp/hydra-models';
const bin = args.bin ?? 'packages/native-ggml/build-cuda/bin';
// The engine's bundle (cli.cjs) sits beside this one in benchmarks/dist/gpu/.
const jsDir = args.js ?? fileURLToPath(new URL('.', import.meta.url));
const started = Date.now();
const log = (...m) => console.error(`[bench ${((Date.now() - started) / 1000).toFixed(0)}s]`, ...m);

const figures = [];
function figure(name, unit, samples, anchor) {
  const sorted = [...samples].sort((a, b) => a - b);
  const q = (p) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
  const mean = samples.reduce((a, b) => a + b, 0) / samples.length;
  const f = {
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
  figures.push(f);
  log(name, JSON.stringify({ median: f.median, p99: f.p99, anchor: anchor?.median, ratio: f.ratio }));
  return f;
}

function run(file, argv, timeoutMs = 600_000) {
  return new Promise((resolve, reject) =>
    execFile(file, argv, { timeout: timeoutMs, maxBuffer: 256 << 20 }, (err, stdout, stderr) =>
      err ? reject(Object.assign(err, { stderr })) : resolve(stdout),
    ),
  );
}

async function llamaBench(model, extra = []) {
  const out = await run(join(bin, 'llama-bench'), [
    '-m',
    model,
    '-p',
    '512',
    '-n',
    '128',
    '-o',
    'json',
    ...extra,
  ]);
  const rows = JSON.parse(out);
  const pick = (pred) => rows.find(pred);
  const pp = pick((r) => r.n_prompt === 512 && r.n_gen === 0);
  const tg = pick((r) => r.n_gen === 128 && r.n_prompt === 0);
  return {
    pp: { median: pp.avg_ts, samples: pp.samples_ts },
    tg: { median: tg.avg_ts, samples: tg.samples_ts },
  };
}

/** Which context of the process `mode` ran in (`reload` entries make none). */
function contextNumber(modes, mode) {
  return modes.slice(0, modes.indexOf(mode) + 1).filter((m) => !m.startsWith('reload')).length;
}

function mergeAnchors(a, b) {
  const avg = (r) => ({ pp: r.pp.median, tg: r.tg.median });
  return {
    pp: { median: summarize([...a.pp.samples, ...b.pp.samples]).median },
    tg: { median: summarize([...a.tg.samples, ...b.tg.samples]).median },
    before: avg(a),
    after: avg(b),
  };
}

async function ensureModel(arch, shape) {
  mkdirSync(modelsDir, { recursive: true });
  const out = join(modelsDir, `${arch}-${shape}-q4_0.gguf`);
  if (!existsSync(out)) {
    log(`writing synthetic ${arch} ${shape} q4_0`);
    const r = await writeSyntheticModel({ arch, shape, quant: 'q4_0', seed: 1, out });
    log(`wrote ${out}: ${(r.bytes / 1e9).toFixed(2)} GB in ${r.seconds.toFixed(1)} s`);
  }
  return out;
}

// Decode loops through the binding, measured as llama-bench measures: prefill and decode are
// separate tests, each warmed up first (pp: one 512-token call; tg: one single-token step, as
// llama-bench's `test_gen(ctx, 1)`), then 5 repetitions from an empty KV cache. Modes: 'backend'
// samples greedily on the device and awaits each step;
// 'chained' too, but queues step k+1 (follow: the token sampled at step k) before step k ends, as
// the engine does; 'after-prefill' is 'chained' with a 512-token prefill before each repetition (the
// methodology of earlier runs): its first step rebuilds the graph and re-captures the CUDA graph,
// which llama-bench's tg repetitions never do. 'none' samples nothing and reads nothing back (no
// output row, so less work than llama-bench's tg, which computes the logits it ignores): the call
// path alone; 'none-chained' queues those steps ahead with llama-bench-like pseudo-random tokens,
// and '-ctx256' in llama-bench's context size.
const MODES = {
  backend: { backendSampling: true, sampler: true },
  chained: { backendSampling: true, sampler: true, chained: true },
  'after-prefill': { backendSampling: true, sampler: true, chained: true, prefillEachRep: true },
  none: { backendSampling: true, sampler: false },
  'none-chained': { backendSampling: true, sampler: false, chained: true },
  'none-chained-ctx256': { backendSampling: true, sampler: false, chained: true, nCtx: 256 },
};
const REPS = Number(args.reps ?? 5);

async function nativeDecode(modelPath, modes) {
  let model = await Model.load({ path: modelPath, nGpuLayers: 99 });
  const out = {};
  const prompt = Int32Array.from({ length: 512 }, (_, i) => 3 + ((i * 7919) % (model.info.nVocab - 3)));
  for (const mode of modes) {
    // `reload`: dispose of the model and load it again (is a later context's drop in the model?).
    if (mode.split('#')[0] === 'reload') {
      model.dispose();
      model = await Model.load({ path: modelPath, nGpuLayers: 99 });
      continue;
    }
    // `chained#2`: the `chained` loop again, in a later context of the same process.
    const m = MODES[mode.split('#')[0]];
    if (!m) throw new Error(`unknown mode ${mode}; modes: ${Object.keys(MODES).join(', ')}`);
    const ctx = await model.createContext({
      ...(args.threads ? { nThreads: Number(args.threads) } : {}),
      nCtx: m.nCtx ?? 4096,
      nBatch: 2048,
      nUbatch: 512,
      flashAttn: 'auto',
      backendSampling: m.backendSampling,
    });
    const sampler = m.sampler ? model.createSampler({ temp: 0 }) : undefined;
    const pp = [];
    const tg = [];
    const stepMs = []; // intervals between consecutive step completions, every rep
    const firstMs = []; // call to completion of each rep's first step
    const prefill = async () => {
      ctx.clear();
      const t0 = performance.now();
      await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, logits: false }]);
      return 512 / ((performance.now() - t0) / 1000);
    };
    const randomToken = (i) => 3 + ((i * 7919) % (model.info.nVocab - 3));
    const generate = async (n) => {
      let token = model.info.bos;
      const t0 = performance.now();
      let last = t0;
      const done = (i) => {
        const now = performance.now();
        if (i === 0) firstMs.push(now - t0);
        else stepMs.push(now - last);
        last = now;
      };
      if (m.chained) {
        let prev = ctx.decode([{ seq: 0, pos: 0, tokens: [token], sampler }]);
        for (let i = 1; i < n; i++) {
          const next = ctx.decode([
            sampler
              ? { seq: 0, pos: i, follow: true, sampler }
              : { seq: 0, pos: i, tokens: [randomToken(i)] },
          ]);
          await prev;
          done(i - 1);
          prev = next;
        }
        await prev;
        done(n - 1);
      } else {
        for (let i = 0; i < n; i++) {
          const r = await ctx.decode([{ seq: 0, pos: i, tokens: [token], sampler }]);
          done(i);
          token = sampler ? r.tokens[0] : randomToken(i);
        }
      }
      return n / ((performance.now() - t0) / 1000);
    };
    if (mode.split('#')[0] === 'backend') {
      await prefill(); // warm-up
      for (let rep = 0; rep < REPS; rep++) pp.push(await prefill());
    }
    ctx.clear();
    await generate(1); // warm-up
    stepMs.length = 0;
    firstMs.length = 0;
    for (let rep = 0; rep < REPS; rep++) {
      if (m.prefillEachRep) await prefill();
      ctx.clear();
      tg.push(await generate(128));
    }
    sampler?.dispose();
    // Which buffer types this context got (a pinned CUDA_Host compute buffer, or a plain CPU one
    // when pinning failed, which llama.cpp reports at debug level only): a suspect for the drop of
    // later contexts.
    const buffers = ctx
      .memory()
      .map(
        (b) =>
          `${b.bufferType}: compute ${(b.compute / 2 ** 20).toFixed(1)} MiB, context ${(b.context / 2 ** 20).toFixed(1)} MiB`,
      );
    await ctx.dispose();
    const sorted = [...stepMs].sort((a, b) => a - b);
    out[mode] = {
      pp,
      tg,
      steps: {
        median_ms: sorted[Math.floor(sorted.length / 2)],
        p90_ms: sorted[Math.floor(sorted.length * 0.9)],
        max_ms: sorted.at(-1),
        first_ms: firstMs,
      },
      buffers,
    };
  }
  model.dispose();
  return out;
}

// Greedy generation through the binding equals upstream llama-simple's on the same GPU, model and
// prompt (the tests' check, on a full-size model): llama-simple prints each piece as it goes.
const GREEDY_PROMPT = 'Hello world, this is a test';
async function greedyCheck(modelPath, n = 32) {
  // A load of its own, so that the decode loops after it start on a model no prompt has touched
  // (a context created after a prefill decoded 3-4% slower on the H200: 20261129g).
  const model = await Model.load({ path: modelPath, nGpuLayers: 99 });
  try {
    const ctx = await model.createContext({ nCtx: 512, nBatch: 512 });
    const sampler = model.createSampler({ temp: 0 });
    const prompt = model.tokenize(GREEDY_PROMPT);
    let r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler }]);
    const ours = [r.tokens[0]];
    for (let i = 1; i < n; i++) {
      r = await ctx.decode([{ seq: 0, pos: prompt.length + i - 1, tokens: [ours.at(-1)], sampler }]);
      ours.push(r.tokens[0]);
    }
    sampler.dispose();
    await ctx.dispose();
    const text = Buffer.concat([...prompt, ...ours].map((t) => model.tokenBytes(t, true))).toString('utf8');
    const upstream = await run(join(bin, 'llama-simple'), [
      '-m',
      modelPath,
      '-ngl',
      '99',
      '-n',
      String(n),
      GREEDY_PROMPT,
    ]);
    return { tokens: n, equal: upstream.trimEnd() === text.trimEnd(), ours: text, upstream };
  } finally {
    model.dispose();
  }
}

// The resolver's split planner predicts, from the GGUF header alone, what a load will take on the
// GPU; here the same load is made and measured two ways: llama.cpp's own memory breakdown per buffer
// type (weights, KV, compute) and the device's free memory before and after (which also sees the CUDA
// runtime's own allocations, e.g. cuBLAS workspace, that no planner input describes).
async function memoryCheck(modelPath, shape) {
  const facts = modelFactsFromGguf(await readGgufFile(modelPath));
  // HYDRA_BENCH_CPU=1: a smoke run without a GPU, against the CPU device (figures meaningless).
  const gpu = () =>
    listDevices().find((d) => d.type === 'gpu') ??
    (process.env.HYDRA_BENCH_CPU === '1' ? listDevices().find((d) => d.type === 'cpu') : undefined);
  const mib = (b) => b / 2 ** 20;
  for (const nCtx of memoryCtx) {
    const dev = gpu();
    if (!dev) throw new Error('no GPU device');
    const before = dev.free;
    const plan = planSplit(facts, {
      devices: [{ name: dev.name, freeBytes: before }],
      nCtx,
      cacheTypeK: 'f16',
      cacheTypeV: 'f16',
      nParallel: 1,
      nUbatch: 512,
      flashAttn: true,
      nGpuLayers: 99,
    });
    const model = await Model.load({ path: modelPath, nGpuLayers: 99 });
    const ctx = await model.createContext({ nCtx, nBatch: 2048, nUbatch: 512, flashAttn: 'on' });
    // One step, so every lazily allocated buffer (cuBLAS handles, graph) exists when measured.
    await ctx.decode([{ seq: 0, pos: 0, tokens: [model.info.bos, 5, 6, 7], logits: false }]);
    const after = gpu().free;
    const breakdown = ctx.memory();
    await ctx.dispose();
    model.dispose();
    const onDevice = breakdown.filter((m) => m.bufferType === dev.bufferType || m.bufferType === dev.name);
    const sum = (k) => onDevice.reduce((a, m) => a + m[k], 0);
    const d = plan.devices[0];
    const label = `${shape} q4_0 n_ctx ${nCtx}`;
    const pair = (what, predicted, measured, anchorName) =>
      figure(`${label}: planner ${what} on ${dev.name}`, 'MiB', [mib(predicted)], {
        name: anchorName,
        unit: 'MiB',
        median: mib(measured),
      });
    pair('weights', d.weightBytes, sum('model'), 'llama.cpp memory breakdown: model');
    pair('KV cache', d.kvBytes + d.recurrentBytes, sum('context'), 'llama.cpp memory breakdown: context');
    pair('compute buffer', d.computeBytes, sum('compute'), 'llama.cpp memory breakdown: compute');
    pair(
      'total (weights + KV + compute)',
      d.weightBytes + d.kvBytes + d.recurrentBytes + d.computeBytes,
      sum('model') + sum('context') + sum('compute'),
      'llama.cpp memory breakdown: model + context + compute',
    );
    pair(
      'total (weights + KV + compute)',
      d.weightBytes + d.kvBytes + d.recurrentBytes + d.computeBytes,
      before - after,
      'device free memory before load minus after (cudaMemGetInfo)',
    );
    memoryNotes.push({ shape, nCtx, breakdown, free_before: before, free_after: after, plan: d });
  }
}
const memoryNotes = [];

async function startEngine(modelPath, extra = []) {
  const port = await freePort();
  const rpcPort = await freePort();
  const child = spawn(
    process.execPath,
    [
      join(jsDir, 'cli.cjs'),
      '-m',
      modelPath,
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
      ...extra,
    ],
    {
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env },
    },
  );
  let stderr = '';
  child.stderr.on('data', (c) => {
    stderr += c;
  });
  const deadline = Date.now() + 300_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`engine exited: ${stderr.slice(-2000)}`);
    try {
      const h = await (await fetch(`http://127.0.0.1:${port}/health`)).json();
      if (h.state === 'ready') break;
    } catch {}
    if (Date.now() > deadline) throw new Error('engine not ready');
    await new Promise((r) => setTimeout(r, 200));
  }
  return { port, rpcPort, child, stop: () => child.kill('SIGTERM') };
}

// Decode tok/s of one stream: the tokens after the first over the time from the first token's
// chunk to the chunk that ends the stream (finish_reason), which is sent when the last token is.
// Counted from usage, not from chunks: the finish chunk carries no token (counting it inflated
// earlier runs' figures by 128/127), and a token that ends inside a UTF-8 sequence sends none.
async function httpDecode(port) {
  const rates = [];
  for (let rep = 0; rep <= REPS; rep++) {
    const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        prompt: 'The history of',
        max_tokens: 128,
        temperature: 0,
        ignore_eos: true,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    let first = 0;
    let finish = 0;
    let usage;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const now = performance.now();
      buf += decoder.decode(value, { stream: true });
      for (let at = buf.indexOf('\n\n'); at >= 0; at = buf.indexOf('\n\n')) {
        const event = buf.slice(0, at);
        buf = buf.slice(at + 2);
        if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
        const json = JSON.parse(event.slice(6));
        if (json.usage) usage = json.usage;
        const choice = json.choices?.[0];
        if (!choice) continue;
        if (!first) first = now;
        if (choice.finish_reason) finish = now;
      }
    }
    if (!usage || !finish) throw new Error('stream ended without usage or finish_reason');
    // rep 0 warms up, as llama-bench does.
    if (rep > 0) rates.push((usage.completion_tokens - 1) / ((finish - first) / 1000));
  }
  return rates;
}

async function helloLatency(port, n = 300) {
  const out = [];
  const req = Buffer.alloc(1 + 8 + 24);
  req[0] = 14;
  req.writeBigUInt64LE(24n, 1);
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await new Promise((resolve, reject) => {
      const s = connect(port, '127.0.0.1', () => s.write(req));
      let got = 0;
      s.on('data', (c) => {
        got += c.length;
        if (got >= 36) {
          out.push(performance.now() - t0);
          s.destroy();
          resolve();
        }
      });
      s.on('error', reject);
    });
    await new Promise((r) => setTimeout(r, 2));
  }
  return out.slice(20);
}

async function startStock(devices = args['stock-devices'] ?? 'CUDA0') {
  const port = await freePort();
  const child = spawn(join(bin, 'ggml-rpc-server'), ['-H', '127.0.0.1', '-p', String(port), '-d', devices], {
    stdio: 'ignore',
  });
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise((r) => {
      const s = connect(port, '127.0.0.1', () => {
        s.destroy();
        r(true);
      });
      s.on('error', () => r(false));
    });
    if (ok) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  return { port, child };
}

async function main() {
  process.env.HYDRA_NATIVE_ADDON ??= resolve(bin, 'hydra_ggml.node');
  // --log-level debug shows llama.cpp's debug lines (e.g. a pinned-memory allocation that failed).
  const info = initBackend(args['log-level'] ? { logLevel: args['log-level'] } : {});
  const devices = listDevices();
  // benchmarks/src/schema.ts's format, so the dashboard draws it.
  const result = {
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
    figures,
    notes: {
      command: `node benchmarks/dist/gpu/native-port.cjs ${process.argv.slice(2).join(' ')}`,
      // The knobs that change what is measured (OMP_WAIT_POLICY, GGML_CUDA_*).
      environment: Object.fromEntries(
        Object.entries(process.env).filter(([k]) => /^(HYDRA_|GGML_|LLAMA_|OMP_|CUDA_)/.test(k)),
      ),
      systemInfo: info.systemInfo,
    },
  };
  const save = () => {
    if (args.out) writeFileSync(args.out, `${JSON.stringify(result, null, 2)}\n`);
  };

  result.notes.memory = memoryNotes;
  for (const shape of shapes) {
    const model = await ensureModel('llama', shape);
    if (only.has('memory')) {
      log(`memory: planner vs load, ${shape}`);
      await memoryCheck(model, shape);
      save();
    }
    let anchor;
    if (only.has('native') || only.has('http')) {
      log(`llama-bench local ${shape}`);
      anchor = await llamaBench(model, ['-ngl', '99', '-r', String(REPS)]);
    }
    if (only.has('native')) {
      log(`greedy generation ${shape}: binding vs llama-simple`);
      const greedy = await greedyCheck(model);
      result.notes[`greedy ${shape}`] = greedy;
      log(
        `greedy ${shape}: ${greedy.tokens} tokens, ${greedy.equal ? 'equal to' : 'DIFFERENT from'} llama-simple`,
      );
      log(`native decode loop ${shape}`);
      const modes = args.modes ? args.modes.split(',') : Object.keys(MODES);
      const n = await nativeDecode(model, modes);
      // A second llama-bench after the loops: the anchor is the median of both runs' repetitions,
      // so drift of the GPU over the minute the loops take counts against neither side.
      const again = await llamaBench(model, ['-ngl', '99', '-r', String(REPS)]);
      anchor = mergeAnchors(anchor, again);
      result.notes[`llama-bench ${shape}`] = { before: anchor.before, after: anchor.after };
      const tg128 = {
        name: 'llama-bench tg128 (median of the repetitions of two runs)',
        unit: 'tokens/s',
        median: anchor.tg.median,
      };
      if (n.backend)
        figure(`${shape} q4_0 prefill 512, native decode call`, 'tokens/s', n.backend.pp, {
          name: 'llama-bench pp512 (median of the repetitions of two runs)',
          unit: 'tokens/s',
          median: anchor.pp.median,
        });
      const greedyLabel = 'greedy sampled on the device';
      const labels = {
        chained: `decode, native loop, ${greedyLabel}, next step queued ahead (follow)`,
        backend: `decode, native loop, ${greedyLabel}, each step awaited`,
        'after-prefill': `decode, native loop, ${greedyLabel}, next step queued ahead, a 512-token prefill before each repetition`,
        none: 'decode, native loop, no sampling and no output row (call path only)',
        'none-chained': 'decode, native loop, no sampling and no output row, next step queued ahead',
        'none-chained-ctx256':
          'decode, native loop, no sampling and no output row, next step queued ahead, n_ctx 256',
      };
      for (const mode of modes.filter((m) => !m.startsWith('reload'))) {
        const [base, again] = mode.split('#');
        const label = again
          ? `${labels[base]} (again, context ${contextNumber(modes, mode)} of the process${modes.slice(0, modes.indexOf(mode)).some((m) => m.startsWith('reload')) ? ', model loaded anew' : ''})`
          : labels[base];
        figure(`${shape} q4_0 ${label}`, 'tokens/s', n[mode].tg, tg128);
        result.notes[`buffers ${shape} ${mode}`] = n[mode].buffers;
        result.notes[`steps ${shape} ${mode}`] = {
          ...n[mode].steps,
          llama_bench_ms_per_token: 1000 / anchor.tg.median,
        };
      }
      save();
    }
    if (only.has('http') || only.has('hello') || only.has('rpc')) {
      const engine = await startEngine(model);
      try {
        if (only.has('http')) {
          log(`HTTP decode ${shape}`);
          figure(
            `${shape} q4_0 decode, one stream through the HTTP API`,
            'tokens/s',
            await httpDecode(engine.port),
            { name: 'llama-bench tg128', unit: 'tokens/s', median: anchor.tg.median },
          );
          save();
          // The same engine after it has served a long prompt: a serving engine's usual state, and
          // the one in which later native contexts decoded 3-4% slower (20261129g).
          const long = 'The history of the world '.repeat(100);
          const pre = await fetch(`http://127.0.0.1:${engine.port}/v1/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ prompt: long, max_tokens: 1, temperature: 0 }),
          });
          const usage = (await pre.json()).usage;
          log(`HTTP: served a ${usage?.prompt_tokens}-token prompt`);
          figure(
            `${shape} q4_0 decode, one stream through the HTTP API, after serving a ${usage?.prompt_tokens}-token prompt`,
            'tokens/s',
            await httpDecode(engine.port),
            { name: 'llama-bench tg128', unit: 'tokens/s', median: anchor.tg.median },
          );
          save();
        }
        if (only.has('hello') && shape === shapes[0]) {
          const stock = await startStock();
          try {
            const ours = await helloLatency(engine.rpcPort);
            const theirs = await helloLatency(stock.port);
            const sorted = [...theirs].sort((a, b) => a - b);
            const anchorHello = {
              name: 'stock ggml-rpc-server HELLO',
              unit: 'ms',
              median: sorted[Math.floor(sorted.length / 2)],
              p99: sorted[Math.floor(sorted.length * 0.99)],
            };
            figure('ggml-RPC HELLO connect-to-reply through the merged port', 'ms', ours, anchorHello);
          } finally {
            stock.child.kill('SIGKILL');
          }
          save();
        }
      } finally {
        engine.stop();
        await new Promise((r) => engine.child.once('exit', r));
      }
    }
    if (only.has('rpc')) {
      // A model-less engine lends its GPU; llama-bench (upstream client) places layers on it.
      const peerPort = await freePort();
      const rpcPort = await freePort();
      const peer = spawn(
        process.execPath,
        [join(jsDir, 'cli.cjs'), '--port', String(peerPort), '--rpc-port', String(rpcPort)],
        {
          stdio: 'ignore',
          env: { ...process.env },
        },
      );
      await new Promise((r) => setTimeout(r, 1500));
      const stock = await startStock();
      try {
        for (const [label, extra] of [
          ['all layers remote', ['-dev', 'RPC0']],
          ['1/1 split', ['-dev', 'CUDA0/RPC0', '-ts', '1/1']],
        ]) {
          log(`llama-bench --rpc ${shape} ${label}`);
          const theirs = await llamaBench(model, [
            '-ngl',
            '99',
            '--rpc',
            `127.0.0.1:${stock.port}`,
            ...extra,
          ]);
          const ours = await llamaBench(model, ['-ngl', '99', '--rpc', `127.0.0.1:${rpcPort}`, ...extra]);
          figure(
            `${shape} q4_0 ${label}: llama-bench --rpc decode through our merged port`,
            'tokens/s',
            ours.tg.samples,
            { name: 'via stock ggml-rpc-server', unit: 'tokens/s', median: theirs.tg.median },
          );
          figure(
            `${shape} q4_0 ${label}: llama-bench --rpc prefill through our merged port`,
            'tokens/s',
            ours.pp.samples,
            { name: 'via stock ggml-rpc-server', unit: 'tokens/s', median: theirs.pp.median },
          );
          save();
        }
      } finally {
        stock.child.kill('SIGKILL');
        peer.kill('SIGTERM');
      }
    }
  }
  result.seconds = (Date.now() - started) / 1000;
  save();
  log('done');
  process.exit(0);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
