// Issue 28: a head with every layer on a peer engine reads back only the sampled token per decode
// step when nothing on the host needs more (native-ggml's hydra_sampled_only.cpp ends every chain
// sampled on the device). Before, each step also copied the logits row over ggml-RPC (the tiny
// model's 1,000 floats: 4 kB) though the peer's graph had already sampled. Counted from STATUS
// (the head's client calls and the kernel's TCP_INFO of upstream's socket), not timed. A request
// for probabilities samples on the host and still gets the row, and every request gives the same
// tokens as an engine with the model local.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Proc, spawnEngine } from './combine-helpers.js';
import { tinyModel } from './helpers.js';

const N_VOCAB = 1000; // the tiny synthetic model's
const TOKENS = 32;
const prompt = Array.from({ length: 12 }, (_, i) => 20 + i * 11);

interface Counters {
  getTensor: number;
  bytesIn: number;
}

async function counters(url: string): Promise<Counters> {
  const s = (await fetch(`${url}/control/status`).then((r) => r.json())) as {
    peers: {
      accounting: { commands: Record<string, number>; tcp: { bytes_received: number } | null } | null;
    }[];
  };
  const a = s.peers[0]!.accounting!;
  return { getTensor: a.commands.get_tensor!, bytesIn: a.tcp!.bytes_received };
}

/** A streamed completion: the text per choice and the generated tokens (usage). */
async function stream(url: string, body: Record<string, unknown>) {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      prompt,
      max_tokens: TOKENS,
      ignore_eos: true,
      cache_prompt: false,
      ...body,
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  expect(res.status).toBe(200);
  const texts: string[] = [];
  const logprobs: { top_logprobs: unknown[] }[][] = [];
  let tokens = 0;
  for (const line of (await res.text()).split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const chunk = JSON.parse(line.slice(6));
    if (chunk.usage) tokens = chunk.usage.completion_tokens;
    for (const c of chunk.choices ?? []) {
      texts[c.index] = (texts[c.index] ?? '') + (c.text ?? '');
      if (c.logprobs?.content) logprobs[c.index] = [...(logprobs[c.index] ?? []), ...c.logprobs.content];
    }
  }
  return { texts, tokens, logprobs };
}

describe('a head with every layer on a peer reads back the sampled id alone', () => {
  let peer: Proc;
  let head: Proc;
  let local: Proc;
  beforeAll(async () => {
    const model = await tinyModel();
    peer = await spawnEngine([]);
    head = await spawnEngine([
      '-m',
      model,
      '-c',
      '1024',
      '-np',
      '2',
      '--rpc',
      peer.rpc,
      '--device',
      'RPC0',
      '-ngl',
      '99',
    ]);
    local = await spawnEngine(['-m', model, '-c', '1024', '-np', '2']);
  });
  afterAll(() => {
    head?.child.kill('SIGKILL');
    local?.child.kill('SIGKILL');
    peer?.child.kill('SIGKILL');
  });

  const cases: [string, Record<string, unknown>][] = [
    ['greedy', { temperature: 0 }],
    // top-k 40 on the device: its 40 logits, ids and probabilities came back too.
    ['seeded sampling', { temperature: 0.9, seed: 7 }],
    ['two seeded choices', { temperature: 0.9, seed: 11, n: 2 }],
  ];
  for (const [name, body] of cases) {
    it(`${name}: one small reply per step, the local engine's tokens`, async () => {
      const before = await counters(head.url);
      const remote = await stream(head.url, body);
      const after = await counters(head.url);
      const n = (body.n as number | undefined) ?? 1;
      expect(remote.tokens).toBe(TOKENS * n);
      // One 4-byte id and its 8-byte reply header per sequence and step (a step queued ahead of
      // the stream's end may add one); the logits row alone would be 4,008 bytes.
      const perToken = (after.bytesIn - before.bytesIn) / remote.tokens;
      expect(perToken).toBeGreaterThan(0);
      expect(perToken).toBeLessThan(100);
      expect(after.getTensor - before.getTensor).toBeLessThanOrEqual(remote.tokens + 2 * n);
      const there = await stream(local.url, body);
      expect(remote.texts).toEqual(there.texts);
    });
  }

  it('logprobs: the host samples from the logits row, which still comes back, with the same tokens', async () => {
    const plain = await stream(head.url, { temperature: 0 });
    const before = await counters(head.url);
    const probs = await stream(head.url, { temperature: 0, logprobs: 3 });
    const after = await counters(head.url);
    expect(probs.texts).toEqual(plain.texts);
    expect(probs.logprobs[0]!.length).toBe(TOKENS);
    for (const t of probs.logprobs[0]!) expect(t.top_logprobs.length).toBe(3);
    expect((after.bytesIn - before.bytesIn) / probs.tokens).toBeGreaterThan(N_VOCAB * 4);
  });
});
