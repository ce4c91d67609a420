import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';

/** A port free right now on loopback (the merged port needs a fixed number). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

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
  let text = '';
  let buf = '';
  let error: { code: string } | undefined;
  let finish: string | undefined;
  let first = true;
  const dec = new TextDecoder();
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buf += dec.decode(chunk, { stream: true });
    let at = buf.indexOf('\n\n');
    while (at >= 0) {
      const line = buf.slice(0, at).replace(/^data: /, '');
      buf = buf.slice(at + 2);
      at = buf.indexOf('\n\n');
      if (line === '[DONE]') continue;
      const ev = JSON.parse(line);
      if (ev.error) error = ev.error;
      else if (ev.choices?.[0]) {
        text += ev.choices[0].text ?? '';
        if (ev.choices[0].finish_reason) finish = ev.choices[0].finish_reason;
        if (first) {
          first = false;
          onFirst?.();
        }
      }
    }
  }
  return {
    text,
    ...(error ? { error } : {}),
    ...(finish ? { finish } : {}),
    epoch: res.headers.get('x-hydra-config-epoch'),
    status: res.status,
  };
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
