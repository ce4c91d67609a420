import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type ClientResult,
  CPU_PEER,
  hasGpu,
  maxAbsDiff,
  rpcClient,
  startFdServer,
  startStockRpcServer,
  tinyModel,
} from './helpers.js';

const PROMPT = 'Hello world, this is a test';

describe('ggml-RPC served on a handed-over fd', () => {
  let model: string;
  let local: ClientResult;
  beforeAll(async () => {
    model = await tinyModel('f32');
    local = await rpcClient(model, PROMPT);
  }, 120_000);

  describe('through serveRpcFd (peek, detach, worker thread)', () => {
    let server: Awaited<ReturnType<typeof startFdServer>>;
    beforeAll(async () => {
      server = await startFdServer(CPU_PEER);
    });
    afterAll(() => server.close());

    it.each([
      ['all layers', 99],
      ['half the layers', 2],
    ])(
      '%s on the RPC device give the local logits (1e-4) and tokens',
      async (_, ngl) => {
        const remote = await rpcClient(model, PROMPT, `127.0.0.1:${server.port}`, ngl);
        expect(maxAbsDiff(remote.logits, local.logits)).toBeLessThan(1e-4);
        expect(remote.generated).toEqual(local.generated);
        // The peeked byte was left in the stream: ggml-RPC read its own HELLO, and every session
        // (the probe and the client) started with it.
        expect(server.firstBytes.every((b) => b === 0x0e)).toBe(true);
        const summaries = (await Promise.all(server.sessions)) as {
          commands: number;
          setTensorBytes: number;
          bytesIn: number;
        }[];
        const busiest = summaries.reduce((a, b) => (a.commands > b.commands ? a : b));
        expect(busiest.commands).toBeGreaterThan(10);
        expect(busiest.setTensorBytes).toBeGreaterThan(0);
        expect(busiest.bytesIn).toBeGreaterThan(busiest.setTensorBytes);
      },
      120_000,
    );

    it('closes a connection whose first byte is not HELLO without serving it', async () => {
      const before = server.sessions.length;
      const socket = connect(server.port, '127.0.0.1');
      socket.on('error', () => undefined);
      socket.write(Buffer.from([0x31, 0, 0, 0, 0, 0, 0, 0, 0]));
      await new Promise((resolve) => socket.on('close', resolve));
      expect(server.firstBytes.at(-1)).toBe(0x31);
      expect(server.sessions.length).toBe(before);
    });
  });

  describe('the stock upstream ggml-rpc-server from the same pin', () => {
    it('gives the same logits and tokens (interop baseline)', async () => {
      const stock = await startStockRpcServer(CPU_PEER);
      try {
        const remote = await rpcClient(model, PROMPT, stock.endpoint, 99);
        expect(maxAbsDiff(remote.logits, local.logits)).toBeLessThan(1e-4);
        expect(remote.generated).toEqual(local.generated);
      } finally {
        stock.child.kill('SIGKILL');
      }
    }, 120_000);
  });

  // On a GPU machine: a peer serving its GPU computes what the same GPU computes locally.
  describe.runIf(hasGpu())('a peer serving its GPU', () => {
    let server: Awaited<ReturnType<typeof startFdServer>>;
    beforeAll(async () => {
      server = await startFdServer(['CUDA0']);
    });
    afterAll(() => server.close());

    it('all layers on the peer GPU give the local GPU logits (1e-4) and tokens', async () => {
      const localGpu = await rpcClient(model, PROMPT, 'local-gpu', 99);
      const remote = await rpcClient(model, PROMPT, `127.0.0.1:${server.port}`, 99);
      expect(maxAbsDiff(remote.logits, localGpu.logits)).toBeLessThan(1e-4);
      expect(remote.generated).toEqual(localGpu.generated);
    }, 120_000);
  });
});
