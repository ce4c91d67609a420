// /v1/responses (OpenAI's Responses API) as llama-server serves it, with the official openai client
// and plain HTTP, on the tiny model with a Jinja template with tools (chat: 'tools').
import { Model } from '@hydra-engine/native-ggml';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { responsesToChat } from '../src/routes/responses.js';
import { engineWith, pickCityParameters, tinyToolsModel, toolCallBias } from './helpers.js';

let model: Model;
let eng: Awaited<ReturnType<typeof engineWith>>;
let client: OpenAI;
let bias: Record<string, number>;

const pick = {
  type: 'function' as const,
  name: 'pick_city',
  description: 'Pick a city to visit',
  parameters: pickCityParameters,
  strict: true,
};

beforeAll(async () => {
  const path = await tinyToolsModel('hydra-resp-');
  model = await Model.load({ path, nGpuLayers: 0 });
  // As chat-jinja.test.ts: random weights write text for long before "<tool_call>\n"; favour it.
  bias = await toolCallBias(model);
  eng = await engineWith(['-m', path, '-np', '2', '-c', '4096']);
  client = new OpenAI({ baseURL: `${eng.url}/v1`, apiKey: 'none', maxRetries: 0 });
}, 60_000);
afterAll(async () => {
  await eng?.close();
  model?.dispose();
});

async function post(path: string, body: unknown) {
  const res = await fetch(`${eng.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, text: await res.text() };
}

const greedy = { temperature: 0, max_output_tokens: 10 };

describe('/v1/responses', () => {
  it('text input with instructions answers what the same chat answers', async () => {
    const r = await client.responses.create({
      model: 'x',
      input: 'Hello there',
      instructions: 'Be brief.',
      ...greedy,
    });
    const chat = await client.chat.completions.create({
      model: 'x',
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Hello there' },
      ],
      temperature: 0,
      max_tokens: 10,
    });
    expect(r.object).toBe('response');
    expect(r.status).toBe('completed');
    expect(r.output_text).toBe(chat.choices[0]!.message.content);
    expect(r.output[0]).toMatchObject({ type: 'message', role: 'assistant', status: 'completed' });
    expect(r.usage).toMatchObject({
      input_tokens: chat.usage!.prompt_tokens,
      output_tokens: chat.usage!.completion_tokens,
      total_tokens: chat.usage!.total_tokens,
    });
  });

  it('message items (input and output messages) render as the chat they convert to', async () => {
    const input = [
      { role: 'user' as const, content: 'Hi' },
      {
        role: 'assistant' as const,
        type: 'message' as const,
        content: [{ type: 'output_text' as const, text: 'Hello!' }],
      },
      { role: 'user' as const, content: [{ type: 'input_text' as const, text: 'Again' }] },
    ];
    const r = await client.responses.create({ model: 'x', input: input as any, ...greedy });
    const chat = await client.chat.completions.create({
      model: 'x',
      messages: [
        { role: 'user', content: 'Hi' },
        { role: 'assistant', content: 'Hello!' },
        { role: 'user', content: 'Again' },
      ],
      temperature: 0,
      max_tokens: 10,
    });
    expect(r.output_text).toBe(chat.choices[0]!.message.content);
  });

  it('streams llama-server events that add up to the reply', async () => {
    const whole = await client.responses.create({ model: 'x', input: 'Hello there', ...greedy });
    const stream = await client.responses.create({
      model: 'x',
      input: 'Hello there',
      ...greedy,
      stream: true,
    });
    const types: string[] = [];
    let text = '';
    let completed: any;
    for await (const e of stream) {
      types.push(e.type);
      if (e.type === 'response.output_text.delta') text += e.delta;
      if (e.type === 'response.completed') completed = e.response;
    }
    expect(types.slice(0, 4)).toEqual([
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
    ]);
    expect(types.slice(-4)).toEqual([
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      'response.completed',
    ]);
    expect(text).toBe(whole.output_text);
    expect(completed.output[0].content[0].text).toBe(whole.output_text);
    expect(completed.usage.output_tokens).toBe(whole.usage!.output_tokens);
  });

  it('function tools: a forced call comes back as a function_call item; its output goes back in', async () => {
    const r = await client.responses.create({
      model: 'x',
      input: 'Pick a city.',
      tools: [pick],
      tool_choice: { type: 'function', name: 'pick_city' },
      logit_bias: bias,
      seed: 1,
      max_output_tokens: 600,
    } as any);
    const call = r.output.find((o) => o.type === 'function_call') as any;
    expect(call).toMatchObject({ type: 'function_call', name: 'pick_city', status: 'completed' });
    expect(call.call_id).toMatch(/^call_/);
    const args = JSON.parse(call.arguments);
    expect(['Paris', 'Rome']).toContain(args.city);
    // The call and its output as input items render as the assistant tool call and the tool message.
    const next = await post('/v1/responses', {
      input: [
        { role: 'user', content: 'Pick a city.' },
        { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
        { type: 'function_call_output', call_id: call.call_id, output: 'booked' },
      ],
      tools: [pick],
      ...greedy,
    });
    expect(next.status).toBe(200);
    const converted = responsesToChat({
      input: [
        { role: 'user', content: 'Pick a city.' },
        { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
        { type: 'function_call_output', call_id: call.call_id, output: 'booked' },
      ],
      tools: [pick],
    });
    const rendered = await model.applyChatCommonAsync({
      messages: converted.messages,
      tools: converted.tools,
    } as any);
    expect(rendered.prompt).toContain('<tool_response>\nbooked\n</tool_response>');
    expect(rendered.prompt).toContain('"name": "pick_city"');
  });

  it('a streamed forced call: output_item.added, argument deltas, output_item.done', async () => {
    const stream = await client.responses.create({
      model: 'x',
      input: 'Pick a city.',
      tools: [pick],
      tool_choice: 'required',
      logit_bias: bias,
      seed: 3,
      max_output_tokens: 600,
      stream: true,
    } as any);
    let args = '';
    let done: any;
    for await (const e of stream as any) {
      if (e.type === 'response.function_call_arguments.delta') args += e.delta;
      if (e.type === 'response.output_item.done' && e.item.type === 'function_call') done = e.item;
    }
    expect(done).toBeDefined();
    expect(args).toBe(done.arguments);
    expect(() => JSON.parse(args)).not.toThrow();
  });

  it('input_tokens counts what the request would read (llama-server handle_count_tokens)', async () => {
    const r = await client.responses.create({
      model: 'x',
      input: 'Hello there',
      instructions: 'Be brief.',
      ...greedy,
    });
    const count = await post('/v1/responses/input_tokens', {
      input: 'Hello there',
      instructions: 'Be brief.',
    });
    expect(JSON.parse(count.text)).toEqual({
      input_tokens: r.usage!.input_tokens,
      object: 'response.input_tokens',
    });
    const messages = [{ role: 'user', content: 'Hello there' }];
    const chat = await post('/v1/chat/completions', { messages, max_tokens: 1 });
    const chatCount = await post('/v1/chat/completions/input_tokens', { messages });
    expect(JSON.parse(chatCount.text).input_tokens).toBe(JSON.parse(chat.text).usage.prompt_tokens);
  });

  it('what it cannot honour is refused by name; bad input is a 400 naming it', async () => {
    for (const [body, code, key] of [
      [{ input: 'x', previous_response_id: 'resp_1' }, 'HYDRA_ERR_UNSUPPORTED_FIELD', 'previous_response_id'],
      [{ input: 'x', store: true }, 'HYDRA_ERR_UNSUPPORTED_FIELD', 'store'],
      [{ input: 'x', background: true }, 'HYDRA_ERR_UNSUPPORTED_FIELD', 'background'],
      [{ input: 'x', tools: [{ type: 'web_search' }] }, 'HYDRA_ERR_UNSUPPORTED_FIELD', 'tools'],
      [
        { input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] },
        'HYDRA_ERR_UNSUPPORTED_FIELD',
        'input',
      ],
      [{ input: 'x', n: 2 }, 'HYDRA_ERR_UNSUPPORTED_FIELD', 'n'],
      [{}, 'HYDRA_ERR_BAD_REQUEST', 'input'],
      [{ input: 3 }, 'HYDRA_ERR_BAD_REQUEST', 'input'],
      [{ input: [{ type: 'mystery' }] }, 'HYDRA_ERR_BAD_REQUEST', 'input'],
    ] as const) {
      const r = await post('/v1/responses', body);
      const e = JSON.parse(r.text).error;
      expect([r.status, e.code, e.keys], JSON.stringify(body)).toEqual([400, code, [key]]);
    }
  });

  it('text.format json_schema constrains the output to the schema', async () => {
    const schema = {
      type: 'object',
      properties: { a: { type: 'integer' } },
      required: ['a'],
      additionalProperties: false,
    };
    const r = await client.responses.create({
      model: 'x',
      input: 'Give JSON',
      text: { format: { type: 'json_schema', name: 'obj', schema, strict: true } },
      temperature: 0,
      max_output_tokens: 64,
    });
    expect(Object.keys(JSON.parse(r.output_text))).toEqual(['a']);
  });
});
