import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI, engineWith, tinyModel } from './helpers.js';
import {
  createNetnsPair,
  destroyNetnsPair,
  httpUnix,
  type NetnsPair,
  type NsProc,
  netnsUnavailable,
  relay,
  setLink,
  spawnInNs,
  streamUnix,
  waitForLog,
} from './netns-helpers.js';

// Fixed numbers are safe: each namespace has its own port space.
const HTTP_PORT = 8080;
const RPC_PORT = 50052;
const PROMPTS = ['Hello world, this is a test', 'The quick brown fox'];
const GREEDY = { max_tokens: 16, temperature: 0, ignore_eos: true };

interface TwoHosts {
  pair: NetnsPair;
  head: NsProc;
  /** The head's HTTP, reached through the relay's unix socket. */
  socket: string;
  peerRpc: string;
}

async function greedy(socket: string, prompt: string): Promise<{ status: number; text: string }> {
  const { status, json } = await httpUnix(socket, 'POST', '/v1/completions', { prompt, ...GREEDY });
  return { status, text: json.choices?.[0]?.text ?? '' };
}

/**
 * Head and peer as two hosts: each engine in its own network namespace, the only path between
 * them a veth pair (10.213.x.1/30 head, .2/30 peer). The peer's merged port binds its veth
 * address and admits only the head's; the head's HTTP stays on its namespace's loopback, which
 * the test reaches through a unix-socket relay, so taking the veth down cuts the peer and nothing
 * else.
 */
describe('COMBINE across two network namespaces joined by a veth pair', () => {
  let unavailable: string | undefined;
  let tiny: string;
  let solo: { status: number; text: string }[];
  let first: TwoHosts;
  const pairs: NetnsPair[] = [];
  const procs: NsProc[] = [];

  async function startTwoHosts(): Promise<TwoHosts> {
    const pair = createNetnsPair(pairs.length);
    pairs.push(pair);
    const peer = spawnInNs(pair.peer, [
      process.execPath,
      CLI,
      '--host',
      pair.peerAddr,
      '--port',
      String(HTTP_PORT),
      '--rpc-port',
      String(RPC_PORT),
      '--control-allow-from',
      `${pair.headAddr}/32,127.0.0.0/8`,
      '--progress',
      'off',
      '-t',
      '1',
    ]);
    procs.push(peer);
    await waitForLog(peer, /merged ggml-RPC\/Hydra port on /, 30_000);
    const peerRpc = `${pair.peerAddr}:${RPC_PORT}`;
    // Layers 2-3 and the output on the peer, as in combine.test.ts.
    const head = spawnInNs(pair.head, [
      process.execPath,
      CLI,
      '--port',
      String(HTTP_PORT),
      '-m',
      tiny,
      '--rpc',
      peerRpc,
      '--device',
      'RPC0',
      '-ngl',
      '3',
      '-c',
      '4096',
      '--progress',
      'off',
      '-t',
      '1',
    ]);
    procs.push(head);
    await waitForLog(head, /model ready: /, 60_000);
    const r = await relay(pair, pair.head, HTTP_PORT);
    procs.push(r);
    return { pair, head, socket: r.socket, peerRpc };
  }

  /** Streams a long greedy generation and takes `side`'s veth down at its first token. */
  async function linkDownMidStream(hosts: TwoHosts, side: 'head' | 'peer'): Promise<void> {
    const { socket } = hosts;
    let downAt = 0;
    const started = performance.now();
    const out = await streamUnix(
      socket,
      { prompt: PROMPTS[0], ...GREEDY, max_tokens: 4000 },
      () => {
        downAt = performance.now();
        setLink(hosts.pair, side, 'down');
      },
      30_000,
    );
    const ended = performance.now();
    expect(downAt).toBeGreaterThan(0);
    expect(out.error?.code).toBe('HYDRA_ERR_PEER_LOST');
    expect(out.finish).toBeUndefined();
    expect(ended - started).toBeLessThan(20_000);

    let health: any;
    const end = Date.now() + 10_000;
    while (Date.now() < end) {
      health = (await httpUnix(socket, 'GET', '/health', undefined, 5_000)).json;
      if (health.state === 'ready' && health.status === 'degraded') break;
      await new Promise((r) => setTimeout(r, 25));
    }
    expect(health).toMatchObject({ state: 'ready', status: 'degraded' });
    expect(health.degraded.reason).toMatch(/peer|ggml-RPC/);
    const again = await greedy(socket, PROMPTS[0]!);
    const recovered = performance.now() - downAt;
    console.log(
      `netns, ${side} veth down: request ended ${(ended - downAt).toFixed(0)} ms after the link went down; SOLO answered ${recovered.toFixed(0)} ms after it`,
    );
    expect(again).toEqual(solo[0]);
    expect(recovered).toBeLessThan(10_000);

    const status = (await httpUnix(socket, 'GET', '/control/status')).json;
    expect(status).toMatchObject({ success: true, mode: 'solo', peers: [] });
    expect(status.degraded.peers).toEqual([hosts.peerRpc]);
    expect(hosts.head.child.exitCode).toBeNull();
  }

  beforeAll(async () => {
    unavailable = netnsUnavailable();
    if (unavailable) return;
    tiny = await tinyModel();
    // SOLO reference in this process, before any RPC device exists here.
    const e = await engineWith(['-m', tiny]);
    solo = [];
    for (const prompt of PROMPTS) {
      const res = await fetch(`${e.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt, ...GREEDY }),
      });
      const body = (await res.json()) as { choices: { text: string }[] };
      solo.push({ status: res.status, text: body.choices[0]!.text });
    }
    await e.close();
    first = await startTwoHosts();
  }, 120_000);

  afterAll(async () => {
    for (const p of procs.reverse()) await p.kill();
    for (const pair of pairs) destroyNetnsPair(pair);
  });

  it('dense layer split over the veth gives the SOLO greedy text', async (ctx) => {
    if (unavailable) ctx.skip(unavailable);
    for (const [i, p] of PROMPTS.entries()) expect(await greedy(first.socket, p)).toEqual(solo[i]);
    const status = (await httpUnix(first.socket, 'GET', '/control/status')).json;
    expect(status).toMatchObject({ success: true, mode: 'combined' });
    expect(status.degraded).toBeUndefined();
    expect(JSON.stringify(status.peers)).toContain(first.peerRpc);
  }, 60_000);

  it("the head's veth down mid-stream is peer loss: HYDRA_ERR_PEER_LOST, degraded, SOLO within 10 s", async (ctx) => {
    if (unavailable) ctx.skip(unavailable);
    await linkDownMidStream(first, 'head');
  }, 60_000);

  it("the peer's veth down mid-stream (head sees no carrier) is peer loss too", async (ctx) => {
    if (unavailable) ctx.skip(unavailable);
    await linkDownMidStream(await startTwoHosts(), 'peer');
  }, 120_000);
});
