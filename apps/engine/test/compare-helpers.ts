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
