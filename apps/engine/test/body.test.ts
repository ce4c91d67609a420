import { afterAll, describe, expect, it } from 'vitest';
import { BodyParser, WORKER_MIN_BYTES } from '../src/body.js';

const parser = new BodyParser();
afterAll(() => parser.close());

// The same body inline and, padded with JSON whitespace past the threshold, on the worker thread.
async function both(text: string, chat: boolean, maxMessages = 100) {
  const run = (t: string) =>
    parser.parse(Buffer.from(t), chat, maxMessages).then(
      (p) => ({
        body: p.body,
        chat: p.chat && {
          count: p.chat.count,
          bytes: p.chat.bytes,
          packed: Buffer.from(p.chat.packed).toString('hex'),
        },
        tokens: p.tokens && { ids: [...p.tokens.ids], max: p.tokens.max },
      }),
      // V8's JSON error quotes the text, which the padding changes.
      (e) => ({
        code: e.code,
        keys: e.keys,
        ...(e.code === 'HYDRA_ERR_BAD_JSON' ? {} : { message: e.message }),
      }),
    );
  const inline = await run(text);
  const worker = await run(text + ' '.repeat(WORKER_MIN_BYTES));
  expect(worker).toEqual(inline);
  return inline;
}

describe('BodyParser: the worker thread answers as the inline path does', () => {
  it('errors', async () => {
    expect(await both('{"prompt":', false)).toMatchObject({ code: 'HYDRA_ERR_BAD_JSON' });
    expect(await both('\ufeff{}', false)).toMatchObject({ code: 'HYDRA_ERR_BAD_JSON' });
    expect(await both('[1]', false)).toMatchObject({ code: 'HYDRA_ERR_BAD_REQUEST' });
    expect(await both('{"messages": []}', true)).toMatchObject({
      code: 'HYDRA_ERR_BAD_REQUEST',
      keys: ['messages'],
    });
    expect(await both('{"messages": [{"role": "", "content": "x"}]}', true)).toMatchObject({
      code: 'HYDRA_ERR_BAD_REQUEST',
      keys: ['messages'],
    });
    expect(await both('{"messages": [{"role": "u", "content": [{"type": "image"}]}]}', true)).toMatchObject({
      code: 'HYDRA_ERR_BAD_REQUEST',
    });
    const many = JSON.stringify({
      messages: Array.from({ length: 101 }, () => ({ role: 'u', content: '' })),
    });
    expect(await both(many, true)).toMatchObject({ code: 'HYDRA_ERR_TOO_MANY_MESSAGES', keys: ['messages'] });
    expect(await both('{"prompt": [1, -2]}', false)).toMatchObject({
      code: 'HYDRA_ERR_BAD_REQUEST',
      keys: ['prompt'],
    });
    expect(await both('{"prompt": [1, 2.5]}', false)).toMatchObject({ code: 'HYDRA_ERR_BAD_REQUEST' });
  });

  it('chat messages packed with their byte count; token prompts as Int32Array with their max', async () => {
    const chat = await both(
      JSON.stringify({
        messages: [
          { role: 'system', content: 'é' },
          {
            role: 'user',
            content: [
              { type: 'text', text: 'a' },
              { type: 'text', text: 'b' },
            ],
          },
          { role: 'assistant', content: null },
        ],
        temperature: 0,
      }),
      true,
    );
    expect(chat).toMatchObject({ body: { temperature: 0 }, chat: { count: 3, bytes: 6 + 2 + 4 + 2 + 9 } });
    expect(chat).not.toHaveProperty('body.messages');
    const tokens = await both('{"prompt": [5, 2147483648, 7], "max_tokens": 1}', false);
    expect(tokens).toMatchObject({ body: { max_tokens: 1 }, tokens: { max: 2147483648 } });
    expect(await both('{"prompt": "hi"}', false)).toEqual({ body: { prompt: 'hi' } });
  });
});
