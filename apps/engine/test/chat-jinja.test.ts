import { fileURLToPath } from 'node:url';
import { Model } from '@hydra-engine/native-ggml';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseServeArgs } from '../src/args.js';
import {
  engineWith,
  pickCityParameters,
  postJson,
  tinyModel,
  tinyToolsModel,
  toolCallBias,
  toolConversation,
  weatherTool,
} from './helpers.js';

// Chat through llama.cpp's common chat layer (--jinja, the default) on the tiny model with
// chat: 'tools' (a Qwen 2.5-style Jinja template with tools, <tool_call> tokens), with the
// official openai client and plain HTTP.
let modelPath: string;
let model: Model;
let eng: Awaited<ReturnType<typeof engineWith>>;
let client: OpenAI;

const pick = {
  type: 'function' as const,
  function: {
    name: 'pick_city',
    description: 'Pick a city to visit',
    parameters: pickCityParameters,
  },
};
const weather = weatherTool;

// The chat layer's grammar lets text come before a call: toolCallBias favours "<tool_call>\n" and
// the end of the turn. What the call holds is the grammar's doing alone.
let bias: Record<string, number>;

beforeAll(async () => {
  modelPath = await tinyToolsModel('hydra-jinja-');
  model = await Model.load({ path: modelPath, nGpuLayers: 0 });
  bias = await toolCallBias(model);
  eng = await engineWith(['-m', modelPath, '-np', '2', '-c', '4096']);
  client = new OpenAI({ baseURL: `${eng.url}/v1`, apiKey: 'none', maxRetries: 0 });
}, 60_000);
afterAll(async () => {
  await eng?.close();
  model?.dispose();
});

const post = (path: string, body: unknown) => postJson(eng.url, path, body);

function checkPick(args: string): void {
  const a = JSON.parse(args);
  expect(['Paris', 'Rome']).toContain(a.city);
  expect(Number.isInteger(a.days) && a.days >= 1 && a.days <= 9).toBe(true);
}

const conversation = toolConversation;

describe('chat through the common chat layer', () => {
  it('/apply-template renders what llama.cpp common chat layer gives for the same body (tools, tool calls, results)', async () => {
    const body = { messages: conversation, tools: [weather, pick] };
    const r = await post('/apply-template', body);
    expect(r.status).toBe(200);
    expect(r.json.prompt).toBe((await model.applyChatCommonAsync(body)).prompt);
    expect(r.json.prompt).toContain('<tool_response>\nsunny\n</tool_response>');
    expect(r.json.prompt).toContain('"name": "pick_city"');
    // A chat without tools renders as the chatml template always did.
    const plain = [{ role: 'user', content: 'hi' }];
    expect((await post('/apply-template', { messages: plain })).json.prompt).toBe(
      model.applyChatTemplate(plain),
    );
  });

  it('openai client: a named tool_choice returns a parsed call whose arguments match the schema', async () => {
    for (const seed of [1, 2]) {
      const r = await client.chat.completions.create({
        model: 'tiny',
        messages: conversation as any,
        tools: [weather, pick],
        tool_choice: { type: 'function', function: { name: 'pick_city' } },
        parallel_tool_calls: false,
        logit_bias: bias,
        seed,
        max_tokens: 600,
      });
      const choice = r.choices[0]!;
      if (choice.finish_reason !== 'tool_calls') console.log(JSON.stringify(choice.message));
      expect(choice.finish_reason).toBe('tool_calls');
      expect(choice.message.tool_calls).toHaveLength(1);
      const call = choice.message.tool_calls![0]! as {
        id: string;
        function: { name: string; arguments: string };
      };
      expect(call.function.name).toBe('pick_city');
      expect(call.id).toMatch(/^[A-Za-z0-9]{32}$/);
      checkPick(call.function.arguments);
    }
  });

  it('openai client: tool_calls stream as deltas (id and name first, then argument text) that add up to the call', async () => {
    const stream = await client.chat.completions.create({
      model: 'tiny',
      messages: conversation as any,
      tools: [weather, pick],
      tool_choice: 'required',
      logit_bias: bias,
      seed: 3,
      max_tokens: 600,
      stream: true,
    });
    const calls: { id?: string; name: string; args: string }[] = [];
    let finish: string | null = null;
    let deltas = 0;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      for (const d of c.delta.tool_calls ?? []) {
        deltas++;
        if (d.id)
          calls[d.index] = { id: d.id, name: d.function?.name ?? '', args: d.function?.arguments ?? '' };
        else calls[d.index]!.args += d.function?.arguments ?? '';
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    expect(finish).toBe('tool_calls');
    expect(calls.length).toBeGreaterThanOrEqual(1);
    expect(deltas).toBeGreaterThan(calls.length);
    for (const call of calls) {
      expect(['pick_city', 'get_weather']).toContain(call.name);
      expect(() => JSON.parse(call.args)).not.toThrow();
      if (call.name === 'pick_city') checkPick(call.args);
    }
  });

  it('tool_choice auto (lazy grammar) and none answer; a trailing assistant message is continued', async () => {
    for (const tool_choice of ['auto', 'none'] as const) {
      const r = await client.chat.completions.create({
        model: 'tiny',
        messages: conversation as any,
        tools: [weather, pick],
        tool_choice,
        max_tokens: 8,
      });
      expect(r.choices[0]!.message.role).toBe('assistant');
    }
    const prefix = [...conversation, { role: 'assistant', content: 'I pick' }];
    const t = await post('/apply-template', { messages: prefix });
    expect(t.json.prompt.endsWith('I pick')).toBe(true);
  });

  it('bad values of each new field are a 400 naming it', async () => {
    const messages = [{ role: 'user', content: 'hi' }];
    for (const [field, value, code] of [
      ['tools', 'x', 'HYDRA_ERR_BAD_VALUE'],
      ['tools', [{ type: 'function', function: {} }], 'HYDRA_ERR_BAD_VALUE'],
      ['tool_choice', 'sometimes', 'HYDRA_ERR_BAD_VALUE'],
      ['tool_choice', { type: 'function', function: { name: 'nope' } }, 'HYDRA_ERR_BAD_VALUE'],
      ['parallel_tool_calls', 1, 'HYDRA_ERR_BAD_VALUE'],
      ['chat_template_kwargs', [1], 'HYDRA_ERR_BAD_VALUE'],
      ['reasoning_format', 'loud', 'HYDRA_ERR_BAD_VALUE'],
      ['reasoning_effort', 3, 'HYDRA_ERR_BAD_VALUE'],
      ['continue_final_message', true, 'HYDRA_ERR_UNSUPPORTED_FIELD'],
    ] as const) {
      for (const path of ['/apply-template', '/v1/chat/completions']) {
        const r = await post(path, { messages, tools: [pick], [field]: value, max_tokens: 1 });
        expect(r.status, `${path} ${field}`).toBe(400);
        expect(r.json.error.code, `${path} ${field}`).toBe(code);
        expect(r.json.error.keys, `${path} ${field}`).toEqual([field]);
      }
    }
    const g = await post('/v1/chat/completions', {
      messages,
      tools: [pick],
      tool_choice: 'required',
      grammar: 'root ::= "a"',
    });
    expect(g.status).toBe(400);
    expect(g.json.error.keys).toEqual(['grammar']);
    // Messages the template cannot take: the layer's refusal, a 400 on messages.
    const two = await post('/v1/chat/completions', {
      messages: [...messages, { role: 'assistant', content: 'a' }, { role: 'assistant', content: 'b' }],
    });
    expect(two.status).toBe(400);
    expect(two.json.error.keys).toEqual(['messages']);
  });

  it('--no-jinja: the legacy renderer, which refuses tools by name', async () => {
    const legacy = await engineWith(['-m', modelPath, '-np', '1', '-c', '1024', '--no-jinja']);
    try {
      const res = await fetch(`${legacy.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: conversation, tools: [pick], max_tokens: 1 }),
      });
      expect(res.status).toBe(400);
      expect(((await res.json()) as any).error.code).toBe('HYDRA_ERR_UNSUPPORTED_FIELD');
      // A message field the legacy renderer would drop unseen is refused by name too.
      const msg = await fetch(`${legacy.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: conversation, max_tokens: 1 }),
      });
      const e = ((await msg.json()) as any).error;
      expect([msg.status, e.code]).toEqual([400, 'HYDRA_ERR_UNSUPPORTED_FIELD']);
      expect(e.message).toContain('messages[2].tool_calls');
    } finally {
      await legacy.close();
    }
  });

  it('--chat-template-file with a thinking template: reasoning_content in replies and stream deltas; reasoning_format none keeps it in content', async () => {
    const file = fileURLToPath(
      new URL(
        '../../../packages/native-ggml/upstream/models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja',
        import.meta.url,
      ),
    );
    const thinking = await engineWith([
      '-m',
      await tinyModel(),
      '-np',
      '1',
      '-c',
      '1024',
      '--chat-template-file',
      file,
    ]);
    try {
      const c = new OpenAI({ baseURL: `${thinking.url}/v1`, apiKey: 'none', maxRetries: 0 });
      const ask = {
        model: 'tiny',
        messages: [{ role: 'user' as const, content: 'Why?' }],
        max_tokens: 6,
        temperature: 0,
      };
      const r = (await c.chat.completions.create(ask)).choices[0]!.message as {
        content: string | null;
        reasoning_content?: string;
      };
      // The template opens <think> in the generation prompt: every token is reasoning until </think>.
      expect(r.reasoning_content?.trim().length).toBeGreaterThan(0);
      expect(r.content ?? '').toBe('');
      let reasoning = '';
      let content = '';
      for await (const chunk of await c.chat.completions.create({ ...ask, stream: true })) {
        const d = chunk.choices[0]?.delta as { content?: string; reasoning_content?: string } | undefined;
        reasoning += d?.reasoning_content ?? '';
        content += d?.content ?? '';
      }
      expect(reasoning).toBe(r.reasoning_content);
      expect(content).toBe('');
      const none = (await c.chat.completions.create({ ...ask, reasoning_format: 'none' } as any)).choices[0]!
        .message as {
        content: string | null;
        reasoning_content?: string;
      };
      expect(none.reasoning_content).toBeUndefined();
      expect(none.content?.trim().length).toBeGreaterThan(0);
    } finally {
      await thinking.close();
    }
  });

  it('flags: --jinja (default) / --no-jinja, --reasoning-format, --chat-template-kwargs and their LLAMA_ARG_* variables', () => {
    const s = (argv: string[], env: Record<string, string> = {}) => parseServeArgs(argv, env).settings;
    expect([s([]).jinja, s([]).reasoningFormat, s([]).chatTemplateKwargs]).toEqual([true, 'auto', undefined]);
    expect(s(['--no-jinja']).jinja).toBe(false);
    expect(s([], { LLAMA_ARG_JINJA: '0' }).jinja).toBe(false);
    expect(s(['--jinja'], { LLAMA_ARG_JINJA: '0' }).jinja).toBe(true);
    expect(s([], { LLAMA_ARG_THINK: 'none' }).reasoningFormat).toBe('none');
    expect(s(['--chat-template-kwargs', '{"enable_thinking":false}']).chatTemplateKwargs).toBe(
      '{"enable_thinking":false}',
    );
    expect(s([], { LLAMA_ARG_CHAT_TEMPLATE_KWARGS: '{"a":1}' }).chatTemplateKwargs).toBe('{"a":1}');
    for (const [argv, key] of [
      [['--reasoning-format', 'loud'], '@reasoningFormat'],
      [['--chat-template-kwargs', '[1]'], '@chatTemplateKwargs'],
      [['--chat-template-kwargs', '{'], '@chatTemplateKwargs'],
    ] as const) {
      let err: any;
      try {
        parseServeArgs([...argv], {});
      } catch (e) {
        err = e;
      }
      expect(err?.code, argv.join(' ')).toBe('HYDRA_ERR_BAD_ARGUMENT');
      expect(err?.keys, argv.join(' ')).toEqual([key]);
    }
  });
});
