import { afterAll, expect, it } from 'vitest';
import { freeLoopbackPort } from '../src/ports.js';
import { engineWith, tinyModel } from './helpers.js';

// A head engine and its peer in one process: the head's calls that talk to the peer (registering it,
// asking its device memory) must stay off the JS thread, which is also the one accepting the peer's
// connections. They once ran on it, and the process hung.
const engines: { close(): Promise<void> }[] = [];
afterAll(async () => {
  for (const e of engines.reverse()) await e.close();
});

it('runs a head engine and its peer engine in one process', async () => {
  const model = await tinyModel();
  // --rpc-port 0 means off: take a port that is free now.
  const peer = await engineWith(['--rpc-port', String(await freeLoopbackPort())]);
  engines.push(peer);
  expect(peer.rpcPort).toBeGreaterThan(0);
  const head = await engineWith([
    '-m',
    model,
    '--rpc',
    `127.0.0.1:${peer.rpcPort}`,
    '-ngl',
    '99',
    '-c',
    '512',
  ]);
  engines.push(head);
  const health = (await (await fetch(`${head.url}/health`)).json()) as {
    state: string;
    placement?: { device: string }[];
  };
  expect(health.state).toBe('ready');
  expect(health.placement?.map((r) => r.device)).toContain('RPC0');
  const res = await fetch(`${head.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'the water', max_tokens: 4, ignore_eos: true, temperature: 0 }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { usage: { completion_tokens: number } };
  expect(body.usage.completion_tokens).toBe(4);
}, 60_000);
