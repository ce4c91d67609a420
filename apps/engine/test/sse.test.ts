import { describe, expect, it } from 'vitest';
import { sseData } from '../src/sse.js';

async function* chunks(text: string, size: number): AsyncGenerator<Uint8Array> {
  const bytes = new TextEncoder().encode(text);
  for (let i = 0; i < bytes.length; i += size) yield bytes.subarray(i, i + size);
}

describe('sseData', () => {
  it('yields each data payload once, whole, however the bytes are split; [DONE] is left out', async () => {
    const text = 'data: {"a":"é"}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n';
    for (const size of [1, 2, 3, 7, text.length]) {
      const got: string[] = [];
      for await (const d of sseData(chunks(text, size))) got.push(d);
      expect(got).toEqual(['{"a":"é"}', '{"b":2}']);
    }
  });
});
