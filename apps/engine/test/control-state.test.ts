import { HydraClient } from '@hydra-engine/hydra-rpc';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { complete, expectRestoredContinuation, freePort } from './control-helpers.js';
import { engineWith, tinyModel } from './helpers.js';

type Running = Awaited<ReturnType<typeof engineWith>>;
let a: Running;
let b: Running;
let ca: HydraClient;
let cb: HydraClient;

beforeAll(async () => {
  const model = await tinyModel();
  const [pa, pb] = [await freePort(), await freePort()];
  a = await engineWith(['-m', model, '-np', '2', '-c', '1024', '--rpc-port', String(pa)]);
  b = await engineWith(['-m', model, '-np', '2', '-c', '1024', '--rpc-port', String(pb)]);
  ca = await HydraClient.connect({ port: pa, encoding: 'json' });
  cb = await HydraClient.connect({ port: pb, encoding: 'msgpack' });
}, 60_000);
afterAll(async () => {
  ca?.close();
  cb?.close();
  await a?.close();
  await b?.close();
});

const greedy = { temperature: 0, ignore_eos: true, return_tokens: true };

it('STATE_GET then STATE_PUT into a second engine continues identically', async () => {
  const prompt = Array.from(a.engine.tokenize('The quick brown fox jumps over'));
  const reference = await complete(a.url, { ...greedy, prompt, max_tokens: 24 });
  const want: number[] = reference.json.choices[0].tokens;
  expect(want).toHaveLength(24);

  const first = await complete(a.url, { ...greedy, prompt, max_tokens: 12, slot_id: 1, cache_prompt: true });
  const got: number[] = first.json.choices[0].tokens;
  expect(got).toEqual(want.slice(0, 12));

  // Chunked download (JSON, base64) in 64 KiB pieces.
  const parts: Uint8Array[] = [];
  let offset = 0;
  let total = 0;
  do {
    const r = await ca.stateGet({ slot: 1, offset, chunk_size: 65536 });
    total = r.total;
    expect(r.offset).toBe(offset);
    parts.push(r.data);
    offset += r.data.length;
  } while (offset < total);
  expect(parts.length).toBeGreaterThan(1);

  // Chunked upload (MessagePack, bin) into slot 0 of engine B.
  let received = 0;
  for (const [i, part] of parts.entries()) {
    const r = await cb.statePut({ slot: 0, offset: received, total, data: part });
    received += part.length;
    expect(r).toMatchObject({ received, complete: i === parts.length - 1 });
  }

  const cont = [...prompt, ...got];
  await expectRestoredContinuation(
    b.url,
    { ...greedy, prompt: cont, max_tokens: 12, slot_id: 0 },
    want.slice(12),
  );
  await expectRestoredContinuation(
    a.url,
    { ...greedy, prompt: cont, max_tokens: 12, slot_id: 1 },
    want.slice(12),
  );
});

it('a tampered slot state is refused, and so is a busy slot', async () => {
  const prompt = Array.from(a.engine.tokenize('state'));
  await complete(a.url, { ...greedy, prompt, max_tokens: 4, slot_id: 0, cache_prompt: true });
  const s = await ca.stateGet({ slot: 0, chunk_size: 64 * 1024 * 1024 });
  expect(s.data.length).toBe(s.total);
  // Tamper with the token count so the KV and token list disagree.
  const bad = Buffer.from(s.data);
  bad.writeUInt32LE(bad.readUInt32LE(8) + 1, 8);
  await expect(cb.statePut({ slot: 1, offset: 0, total: bad.length, data: bad })).rejects.toMatchObject({
    code: 'HYDRA_ERR_STATE_INVALID',
  });
  const running = complete(b.url, { prompt: 'busy', max_tokens: 400, ignore_eos: true, slot_id: 1 });
  await new Promise((r) => setTimeout(r, 30));
  if (b.engine.slots.busy > 0) {
    await expect(cb.stateGet({ slot: 1 })).rejects.toMatchObject({ code: 'HYDRA_ERR_SLOT_BUSY' });
  }
  expect((await running).status).toBe(200);
});
