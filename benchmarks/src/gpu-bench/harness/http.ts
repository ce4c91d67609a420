/** A JSON body and its status; `{}` when the body is not JSON. */
export async function getJson(
  url: string,
  timeoutMs = 2000,
): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  return {
    status: res.status,
    body: ((await res.json().catch(() => ({}))) ?? {}) as Record<string, unknown>,
  };
}

/** One `data:` event of a server-sent event stream and the arrival time of the chunk it came in. */
export interface SseEvent {
  data: Record<string, unknown>;
  /** performance.now() when the chunk holding the event's end arrived. */
  at: number;
}

/**
 * The JSON `data:` events of an OpenAI-style stream, in order; `[DONE]` and other lines are left
 * out. An event with an `error` member throws.
 */
export async function* sseEvents(body: AsyncIterable<Uint8Array>): AsyncGenerator<SseEvent> {
  const decoder = new TextDecoder();
  let buf = '';
  for await (const chunk of body) {
    const at = performance.now();
    buf += decoder.decode(chunk, { stream: true });
    for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (!line.startsWith('data:')) continue;
      const payload = line.slice(5).trim();
      if (payload === '[DONE]') continue;
      const data = JSON.parse(payload) as Record<string, unknown>;
      if (data.error) throw new Error(`stream error: ${JSON.stringify(data.error)}`);
      yield { data, at };
    }
  }
}

/** POSTs a JSON body; throws with the body's start on a non-2xx answer. */
export async function postJson(url: string, body: unknown, signal?: AbortSignal): Promise<Response> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    ...(signal ? { signal } : {}),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 300)}`);
  return res;
}

/** The usage member of an OpenAI completion chunk or answer. */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
}

export const usageOf = (data: Record<string, unknown>): Usage | undefined =>
  typeof data.usage === 'object' && data.usage !== null ? (data.usage as Usage) : undefined;

/** The first choice of a completion chunk. */
export const choiceOf = (
  data: Record<string, unknown>,
): { text?: string; finish_reason?: string | null } | undefined =>
  Array.isArray(data.choices)
    ? (data.choices[0] as { text?: string; finish_reason?: string | null })
    : undefined;
