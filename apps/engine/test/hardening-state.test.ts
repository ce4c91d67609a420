import { HydraClient, OPCODES } from '@hydra-engine/hydra-rpc';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { complete, freePort } from './control-helpers.js';
import { engineWith, tinyModel, waitFor } from './helpers.js';

type Running = Awaited<ReturnType<typeof engineWith>>;

// MessagePack written by hand (the spec's int64 0xd3, uint64 0xcf, bin32 0xc6, fixstr, fixmap),
// because an encoder picks the shortest integer form and would never send what other clients do.
type Wire = { int64: bigint } | { uint64: bigint } | Uint8Array;
function msgpackMap(fields: Record<string, Wire>): Buffer {
  const parts: Buffer[] = [Buffer.from([0x80 | Object.keys(fields).length])];
  for (const [key, value] of Object.entries(fields)) {
    parts.push(Buffer.from([0xa0 | key.length]), Buffer.from(key));
    if (value instanceof Uint8Array) {
      const head = Buffer.alloc(5);
      head[0] = 0xc6;
      head.writeUInt32BE(value.length, 1);
      parts.push(head, Buffer.from(value));
    } else {
      const b = Buffer.alloc(9);
      if ('int64' in value) {
        b[0] = 0xd3;
        b.writeBigInt64BE(value.int64, 1);
      } else {
        b[0] = 0xcf;
        b.writeBigUInt64BE(value.uint64, 1);
      }
      parts.push(b);
    }
  }
  return Buffer.concat(parts);
}

const TIMEOUT_MS = 300;
const MAX_UPLOADS = 100_000_000;
let eng: Running;
let client: HydraClient;

beforeAll(async () => {
  const port = await freePort();
  eng = await engineWith([
    '-m',
    await tinyModel(),
    '-np',
    '2',
    '-c',
    '1024',
    '--rpc-port',
    String(port),
    '--state-timeout-ms',
    String(TIMEOUT_MS),
    '--max-state-upload-bytes',
    String(MAX_UPLOADS),
  ]);
  client = await HydraClient.connect({ port, encoding: 'msgpack' });
  // Slot 0 gets a cached prompt, so its state is more than a few bytes.
  const r = await complete(eng.url, {
    prompt: 'The quick brown fox',
    max_tokens: 4,
    slot_id: 0,
    cache_prompt: true,
  });
  expect(r.status).toBe(200);
}, 60_000);
afterAll(async () => {
  client?.close();
  await eng?.close();
});

describe('STATE_GET / STATE_PUT hardening', () => {
  it('accept MessagePack int64 and uint64 integers, as CONFIGURE does', async () => {
    const got = await client.requestRaw(
      OPCODES.STATE_GET,
      msgpackMap({ slot: { int64: 0n }, offset: { uint64: 0n }, chunk_size: { int64: 64n * 1024n * 1024n } }),
    );
    expect(got).toMatchObject({ success: true, offset: 0 });
    const data = got.data as Uint8Array;
    expect(data.length).toBe(got.total);
    const put = await client.requestRaw(
      OPCODES.STATE_PUT,
      msgpackMap({
        slot: { uint64: 1n },
        offset: { int64: 0n },
        total: { int64: BigInt(data.length) },
        data,
      }),
    );
    expect(put).toMatchObject({ success: true, received: data.length, complete: true });
    // Out of range stays out of range: a huge uint64 is a bad value, not a wrapped number.
    const bad = await client.requestRaw(
      OPCODES.STATE_GET,
      msgpackMap({ slot: { uint64: 2n ** 63n }, offset: { uint64: 0n } }),
    );
    expect(bad).toMatchObject({ success: false, error: { code: 'HYDRA_ERR_BAD_VALUE' } });
  });

  it('an abandoned upload is freed after --state-timeout-ms; its next chunk says HYDRA_ERR_STATE_EXPIRED', async () => {
    const chunk = new Uint8Array(1 << 20);
    expect(await client.statePut({ slot: 0, offset: 0, total: 64 << 20, data: chunk })).toMatchObject({
      received: 1 << 20,
      complete: false,
    });
    expect(eng.controller.stateTransfers).toMatchObject({ uploads: 1, bytes: 1 << 20 });
    const t0 = Date.now();
    await waitFor(async () => eng.controller.stateTransfers.bytes === 0, 5000);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(TIMEOUT_MS - 50);
    await expect(
      client.statePut({ slot: 0, offset: 1 << 20, total: 64 << 20, data: chunk }),
    ).rejects.toMatchObject({ code: 'HYDRA_ERR_STATE_EXPIRED' });
    // Starting again at offset 0 works.
    expect(await client.statePut({ slot: 0, offset: 0, total: 2 << 20, data: chunk })).toMatchObject({
      complete: false,
    });
  });

  it('a chunk keeps an upload alive: an upload that keeps moving never expires', async () => {
    const chunk = new Uint8Array(64 * 1024);
    const total = 8 * chunk.length;
    let received = 0;
    // Seven chunks half a timeout apart: 3.5 timeouts in all, never one without a chunk.
    for (let i = 0; i < 7; i++) {
      await new Promise((r) => setTimeout(r, TIMEOUT_MS / 2));
      const r = await client.statePut({ slot: 1, offset: received, total, data: chunk });
      received += chunk.length;
      expect(r).toMatchObject({ received, complete: false });
    }
    expect(eng.controller.stateTransfers.bytes).toBe(7 * chunk.length);
    await waitFor(async () => eng.controller.stateTransfers.uploads === 0, 5000);
  });

  it('unfinished uploads together declare at most --max-state-upload-bytes: HYDRA_ERR_STATE_UPLOADS_FULL', async () => {
    const small = new Uint8Array(1024);
    const half = 60_000_000;
    await client.statePut({ slot: 0, offset: 0, total: half, data: small });
    await expect(client.statePut({ slot: 1, offset: 0, total: half, data: small })).rejects.toMatchObject({
      code: 'HYDRA_ERR_STATE_UPLOADS_FULL',
    });
    // A slot restarting its own upload replaces it and does not count twice.
    await client.statePut({ slot: 0, offset: 0, total: half, data: small });
    expect(eng.controller.stateTransfers).toMatchObject({ uploads: 1, bytes: 1024 });
    await waitFor(async () => eng.controller.stateTransfers.uploads === 0, 5000);
    await client.statePut({ slot: 1, offset: 0, total: half, data: small });
    await waitFor(async () => eng.controller.stateTransfers.uploads === 0, 5000);
  });

  it('an unread STATE_GET snapshot is dropped after the timeout too', async () => {
    const first = await client.stateGet({ slot: 0, offset: 0, chunk_size: 1024 });
    expect(first.total).toBeGreaterThan(1024);
    expect(eng.controller.stateTransfers.snapshots).toBe(1);
    await waitFor(async () => eng.controller.stateTransfers.snapshots === 0, 5000);
    await expect(client.stateGet({ slot: 0, offset: 1024, chunk_size: 1024 })).rejects.toMatchObject({
      code: 'HYDRA_ERR_STATE_EXPIRED',
    });
  });
});
