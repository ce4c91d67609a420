import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { type StockRpcServer, stockRpcServer } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { complete, freePort } from './control-helpers.js';
import { engineWith, tinyModel } from './helpers.js';

// The minimal COMBINE request, {model, mode, peer}, goes through the resolver's unified table.
let peer: StockRpcServer | undefined;
let peerEndpoint: string;
let engine: Awaited<ReturnType<typeof engineWith>>;
let client: HydraClient;

beforeAll(async () => {
  const model = await tinyModel();
  peer = await stockRpcServer();
  peerEndpoint = peer.endpoint;
  const config = join(dirname(model), 'registry.yaml');
  writeFileSync(config, `models:\n  tiny:\n    path: ${model}\n    tensor_split: [1, 1]\n`);
  const port = await freePort();
  engine = await engineWith(['--config', config, '--rpc-port', String(port), '-c', '512']);
  client = await HydraClient.connect({ port, encoding: 'json', timeoutMs: 60_000 });
}, 90_000);

afterAll(async () => {
  client?.close();
  await engine?.close();
  await peer?.stop();
});

it('{model, mode: "combined", peer} loads the dense row of the table; {mode: "solo"} leaves COMBINE', async () => {
  const combined = (await client.configure({ model: 'tiny', mode: 'combined', peer: peerEndpoint })) as {
    tier: string;
    params_applied: Record<string, unknown>;
  };
  expect(combined.tier).toBe('T3');
  expect(combined.params_applied).toMatchObject({
    model: 'tiny',
    n_gpu_layers: 99,
    split_mode: 'layer',
    tensor_split: [1, 1],
    rpc_servers: [peerEndpoint],
  });
  const st = (await client.status()) as { state: string; mode: string; applied: Record<string, unknown> };
  expect(st.state).toBe('ready');
  expect(st.mode).toBe('combined');
  expect((await complete(engine.url, { prompt: 'Hello world', max_tokens: 4, temperature: 0 })).status).toBe(
    200,
  );

  const solo = (await client.configure({ model: 'tiny', mode: 'solo' })) as {
    params_applied: Record<string, unknown>;
  };
  expect(solo.params_applied).toMatchObject({ split_mode: 'none', rpc_servers: [] });
  expect(((await client.status()) as { mode: string }).mode).toBe('solo');
}, 90_000);

it('rejects a COMBINE without a peer, or a mode without a model, and changes nothing', async () => {
  const before = ((await client.status()) as { epoch: number }).epoch;
  await expect(client.configure({ model: 'tiny', mode: 'combined' })).rejects.toMatchObject({
    code: 'HYDRA_ERR_BAD_VALUE',
  });
  await expect(client.configure({ mode: 'solo' })).rejects.toMatchObject({ code: 'HYDRA_ERR_BAD_VALUE' });
  await expect(client.configure({ model: 'tiny', mode: 'sideways' })).rejects.toMatchObject({
    code: 'HYDRA_ERR_BAD_VALUE',
  });
  // One spelling, STATUS's and SET_EXPERT_MODE's: "combine" is refused, not read as "combined".
  await expect(
    client.configure({ model: 'tiny', mode: 'combine', peer: peerEndpoint }),
  ).rejects.toMatchObject({
    code: 'HYDRA_ERR_BAD_VALUE',
  });
  expect(((await client.status()) as { epoch: number }).epoch).toBe(before);
});
