// For the suites that hold one engine's greedy output to another's (pipelined against not,
// speculative against not): one completion's text, finish reason and token counts, and a metric.
import { metrics } from '@hydra-engine/test-kit';
import { expect } from 'vitest';

export interface Completion {
  text: string;
  finish: string;
  completion: number;
  cached: number;
}

/** A greedy completion (status 200 expected); `cache_prompt` off unless the body turns it on. */
export async function complete(eng: { url: string }, body: Record<string, unknown>): Promise<Completion> {
  const res = await fetch(`${eng.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    // cache_prompt is on by default (as llama-server's): off unless a test asks, so the compared
    // engines' slot caches (which differ after a cancel on one of them) do not enter the comparison.
    body: JSON.stringify({ temperature: 0, cache_prompt: false, ...body }),
  });
  expect(res.status).toBe(200);
  const json = (await res.json()) as {
    choices: { text: string; finish_reason: string }[];
    usage: { completion_tokens: number; prompt_tokens_details?: { cached_tokens: number } };
  };
  return {
    text: json.choices[0]!.text,
    finish: json.choices[0]!.finish_reason,
    completion: json.usage.completion_tokens,
    cached: json.usage.prompt_tokens_details?.cached_tokens ?? 0,
  };
}

/** One unlabelled metric of an engine's /metrics; throws when it is not there. */
export async function metric(eng: { url: string }, name: string): Promise<number> {
  const value = (await metrics(eng.url)).get(name);
  if (value === undefined) throw new Error(`${name} not in /metrics`);
  return value;
}

/**
 * Opens a streamed completion and reads it until `n - 1` `data:` events came (or it ended), so the
 * generation is well inside its decode loop; `cancel` aborts it and waits for the read to settle.
 */
export async function streamInto(
  eng: { url: string },
  body: Record<string, unknown>,
  n: number,
): Promise<{ cancel: () => Promise<void> }> {
  const ctl = new AbortController();
  const res = await fetch(`${eng.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: ctl.signal,
  });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let seen = '';
  while (seen.split('data:').length < n) {
    const { value, done } = await reader.read();
    if (done) break;
    seen += decoder.decode(value);
  }
  return {
    cancel: async () => {
      ctl.abort();
      await reader.read().catch(() => undefined);
    },
  };
}

/** Polls hydra_slots_busy every 10 ms, at most `tries` times, until no slot is busy. */
export async function untilSlotsIdle(eng: { url: string }, tries: number): Promise<void> {
  for (let i = 0; i < tries && (await metric(eng, 'hydra_slots_busy')) > 0; i++)
    await new Promise((r) => setTimeout(r, 10));
}
