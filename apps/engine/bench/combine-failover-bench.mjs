// COMBINE peer loss under each failover_policy (issue 22): a head and its peer as separate engine
// processes; per run, a greedy stream is started, the peer is killed (SIGKILL) at its first token,
// and the bench measures the stream's end, the first token of the next request (polled), then
// restarts the peer at the same port and measures the automatic rejoin (/health no longer
// degraded) and checks the greedy tokens equal those before the loss. Run after `pnpm run build:ts`:
//   node bench/combine-failover-bench.mjs [--model GGUF] [--policies auto,solo,offload] [--runs 3]
//     [--ngl 99] [--device RPC0] [--ctx 4096] [--cap NAME=MiB ...]
//     [--head-env K=V ...] [--peer-env K=V ...] [--out FILE]
// With no --model the tiny synthetic model is written and used (CPU). On two GPUs of one host:
//   --head-env CUDA_VISIBLE_DEVICES=0 --peer-env CUDA_VISIBLE_DEVICES=1 --device RPC0,CUDA0
//   (and --cap CUDA0=MiB so a 27B-class model does not fit SOLO: auto then takes offload).
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { argv, engineCli, envOf, many, one, resultDoc, startEngine, summary, waitFor } from './figures.mjs';

const CLI = engineCli();

const policies = one('--policies', 'auto,solo,offload').split(',');
const runs = Number(one('--runs', '3'));
const out = resolve(
  one('--out', new URL('../../../benchmarks/results/engine-combine-failover.json', import.meta.url).pathname),
);
let model = one('--model');
if (!model) {
  model = join(mkdtempSync(join(tmpdir(), 'hydra-failover-bench-')), 'tiny.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3, out: model });
}
const PROMPT = 'Hello world, this is a test';

const engine = (flags, env, rpcPort) => startEngine(CLI, flags, env, rpcPort);

async function greedy(url) {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      prompt: PROMPT,
      max_tokens: 16,
      temperature: 0,
      ignore_eos: true,
      return_tokens: true,
    }),
  });
  const j = await r.json();
  return { status: r.status, tokens: j.choices?.[0]?.tokens ?? j.choices?.[0]?.text };
}

/** Streams until the first token, calls onFirst, and resolves when the stream ends. */
async function streamKill(url, onFirst) {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      prompt: PROMPT,
      max_tokens: 100_000,
      temperature: 0,
      ignore_eos: true,
      stream: true,
    }),
  });
  let first = false;
  let text = '';
  for await (const chunk of r.body) {
    text += Buffer.from(chunk).toString();
    if (!first && text.includes('"text"')) {
      first = true;
      onFirst();
    }
  }
  return /HYDRA_ERR_PEER_LOST/.test(text);
}

const kill = (child) =>
  new Promise((r) => {
    if (child.exitCode !== null) return r();
    child.once('exit', () => r());
    child.kill('SIGKILL');
  });

const results = [];
for (const policy of policies) {
  const ended = [];
  const served = [];
  const rejoined = [];
  const taken = [];
  let sameTokens = true;
  for (let run = 0; run < runs; run++) {
    const peer = await engine(['-t', '1'], envOf(many('--peer-env')));
    const head = await engine(
      [
        '-m',
        model,
        '--rpc',
        peer.rpc,
        '--device',
        one('--device', 'RPC0'),
        '-ngl',
        one('--ngl', '99'),
        '-c',
        one('--ctx', '4096'),
        '--failover-policy',
        policy,
        ...many('--cap').flatMap((c) => ['--device-memory-cap', c]),
      ],
      envOf(many('--head-env')),
    );
    const before = await greedy(head.url);
    let killedAt = 0;
    const lost = await streamKill(head.url, () => {
      killedAt = performance.now();
      void kill(peer.child);
    });
    if (!lost) throw new Error('the stream did not end with HYDRA_ERR_PEER_LOST');
    ended.push(performance.now() - killedAt);
    let after;
    await waitFor(
      async () => {
        after = await greedy(head.url);
        return after.status === 200;
      },
      600_000,
      'the first request after the loss',
    );
    served.push(performance.now() - killedAt);
    const h = await (await fetch(`${head.url}/health`)).json();
    taken.push(h.degraded?.failover ?? null);
    const back = await engine(['-t', '1'], envOf(many('--peer-env')), peer.rpcPort);
    const backAt = performance.now();
    await waitFor(
      async () => {
        const now = await (await fetch(`${head.url}/health`)).json();
        return now.state === 'ready' && now.status !== 'degraded';
      },
      600_000,
      'the rejoin',
    );
    rejoined.push(performance.now() - backAt);
    const again = await greedy(head.url);
    if (JSON.stringify(again.tokens) !== JSON.stringify(before.tokens)) sameTokens = false;
    await kill(head.child);
    await kill(back.child);
  }
  results.push({
    policy,
    taken,
    same_greedy_tokens_after_rejoin: sameTokens,
    figures: [
      summary('stream ended after kill -9 of the peer', 'ms', ended),
      summary('first answer after kill -9 of the peer', 'ms', served),
      summary('COMBINE restored after the peer restarted', 'ms', rejoined),
    ],
  });
  console.log(JSON.stringify(results.at(-1)));
  // Rewritten after every policy, so a run cut short by its caller's timeout keeps what it finished.
  mkdirSync(dirname(out), { recursive: true });
  const figures = results.flatMap((r) =>
    r.figures.map((f) => ({ ...f, name: `failover ${r.policy}: ${f.name}` })),
  );
  const doc = resultDoc('combine-failover', figures, { model, runs, argv, results });
  writeFileSync(out, `${JSON.stringify(doc, null, 2)}\n`);
}
console.log(`wrote ${out}`);
