import { existsSync } from 'node:fs';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { makeFigure } from '../../schema.js';
import { freeLoopbackPort, getJson, type Part, sleep, startRpcServer } from '../harness/index.js';
import { complete, median, promptOf, type SystemContext } from './context.js';

/** GET /health's placement rows (where each layer runs), for the notes. */
async function placementOf(url: string): Promise<unknown> {
  const { body } = await getJson(`${url}/health`, 30_000);
  return body.placement ?? null;
}

/**
 * COMBINE as a user runs it: a head engine with `--rpc peer` splits the model with a peer engine's
 * GPU (both on one GPU, or one each with --peer-gpu). Anchors from the same run: llama-bench --rpc to
 * stock ggml-rpc-server with the same device order and split; for MoE, llama-bench local decode (the
 * 0.85x goal) and llama-bench with the experts on stock ggml-rpc-server.
 */
export const combine: Part<SystemContext> = {
  name: 'combine',
  estimateS: 120,
  async run(c) {
    const { opts, h } = c;
    // HYDRA_BENCH_CPU=1: a smoke run of this part on a machine without a GPU (figures meaningless).
    const gpu = (await c.localGpu()) ?? (process.env.HYDRA_BENCH_CPU === '1' ? 'CPU' : undefined);
    if (!gpu) throw new Error('no local GPU device for the head');
    // --peer-gpu N: the head side sees GPU 0 only, the peer side GPU N only; each calls its GPU CUDA0.
    const two = opts.peerGpu !== undefined;
    const headEnv: Record<string, string> = two ? { CUDA_VISIBLE_DEVICES: '0' } : {};
    const peerEnv: Record<string, string> = two ? { CUDA_VISIBLE_DEVICES: String(opts.peerGpu) } : {};
    const stock = await startRpcServer(h.processes, c.tool('ggml-rpc-server'), {
      devices: gpu,
      env: peerEnv,
    });
    const stockEp = stock.endpoint;
    const notes = {
      local_device: gpu,
      peer_gpu: two ? (opts.peerGpu as number) : ('shared' as const),
      placements: {} as Record<string, unknown>,
    };
    c.notes.combine = notes;
    const common = ['-p', '512', '-n', '128', '-ngl', String(opts.ngl), '-fa', '1', '-r', String(opts.reps)];
    try {
      for (const shape of opts.combineShapes) {
        const path = c.modelPath('llama', shape);
        const label = `${shape} q4_0`;
        if (!existsSync(path)) {
          h.skip(`combine ${label}`, `${path} missing: run --only synth first`);
          continue;
        }
        if (!h.within(shape === '27b' ? 150 : 90, `combine ${label}`)) continue;
        // The engine puts RPC devices first (upstream's default order), so the anchor does too.
        h.log(`combine ${label}: llama-bench --rpc ${stockEp} -dev RPC0/${gpu} -ts 1/1`);
        const split = gpu === 'CPU' ? [] : ['-dev', `RPC0/${gpu}`, '-ts', '1/1'];
        const anchor = await c.llamaBench(
          ['-m', path, ...common, '--rpc', stockEp, ...split],
          300_000,
          headEnv,
        );
        const solo = two ? await c.llamaBench(['-m', path, ...common], 300_000, headEnv) : undefined;
        const peerRpc = await freeLoopbackPort();
        // The peer has the GGUF too (--rpc-weights): the head's load sends hashes, not weights.
        const peer = await c.startEngine(['--rpc-port', String(peerRpc), '--rpc-weights', path], {
          state: 'empty',
          timeoutMs: 60_000,
          env: peerEnv,
        });
        const head = await c.startEngine(
          [...c.servingArgs(path), '--rpc', `127.0.0.1:${peerRpc}`, ...(gpu === 'CPU' ? [] : ['-ts', '1/1'])],
          { env: headEnv },
        );
        try {
          notes.placements[label] = await placementOf(head.url);
          const r = await c.httpRates(head.url);
          const rpcAnchor = (k: string, samples: number[]) => ({
            name: `llama-bench ${k} --rpc stock ggml-rpc-server, same devices and split`,
            unit: 'tok/s',
            samples,
          });
          h.add(
            makeFigure({
              name: `COMBINE decode ${label}, head engine HTTP stream, 1/1 split with a peer engine`,
              unit: 'tok/s',
              samples: r.decode,
              anchor: rpcAnchor('tg128', anchor.tg),
            }),
          );
          h.add(
            makeFigure({
              name: `COMBINE prefill ${label}, head engine HTTP (512-token prompt), 1/1 split with a peer engine`,
              unit: 'tok/s',
              samples: r.prefill,
              anchor: rpcAnchor('pp512', anchor.pp),
            }),
          );
          if (solo) {
            const soloAnchor = { name: 'llama-bench tg128 local, one GPU', unit: 'tok/s', samples: solo.tg };
            h.add(
              makeFigure({
                name: `COMBINE decode ${label}, head engine HTTP, two GPUs, against SOLO on one GPU`,
                unit: 'tok/s',
                samples: r.decode,
                anchor: soloAnchor,
              }),
            );
            h.add(
              makeFigure({
                name: `upstream COMBINE decode ${label}, llama-bench --rpc, two GPUs, against SOLO on one GPU`,
                unit: 'tok/s',
                samples: anchor.tg,
                anchor: soloAnchor,
              }),
            );
          }
        } finally {
          await h.processes.stop(head.child);
          await h.processes.stop(peer.child);
        }
        h.save();
      }
      await moeExperts(c, stockEp, common);
    } finally {
      await h.processes.stop(stock.child);
    }
  },
};

/** MoE with the experts on the peer: combined, after SET_EXPERT_MODE solo, and flips during a stream. */
async function moeExperts(c: SystemContext, stockEp: string, common: readonly string[]): Promise<void> {
  const { opts, h } = c;
  const moe = c.modelPath('moe', opts.moeShape);
  const label = `MoE ${opts.moeShape} q4_0`;
  if (!existsSync(moe)) {
    h.skip(`combine ${label}`, `${moe} missing`);
    return;
  }
  if (!h.within(90, `combine ${label}`)) return;
  h.log(`combine ${label}: llama-bench local, and with the experts on stock ggml-rpc-server`);
  const local = await c.llamaBench(['-m', moe, ...common], 300_000);
  const upstream = await c.llamaBench(
    ['-m', moe, ...common, '--rpc', stockEp, '-ot', `ffn_.*_exps=RPC0[${stockEp}]`],
    300_000,
  );
  const localAnchor = { name: 'llama-bench tg128 local (all on one GPU)', unit: 'tok/s', samples: local.tg };
  h.add(
    makeFigure({
      name: `upstream MoE experts on stock ggml-rpc-server decode, ${label} (llama-bench -ot ffn_.*_exps=RPC0)`,
      unit: 'tok/s',
      samples: upstream.tg,
      anchor: { name: 'llama-bench tg128 local', unit: 'tok/s', samples: local.tg },
    }),
  );
  const peerRpc = await freeLoopbackPort();
  const peer = await c.startEngine(['--rpc-port', String(peerRpc)], { state: 'empty', timeoutMs: 60_000 });
  const headRpc = await freeLoopbackPort();
  const head = await c.startEngine([
    ...c.servingArgs(moe),
    '--rpc',
    `127.0.0.1:${peerRpc}`,
    '--rpc-port',
    String(headRpc),
  ]);
  const hc = await HydraClient.connect({ port: headRpc, timeoutMs: 60_000 });
  try {
    (c.notes.combine as { placements: Record<string, unknown> }).placements[label] = await placementOf(
      head.url,
    );
    await hc.call('SET_EXPERT_MODE', { mode: 'combined' });
    const combined = await c.httpRates(head.url);
    h.add(
      makeFigure({
        name: `COMBINE MoE decode, experts on the peer engine, ${label}, head engine HTTP stream`,
        unit: 'tok/s',
        samples: combined.decode,
        anchor: localAnchor,
        limit: { name: 'goal: 0.85x of local decode', unit: 'tok/s', value: 0.85 * median(local.tg) },
      }),
    );
    await hc.call('SET_EXPERT_MODE', { mode: 'solo' });
    const solo = await c.httpRates(head.url);
    h.add(
      makeFigure({
        name: `MoE decode after SET_EXPERT_MODE solo, ${label}, head engine HTTP stream`,
        unit: 'tok/s',
        samples: solo.decode,
        anchor: localAnchor,
      }),
    );
    // Flips during a stream: the stream must finish with every token; each flip's round trip kept.
    const flips: number[] = [];
    const streams: number[] = [];
    for (let r = 0; r < opts.reps; r++) {
      const done = complete(head.url, promptOf(16, 50 + r), 256);
      for (let i = 0; i < 6; i++) {
        await sleep(60);
        const t = performance.now();
        await hc.call('SET_EXPERT_MODE', { mode: i % 2 ? 'solo' : 'combined' });
        flips.push(performance.now() - t);
      }
      const d = await done;
      if (d.completion !== 256)
        throw new Error(`a stream with flips ended after ${d.completion} of 256 tokens`);
      streams.push(((d.completion - 1) * 1000) / d.decodeMs);
    }
    h.add(
      makeFigure({
        name: `SET_EXPERT_MODE flip during a stream, ${label}: round trip`,
        unit: 'ms',
        samples: flips,
        limit: { name: 'goal: under 100 ms', unit: 'ms', value: 100 },
      }),
    );
    h.add(
      makeFigure({
        name: `MoE decode of a stream with 6 expert-placement flips, ${label}, head engine HTTP`,
        unit: 'tok/s',
        samples: streams,
        anchor: localAnchor,
      }),
    );
  } finally {
    await hc.close();
    await h.processes.stop(head.child);
    await h.processes.stop(peer.child);
  }
}
