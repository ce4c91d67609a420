/**
 * The `data:` payloads of a server-sent event stream as they arrive, `[DONE]` left out: the
 * engine's own clients (`bench-client`, `demo`) read its streamed completions with it.
 */
export async function* sseData(body: AsyncIterable<Uint8Array>): AsyncGenerator<string> {
  let buf = '';
  const decoder = new TextDecoder();
  for await (const chunk of body) {
    buf += decoder.decode(chunk, { stream: true });
    for (let at = buf.indexOf('\n\n'); at >= 0; at = buf.indexOf('\n\n')) {
      const data = buf.slice(0, at).replace(/^data: /, '');
      buf = buf.slice(at + 2);
      if (data !== '[DONE]') yield data;
    }
  }
}
