// MoE COMBINED on the wire (issue 28): what each decode step sends to the peer that holds the
// experts, counted by the head's per-peer accounting (/metrics hydra_peer_rpc_commands_total), for
// the COMBINED placement and for upstream's own `-ot ffn_.*_exps=RPC0[...]` in the same engine,
// against a stock ggml-rpc-server (the stock wire) and a peer engine; greedy text equal to SOLO.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { type StockRpcServer, stockRpcServer } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Proc, spawnEngine } from './combine-helpers.js';

const PROMPT = 'Hello world, this is a test';
// The tiny MoE shape: every one of its 4 blocks holds experts.
const MOE_LAYERS = 4;

async function greedy(url: string, prompt: string, maxTokens: number): Promise<string> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      prompt,
      max_tokens: maxTokens,
      temperature: 0,
      ignore_eos: true,
      cache_prompt: false,
    }),
  });
  expect(res.status).toBe(200);
  return ((await res.json()) as { choices: { text: string }[] }).choices[0]!.text;
}

/** The head's commands to `peer` by type, its decode steps and its generated tokens. */
async function counters(url: string, peer: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out: Record<string, number> = {};
  const re = new RegExp(
    `^hydra_peer_rpc_commands_total\\{peer="${peer}",command="([a-z_]+)"\\} (\\S+)$`,
    'gm',
  );
  for (const m of text.matchAll(re)) out[m[1]!] = Number(m[2]);
  out.steps = Number(/^hydra_decode_steps_total (\S+)$/m.exec(text)?.[1]);
  out.tokens = Number(/^hydra_generated_tokens_total (\S+)$/m.exec(text)?.[1]);
  return out;
}

/**
 * The counters once the engine's bookkeeping has caught up with the requests answered: the step
 * and token counters are updated after a reply goes out, and the per-peer figures are one native
 * read shared by scrapes 50 ms apart, so read until `tokens` are counted and two reads 100 ms
 * apart agree (bounded: 5 s).
 */
async function settled(url: string, peer: string, tokens: number): Promise<Record<string, number>> {
  let last = await counters(url, peer);
  for (let i = 0; i < 50; i++) {
    await new Promise((r) => setTimeout(r, 100));
    const now = await counters(url, peer);
    if (now.tokens! >= tokens && JSON.stringify(now) === JSON.stringify(last)) return now;
    last = now;
  }
  throw new Error(`counters of ${url} did not settle at ${tokens} tokens: ${JSON.stringify(last)}`);
}

/**
 * Commands per decode step over one greedy request of 16 tokens after a warm-up (the first
 * request after a load also allocates). Every step of it, the prefill of the short prompt
 * included, is one graph of the same splits, so the quotient is exact.
 */
async function perStep(url: string, peer: string): Promise<{ text: string; per: Record<string, number> }> {
  await greedy(url, 'warm up the graphs', 4);
  const c0 = await settled(url, peer, 4);
  const text = await greedy(url, PROMPT, 16);
  const c1 = await settled(url, peer, c0.tokens! + 16);
  const steps = c1.steps! - c0.steps!;
  expect(steps).toBe(16);
  const per: Record<string, number> = {};
  for (const k of Object.keys(c1)) {
    const d = (c1[k]! - c0[k]!) / steps;
    if (d !== 0 && k !== 'steps' && k !== 'tokens') per[k] = d;
  }
  return { text, per };
}

describe('MoE COMBINED: what each decode step sends to the experts peer', () => {
  let moe: string;
  const stocks: StockRpcServer[] = [];
  let peer: Proc | undefined;
  let solo: string;
  const procs: Proc[] = [];

  async function head(flags: string[]): Promise<Proc> {
    const h = await spawnEngine(['-m', moe, '-c', '512', ...flags]);
    procs.push(h);
    return h;
  }
  async function stop(h: Proc): Promise<void> {
    if (h.child.exitCode !== null || h.child.signalCode !== null) return;
    const gone = new Promise((r) => h.child.once('exit', r));
    h.child.kill('SIGKILL');
    await gone;
  }

  beforeAll(async () => {
    moe = join(mkdtempSync(join(tmpdir(), 'hydra-moe-wire-')), 'moe.gguf');
    await writeSyntheticModel({ arch: 'moe', shape: 'tiny', quant: 'q8_0', seed: 3, out: moe });
    const s = await head([]);
    solo = await greedy(s.url, PROMPT, 16);
    await stop(s);
    peer = await spawnEngine([]);
    procs.push(peer);
  }, 90_000);
  afterAll(async () => {
    for (const p of procs.reverse()) await stop(p);
    for (const s of stocks) await s.stop();
  });

  it('COMBINED sends two inputs per MoE layer (the norm and the residual), upstream -ot three', async () => {
    // A stock server per head: it serves one client at a time, and a client killed while it
    // writes a reply can end it (SIGPIPE).
    const onStock = async (flags: (ep: string) => string[]) => {
      const stock = await stockRpcServer({ threads: 1, timeoutMs: 10_000 });
      stocks.push(stock);
      const h = await head(['--rpc', stock.endpoint, '-ngl', '0', ...flags(stock.endpoint)]);
      const r = await perStep(h.url, stock.endpoint);
      await stop(h);
      return r;
    };
    const c = await onStock(() => []);
    const u = await onStock((ep) => ['-ot', `ffn_.*_exps=RPC0[${ep}]`]);
    // One expert split per MoE layer either way: its graph and one read of the layer's output.
    for (const r of [c, u]) {
      expect(r.per.graph_compute).toBe(MOE_LAYERS);
      expect(r.per.get_tensor).toBe(MOE_LAYERS);
      expect(r.text).toBe(solo);
    }
    // Upstream's placement also ships the router logits and a reshaped copy of the normed input.
    expect(u.per.set_tensor).toBe(3 * MOE_LAYERS);
    expect(c.per.set_tensor).toBe(2 * MOE_LAYERS);
  }, 120_000);

  it('COMBINED with the local devices named (--device CPU) keeps the peer device for the experts', async () => {
    // Without the peer's device in the load's list, llama.cpp has no backend for the experts'
    // buffer and aborts the context build; with it, the layers stay local (no offload to it).
    const h = await head(['--rpc', peer!.rpc, '--device', 'CPU', '-ngl', '99']);
    const r = await perStep(h.url, peer!.rpc);
    const st = (await fetch(`${h.url}/control/status`).then((x) => x.json())) as {
      placement: { device: string }[];
    };
    await stop(h);
    expect(r.text).toBe(solo);
    expect(r.per).toEqual({ graph_compute: MOE_LAYERS, get_tensor: MOE_LAYERS, set_tensor: 2 * MOE_LAYERS });
    expect(st.placement.map((p) => p.device)).toEqual(['CPU']);
  }, 120_000);
});
