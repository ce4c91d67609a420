// Speculative decoding with a draft model (issue 25): single-stream greedy decode tok/s of the
// engine with `-md` against the same engine without it, and upstream llama-server with the same
// pair and settings against llama-server without it, at each acceptance the synthetic pairs set
// (SYNTH.md: the draft is the plain shape, the target the shape plus --extra-layers blocks whose
// output projections are scaled by each --scales value). Run after `pnpm run build:ts`:
//   node bench/spec-draft-bench.mjs [--shape tiny] [--quant q8_0] [--extra-layers 4]
//     [--scales 0.02,0.07,0.3] [--n-max 4] [--p-min 0] [--tokens 256] [--reps 3] [--ngl 0]
//     [--threads N] [--llama-server PATH] [--out FILE]
// Without --llama-server only the engine is measured. Acceptance: accepted / drafted over the
// measured requests (the engine's hydra_spec_* counters, llama-server's timings.draft_n*).
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { engineCli, engineEnv, FatalError, freePort, one, waitFor } from './figures.mjs';

const CLI = engineCli();
const shape = one('--shape', 'tiny');
const quant = one('--quant', 'q8_0');
const extraLayers = Number(one('--extra-layers', '4'));
const scales = one('--scales', '0.02,0.07,0.3').split(',').map(Number);
const nMax = one('--n-max', '4');
const pMin = one('--p-min', '0');
const tokens = Number(one('--tokens', '256'));
const reps = Number(one('--reps', '3'));
const ngl = one('--ngl', '0');
const threads = one('--threads');
const llamaServer = one('--llama-server');
const out = resolve(
  one('--out', new URL('../../../benchmarks/results/engine-spec-draft.json', import.meta.url).pathname),
);
const PROMPTS = ['Once upon a time', 'The quick brown fox jumps over', 'hello world, this is'];

/** Starts the engine (`kind` engine) or llama-server with `flags`; resolves once it serves. */
async function server(kind, flags) {
  const port = await freePort();
  const common = [
    '--port',
    String(port),
    '-c',
    '4096',
    '-np',
    '1',
    '-ngl',
    ngl,
    ...(threads ? ['-t', threads] : []),
  ];
  const [cmd, args] =
    kind === 'engine'
      ? [process.execPath, [CLI, ...common, '--progress', 'off', ...flags]]
      : [llamaServer, [...common, '--host', '127.0.0.1', '--no-webui', ...flags]];
  const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'], env: engineEnv() });
  let log = '';
  child.stderr.on('data', (d) => {
    log = (log + d).slice(-8000);
  });
  const url = `http://127.0.0.1:${port}`;
  await waitFor(
    async () => {
      if (child.exitCode !== null) throw new FatalError(`${kind} exited: ${log}`);
      const r = await fetch(`${url}/health`);
      if (r.status !== 200) return false;
      const h = await r.json();
      return h.status === 'ok' || h.state === 'ready';
    },
    600_000,
    `${kind} start`,
    50,
  );
  const stop = async () => {
    child.kill('SIGTERM');
    await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
  };
  return { url, stop, log: () => log };
}

async function metric(url, name) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

/** One greedy request per prompt, `reps` times: median tok/s, texts, and llama-server's draft counts. */
async function measure(s) {
  await fetch(`${s.url}/completion`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'warm up', n_predict: 8, temperature: 0 }),
  });
  const rates = [];
  const texts = [];
  let drafted = 0;
  let accepted = 0;
  for (let r = 0; r < reps; r++) {
    let n = 0;
    let ms = 0;
    for (const prompt of PROMPTS) {
      const t0 = performance.now();
      const res = await fetch(`${s.url}/completion`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          prompt,
          n_predict: tokens,
          temperature: 0,
          ignore_eos: true,
          cache_prompt: false,
        }),
      });
      const j = await res.json();
      ms += performance.now() - t0;
      n += j.tokens_predicted ?? j.timings?.predicted_n ?? tokens;
      if (r === 0) texts.push(j.content);
      drafted += j.timings?.draft_n ?? 0;
      accepted += j.timings?.draft_n_accepted ?? 0;
    }
    rates.push((n * 1000) / ms);
  }
  rates.sort((a, b) => a - b);
  return { tokPerS: rates[Math.floor(rates.length / 2)], rates, texts, drafted, accepted };
}

const dir = mkdtempSync(join(tmpdir(), 'hydra-spec-bench-'));
const draft = join(dir, 'draft.gguf');
await writeSyntheticModel({ arch: 'llama', shape, quant, seed: 0, out: draft });
const spec = ['-md', draft, '--spec-draft-n-max', nMax, '--spec-draft-p-min', pMin, '-ngld', ngl];
const results = [];
for (const scale of scales) {
  const target = join(dir, `target-${scale}.gguf`);
  await writeSyntheticModel({
    arch: 'llama',
    shape,
    quant,
    seed: 0,
    out: target,
    extraLayers,
    extraScale: scale,
  });
  const row = { scale };
  for (const [kind, withSpec] of [
    ['engine', true],
    ['engine', false],
    ...(llamaServer
      ? [
          ['llama-server', true],
          ['llama-server', false],
        ]
      : []),
  ]) {
    const s = await server(kind, ['-m', target, ...(withSpec ? spec : [])]);
    try {
      const d0 = kind === 'engine' ? await metric(s.url, 'hydra_spec_drafted_total') : 0;
      const a0 = kind === 'engine' ? await metric(s.url, 'hydra_spec_accepted_total') : 0;
      const m = await measure(s);
      if (kind === 'engine') {
        m.drafted = (await metric(s.url, 'hydra_spec_drafted_total')) - d0;
        m.accepted = (await metric(s.url, 'hydra_spec_accepted_total')) - a0;
      }
      const key = `${kind === 'engine' ? 'engine' : 'llama_server'}_${withSpec ? 'spec' : 'plain'}`;
      row[key] = {
        tok_per_s: Number(m.tokPerS.toFixed(2)),
        reps: m.rates.map((x) => Number(x.toFixed(2))),
        ...(withSpec
          ? { drafted: m.drafted, accepted: m.accepted, acceptance: m.drafted ? m.accepted / m.drafted : 0 }
          : {}),
      };
      row[`${key}_texts`] = m.texts;
    } finally {
      await s.stop();
    }
  }
  row.engine_speedup = row.engine_spec.tok_per_s / row.engine_plain.tok_per_s;
  row.engine_greedy_equal = JSON.stringify(row.engine_spec_texts) === JSON.stringify(row.engine_plain_texts);
  if (llamaServer) {
    row.llama_server_speedup = row.llama_server_spec.tok_per_s / row.llama_server_plain.tok_per_s;
    row.engine_vs_llama_server_spec = row.engine_spec.tok_per_s / row.llama_server_spec.tok_per_s;
  }
  for (const k of Object.keys(row)) if (k.endsWith('_texts')) delete row[k];
  console.log(JSON.stringify(row));
  results.push(row);
}
mkdirSync(dirname(out), { recursive: true });
writeFileSync(
  out,
  `${JSON.stringify({ bench: 'spec-draft', shape, quant, extra_layers: extraLayers, n_max: Number(nMax), p_min: Number(pMin), tokens, reps, ngl: Number(ngl), results }, null, 2)}\n`,
);
console.log(`wrote ${out}`);
