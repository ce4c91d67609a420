// Per-peer accounting of the ggml-RPC path (issue 28): a head with every layer on a peer engine
// reports, per peer, the commands it sent, the round trips, the kernel's byte counts and the time
// it waited, in STATUS and in /metrics (promtool-clean), and per decode step.
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Proc, spawnEngine } from './combine-helpers.js';
import { tinyModel } from './helpers.js';

interface Accounting {
  commands: Record<string, number>;
  round_trips: number;
  wait_reply_ms: number;
  wait_send_ms: number;
  serialize_ms: number;
  tcp: { bytes_sent: number; bytes_received: number; rtt_us: number } | null;
  per_step: {
    steps: number;
    commands: number;
    round_trips: number;
    bytes_sent: number;
    bytes_received: number;
    wait_ms: number;
  } | null;
}

const status = async (url: string) =>
  (await fetch(`${url}/control/status`).then((r) => r.json())) as {
    peers: { endpoint: string; accounting: Accounting | null }[];
  };

const complete = (url: string, n: number) =>
  fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'hello there', max_tokens: n, temperature: 0, ignore_eos: true }),
  }).then((r) => r.status);

function series(text: string, name: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  if (line === undefined) throw new Error(`no ${name} in /metrics`);
  return Number(line.slice(name.length + 1));
}

describe('ggml-RPC accounting per peer', () => {
  let peer: Proc;
  let head: Proc;
  beforeAll(async () => {
    const model = await tinyModel();
    peer = await spawnEngine([]);
    head = await spawnEngine(['-m', model, '-c', '512', '--rpc', peer.rpc, '--device', 'RPC0', '-ngl', '99']);
  });
  afterAll(() => {
    head?.child.kill('SIGKILL');
    peer?.child.kill('SIGKILL');
  });

  it('STATUS counts the commands, round trips, bytes and waits of each decode step', async () => {
    const before = (await status(head.url)).peers[0]!;
    expect(before.endpoint).toBe(peer.rpc);
    const a = before.accounting!;
    // The load itself went over the same connection: buffers allocated, weights set.
    expect(a.commands.alloc_buffer).toBeGreaterThan(0);
    expect(a.tcp).not.toBeNull();
    expect(await complete(head.url, 24)).toBe(200);
    const after = (await status(head.url)).peers[0]!.accounting!;
    // Every step computes the whole model on the peer (a graph, or the same one again) and reads
    // its output back: at least one graph and one reply per generated token.
    const graphs = (c: Record<string, number>) => c.graph_compute! + c.graph_recompute!;
    expect(graphs(after.commands) - graphs(a.commands)).toBeGreaterThanOrEqual(24);
    expect(after.commands.get_tensor! - a.commands.get_tensor!).toBeGreaterThanOrEqual(24);
    expect(after.round_trips - a.round_trips).toBeGreaterThanOrEqual(24);
    // The kernel saw more come back than the replies' 8-byte headers (the tiny model's logits: 4 kB).
    expect(after.tcp!.bytes_received - a.tcp!.bytes_received).toBeGreaterThan(24 * 8);
    expect(after.tcp!.bytes_sent - a.tcp!.bytes_sent).toBeGreaterThan(24 * 9);
    expect(after.wait_reply_ms).toBeGreaterThan(a.wait_reply_ms);
    expect(after.serialize_ms).toBeGreaterThanOrEqual(a.serialize_ms);
  });

  it('gives per-step averages over a window and per-peer metrics that promtool accepts', async () => {
    // Two reads at least a window (1 s) apart around decode steps.
    await status(head.url);
    expect(await complete(head.url, 16)).toBe(200);
    await new Promise((r) => setTimeout(r, 1100));
    await status(head.url);
    expect(await complete(head.url, 16)).toBe(200);
    await new Promise((r) => setTimeout(r, 1100));
    const s = (await status(head.url)).peers[0]!.accounting!;
    expect(s.per_step).not.toBeNull();
    const p = s.per_step!;
    expect(p.steps).toBeGreaterThan(0);
    expect(p.round_trips).toBeGreaterThanOrEqual(1);
    expect(p.commands).toBeGreaterThan(p.round_trips);
    expect(p.bytes_received).toBeGreaterThan(8);
    expect(p.wait_ms).toBeGreaterThan(0);

    const text = await (await fetch(`${head.url}/metrics`)).text();
    const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
    if (r.error)
      throw new Error(`promtool is not installed (apt-get install prometheus): ${r.error.message}`);
    expect(`${r.stdout}${r.stderr}`).toBe('');
    expect(r.status).toBe(0);
    const peerLabel = `peer="${peer.rpc}"`;
    expect(series(text, `hydra_peer_rpc_round_trips_total{${peerLabel}}`)).toBeGreaterThan(40);
    expect(series(text, `hydra_peer_rpc_commands_total{${peerLabel},command="get_tensor"}`)).toBeGreaterThan(
      40,
    );
    expect(series(text, `hydra_peer_rpc_received_bytes_total{${peerLabel}}`)).toBeGreaterThan(0);
    expect(series(text, `hydra_peer_rpc_sent_bytes_total{${peerLabel}}`)).toBeGreaterThan(0);
    expect(series(text, `hydra_peer_rpc_wait_seconds_total{${peerLabel},on="reply"}`)).toBeGreaterThan(0);
    // The peer itself sent nothing over ggml-RPC: no peer series there.
    const peerText = await (await fetch(`${peer.url}/metrics`)).text();
    expect(peerText).not.toMatch(/^hydra_peer_rpc_round_trips_total\{/m);
  });
});
