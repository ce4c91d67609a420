import { mkdtempSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { rpcWeightsIndexAdd, rpcWeightsIndexInfo } from '../src/index.js';
import { synthHparams, writeSyntheticModel } from '../src/synth/index.js';
import { CPU_PEER, maxAbsDiff, rpcClient, startFdServer } from './helpers.js';

const PROMPT = 'Hello world, this is a test';
const F16 = 2;

/** Bytes a head with every layer remote puts on the peer: all but the token embeddings. */
function peerShareBytes(): number {
  const h = synthHparams('llama', 'small-wide');
  const kv = (h.nEmbd / h.nHead) * h.nHeadKv;
  const layer = (2 * h.nEmbd * h.nEmbd + 2 * h.nEmbd * kv + 3 * h.nEmbd * h.nFf) * F16 + 2 * h.nEmbd * 4;
  return h.nLayer * layer + h.nEmbd * h.nVocab * F16 + h.nEmbd * 4;
}

interface Summary {
  commands: number;
  setTensorBytes: number;
  setTensorHashHits: number;
}

describe('no weight transfer: SET_TENSOR_HASH answered from the peer own GGUF', () => {
  let dir: string;
  let indexed: string;
  let other: string;
  let server: Awaited<ReturnType<typeof startFdServer>>;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'hydra-combine-'));
    indexed = join(dir, 'wide-a.gguf');
    other = join(dir, 'wide-b.gguf');
    await writeSyntheticModel({ arch: 'llama', shape: 'small-wide', quant: 'f16', seed: 7, out: indexed });
    await writeSyntheticModel({ arch: 'llama', shape: 'small-wide', quant: 'f16', seed: 8, out: other });
    server = await startFdServer(CPU_PEER);
  }, 120_000);
  afterAll(() => server.close());

  async function load(
    model: string,
  ): Promise<{ result: Awaited<ReturnType<typeof rpcClient>>; session: Summary }> {
    const before = server.sessions.length;
    const result = await rpcClient(model, PROMPT, `127.0.0.1:${server.port}`, 99);
    const sessions = (await Promise.all(server.sessions.slice(before))) as Summary[];
    const session = sessions.reduce((a, b) => (a.commands > b.commands ? a : b));
    return { result, session };
  }

  it('indexes every tensor above the hash threshold, once', async () => {
    const added = await rpcWeightsIndexAdd(indexed);
    // 2 layers x 7 matrices + token_embd + output, all above 10 MiB at f16.
    expect(added.indexed).toBe(16);
    expect(added.bytes).toBeGreaterThan(0.9 * statSync(indexed).size);
    const again = await rpcWeightsIndexAdd(indexed);
    expect(again.already).toBe(true);
    expect(rpcWeightsIndexInfo().files).toContain(added.file);
  }, 60_000);

  it('a head loading the indexed model sends at most 1% of the peer share, and computes the same', async () => {
    const share = peerShareBytes();
    const hitsBefore = rpcWeightsIndexInfo().hits;
    const { result, session } = await load(indexed);
    console.log(
      `indexed: setTensorBytes ${session.setTensorBytes} of a ${share}-byte share (${((100 * session.setTensorBytes) / share).toFixed(3)}%), ${session.setTensorHashHits} hash hits`,
    );
    expect(session.setTensorBytes).toBeLessThanOrEqual(0.01 * share);
    expect(session.setTensorHashHits).toBe(15); // every layer matrix and the output
    expect(rpcWeightsIndexInfo().hits - hitsBefore).toBe(15);
    const local = await rpcClient(indexed, PROMPT);
    expect(maxAbsDiff(result.logits, local.logits)).toBeLessThan(1e-4);
    expect(result.generated).toEqual(local.generated);
  }, 180_000);

  it('a model the peer does not hold still loads, with the bytes on the wire (stock behaviour)', async () => {
    const share = peerShareBytes();
    const { result, session } = await load(other);
    console.log(`not indexed: setTensorBytes ${session.setTensorBytes} of a ${share}-byte share`);
    expect(session.setTensorHashHits).toBe(0);
    expect(session.setTensorBytes).toBeGreaterThanOrEqual(share);
    const local = await rpcClient(other, PROMPT);
    expect(maxAbsDiff(result.logits, local.logits)).toBeLessThan(1e-4);
  }, 180_000);
});
