import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { addRpcServer, initBackend, Model } from '../src/index.js';
import { freePort, tinyModel } from './helpers.js';

describe('bad input gets a clear error with a code and leaves the process usable', () => {
  let good: string;
  const dir = mkdtempSync(join(tmpdir(), 'hydra-bad-'));
  beforeAll(async () => {
    initBackend();
    good = await tinyModel('q8_0');
  });

  async function stillWorks() {
    const m = await Model.load({ path: good });
    expect(m.info.nLayer).toBeGreaterThan(0);
    m.dispose();
  }

  it('missing file', async () => {
    await expect(Model.load({ path: join(dir, 'nope.gguf') })).rejects.toMatchObject({
      code: 'HYDRA_ERR_LOAD_FAILED',
    });
    await stillWorks();
  });

  it('corrupt GGUF: garbage and truncated', async () => {
    const garbage = join(dir, 'garbage.gguf');
    writeFileSync(garbage, Buffer.from('this is not a gguf file at all'.repeat(10)));
    await expect(Model.load({ path: garbage })).rejects.toMatchObject({ code: 'HYDRA_ERR_LOAD_FAILED' });
    const truncated = join(dir, 'truncated.gguf');
    const bytes = readFileSync(good);
    writeFileSync(truncated, bytes.subarray(0, Math.floor(bytes.length / 2)));
    await expect(Model.load({ path: truncated })).rejects.toMatchObject({ code: 'HYDRA_ERR_LOAD_FAILED' });
    await stillWorks();
  });

  it('bad override: syntax, regex and buffer type', async () => {
    await expect(Model.load({ path: good, overrides: ['no-equals-sign'] })).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_OVERRIDE',
    });
    await expect(Model.load({ path: good, overrides: ['blk.(=CPU'] })).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_OVERRIDE',
    });
    await expect(Model.load({ path: good, overrides: ['blk\\..*=NOPE9'] })).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_OVERRIDE',
    });
    const ok = await Model.load({ path: good, overrides: ['token_embd=CPU'] });
    ok.dispose();
  });

  it('unknown device and bad context parameters', async () => {
    await expect(Model.load({ path: good, devices: ['CUDA7'] })).rejects.toMatchObject({
      code: 'HYDRA_ERR_NO_DEVICE',
    });
    const m = await Model.load({ path: good });
    await expect(m.createContext({ typeK: 'q9_9' })).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_ARGUMENT',
    });
    const ctx = await m.createContext({ nCtx: 64, nSeqMax: 1 });
    await expect(ctx.decode([{ seq: 3, pos: 0, tokens: [1] }])).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_ARGUMENT',
    });
    await ctx.dispose();
    m.dispose();
  });

  it('cancelled load', async () => {
    // A tiny model loads before any progress event reaches JS, so only an abort that precedes the
    // load is deterministic here; the native progress hook returns false once cancel() ran.
    const controller = new AbortController();
    controller.abort();
    await expect(Model.load({ path: good }, { signal: controller.signal })).rejects.toMatchObject({
      code: 'HYDRA_ERR_LOAD_CANCELLED',
    });
    await stillWorks();
  });

  it('reports load progress up to 100%', async () => {
    const seen: number[] = [];
    const m = await Model.load({ path: good }, { onProgress: (p) => seen.push(p) });
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(seen.length).toBeGreaterThan(0);
    expect(Math.max(...seen)).toBe(1);
    m.dispose();
  });

  it('unreachable ggml-RPC peer (nothing listens) does not abort the process', async () => {
    const port = await freePort();
    await expect(addRpcServer(`127.0.0.1:${port}`, { timeoutMs: 1000 })).rejects.toMatchObject({
      code: 'HYDRA_ERR_PEER_UNREACHABLE',
    });
    await expect(addRpcServer('not-an-endpoint')).rejects.toMatchObject({ code: 'HYDRA_ERR_BAD_ARGUMENT' });
    await stillWorks();
  });

  it('a peer that answers the HELLO probe and then goes away fails the registration, never hangs it', async () => {
    // Answers one HELLO (the JS probe), then stops listening: llama.cpp's own connection is refused.
    // Upstream aborts the process there; the park hook used to park the registering thread forever.
    const server = createServer((socket: Socket) => {
      server.close();
      socket.once('data', () => {
        const reply = Buffer.alloc(8 + 28);
        reply.writeBigUInt64LE(28n, 0);
        reply[8] = 6; // protocol 6.0.0
        socket.end(reply);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as { port: number };
    await expect(addRpcServer(`127.0.0.1:${port}`, { timeoutMs: 2000 })).rejects.toMatchObject({
      code: 'HYDRA_ERR_PEER_UNREACHABLE',
    });
    await stillWorks();
  }, 20_000);
});
