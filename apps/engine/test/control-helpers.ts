import { dirname, join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { SseCompletion } from '@hydra-engine/test-kit';
import { expect } from 'vitest';

export { SseCompletion } from '@hydra-engine/test-kit';
export { freeLoopbackPort as freePort } from '../src/ports.js';

export async function variant(
  beside: string,
  arch: 'llama' | 'moe',
  quant: 'q8_0' | 'q4_0' | 'f16',
): Promise<string> {
  const out = join(dirname(beside), `${arch}-${quant}.gguf`);
  await writeSyntheticModel({ arch, shape: 'tiny', quant, seed: 3, out });
  return out;
}

/** Streams a completion; resolves with the text, the SSE error (if any) and the epoch header. */
export async function stream(
  url: string,
  body: Record<string, unknown>,
  onFirst?: () => void,
): Promise<{
  text: string;
  error?: { code: string };
  finish?: string;
  epoch: string | null;
  status: number;
}> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  if (!res.ok || !res.body) {
    const j = (await res.json()) as { error: { code: string } };
    return { text: '', error: j.error, epoch: res.headers.get('x-hydra-config-epoch'), status: res.status };
  }
  const sse = new SseCompletion(onFirst);
  const dec = new TextDecoder();
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    sse.push(dec.decode(chunk, { stream: true }));
  }
  return { ...sse.result(), epoch: res.headers.get('x-hydra-config-epoch'), status: res.status };
}

export async function complete(url: string, body: Record<string, unknown>) {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return {
    status: res.status,
    epoch: res.headers.get('x-hydra-config-epoch'),
    json: (await res.json()) as any,
  };
}

/**
 * A greedy continuation of `body.prompt` (prompt + generated tokens) on a slot whose KV was
 * restored: expects the tokens `want` and every prompt token but the last generated one (not
 * decoded yet when the state was saved) read from that KV.
 */
export async function expectRestoredContinuation(
  url: string,
  body: Record<string, unknown> & { prompt: number[] },
  want: number[],
): Promise<void> {
  const r = await complete(url, { ...body, cache_prompt: true });
  expect(r.json.choices[0].tokens).toEqual(want);
  expect(r.json.usage.prompt_tokens_details.cached_tokens).toBe(body.prompt.length - 1);
}
