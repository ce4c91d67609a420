import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ChatCommonParams, initBackend, Model, parseChatOutput } from '../src/index.js';
import { writeSyntheticModel } from '../src/synth/index.js';
import { tinyModel } from './helpers.js';

// llama.cpp's common chat layer compiled into the addon: Jinja rendering with tools, tool-call
// grammars, and parsing of replies, against the pinned tree's own Qwen 2.5 template.
const qwen = readFileSync(
  fileURLToPath(new URL('../upstream/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja', import.meta.url)),
  'utf8',
);
const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

let model: Model;
// The tiny model with chat: 'tools' (TOOLS_TEMPLATE, no space prefix after special tokens).
let toolsModel: Model;
beforeAll(async () => {
  initBackend();
  model = await Model.load({ path: await tinyModel('f32'), nGpuLayers: 0 });
  const out = join(mkdtempSync(join(tmpdir(), 'hydra-chat-')), 'tiny-tools.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 7, out, chat: 'tools' });
  toolsModel = await Model.load({ path: out, nGpuLayers: 0 });
});
afterAll(() => {
  model?.dispose();
  toolsModel?.dispose();
});

describe('applyChatCommonAsync', () => {
  it('renders messages, tools, assistant tool_calls and tool results with the Jinja template', async () => {
    const p = await model.applyChatCommonAsync(
      {
        messages: [
          { role: 'user', content: 'Weather in Paris?' },
          {
            role: 'assistant',
            content: null,
            tool_calls: [
              {
                id: 'c1',
                type: 'function',
                function: { name: 'get_weather', arguments: '{"city":"Paris"}' },
              },
            ],
          },
          { role: 'tool', tool_call_id: 'c1', content: 'sunny' },
        ],
        tools: [weather],
      },
      { template: qwen },
    );
    expect(p.prompt).toContain('<|im_start|>system\n');
    expect(p.prompt).toContain('"name": "get_weather"');
    expect(p.prompt).toContain(
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    );
    expect(p.prompt).toContain('<tool_response>\nsunny\n</tool_response>');
    expect(p.prompt.endsWith('<|im_start|>assistant\n')).toBe(true);
    expect(p.parseToolCalls).toBe(true);
    expect(p.grammar).not.toBe('');
    expect(p.grammarLazy).toBe(true);
    expect(p.grammarTriggers.length).toBeGreaterThan(0);
  });

  it('tool_choice required makes the grammar apply from the first token; add_generation_prompt false leaves the turn open', async () => {
    const req = await model.applyChatCommonAsync(
      { messages: [{ role: 'user', content: 'hi' }], tools: [weather], tool_choice: 'required' },
      { template: qwen },
    );
    expect(req.grammarLazy).toBe(false);
    expect(req.grammar).toContain('get_weather');
    const open = await model.applyChatCommonAsync(
      { messages: [{ role: 'user', content: 'hi' }], add_generation_prompt: false },
      { template: qwen },
    );
    expect(open.prompt.endsWith('<|im_start|>assistant\n')).toBe(false);
  });

  it('refuses bad bodies and bad templates with HYDRA_ERR_BAD_ARGUMENT', async () => {
    await expect(model.applyChatCommonAsync({ messages: 'x' }, { template: qwen })).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_ARGUMENT',
    });
    await expect(
      model.applyChatCommonAsync({ messages: [{ role: 'user', content: 'hi' }] }, { template: '{% if %}' }),
    ).rejects.toMatchObject({ code: 'HYDRA_ERR_BAD_ARGUMENT' });
    await expect(
      model.applyChatCommonAsync(
        { messages: [{ role: 'user', content: 'hi' }], tools: [weather], tool_choice: 'sometimes' },
        { template: qwen },
      ),
    ).rejects.toMatchObject({ code: 'HYDRA_ERR_BAD_ARGUMENT' });
  });
});

describe('parseChatOutput', () => {
  it('reads a tool call out of the reply, whole and partial', async () => {
    const p = await model.applyChatCommonAsync(
      { messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: [weather] },
      { template: qwen },
    );
    const text =
      'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
    const whole = await parseChatOutput(text, p);
    expect(whole.content).toBe('Let me look.');
    expect(whole.toolCalls).toHaveLength(1);
    expect(whole.toolCalls[0]!.name).toBe('get_weather');
    expect(JSON.parse(whole.toolCalls[0]!.arguments)).toEqual({ city: 'Paris' });
    const part = await parseChatOutput(text.slice(0, 40), p, true);
    expect(part.content).toBe('Let me look.');
    const plain = await parseChatOutput('just text', p);
    expect(plain).toEqual({ content: 'just text', reasoningContent: '', toolCalls: [] });
  });
});

// Generates with the chat layer's grammar in the sampler until the model ends its turn.
async function generate(
  model: Model,
  p: ChatCommonParams,
  seed: number,
  logitBias: { token: number; bias: number }[] = [],
  limit = 256,
): Promise<string> {
  const ctx = await model.createContext({ nCtx: 2048 });
  const sampler = model.createSampler({
    temp: 1,
    seed,
    grammar: p.grammar,
    grammarLazy: p.grammarLazy,
    grammarPrefill: p.grammarLazy ? '' : p.generationPrompt,
    logitBias,
  });
  try {
    const prompt = Array.from(await model.tokenizeAsync(p.prompt));
    let r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler }]);
    const out: number[] = [];
    while (out.length < limit && !model.isEndOfGeneration(r.tokens[0]!)) {
      out.push(r.tokens[0]!);
      r = await ctx.decode([
        { seq: 0, pos: prompt.length + out.length - 1, tokens: [r.tokens[0]!], sampler },
      ]);
    }
    if (out.length >= limit) console.log(JSON.stringify(model.detokenize(Int32Array.from(out))));
    expect(out.length).toBeLessThan(limit);
    return model.detokenize(Int32Array.from(out));
  } finally {
    sampler.dispose();
    await ctx.dispose();
  }
}

describe('tool-call grammar in the sampler', () => {
  const pick = {
    type: 'function',
    function: {
      name: 'pick_city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string', enum: ['Paris', 'Rome'] },
          days: { type: 'integer', minimum: 1, maximum: 9 },
        },
        required: ['city', 'days'],
      },
    },
  };
  it('a named tool_choice makes even random weights write a call whose arguments match the schema', async () => {
    const p = await toolsModel.applyChatCommonAsync({
      messages: [{ role: 'user', content: 'Pick a city' }],
      tools: [weather, pick],
      tool_choice: { type: 'function', function: { name: 'pick_city' } },
      parallel_tool_calls: false,
    });
    expect(p.grammarLazy).toBe(false);
    // The layer's grammar (as upstream's) lets text come before the call, up to "<tool_call>\n":
    // random weights would write text for long, so those two tokens are favoured, and the end of
    // the turn once the grammar allows it. What the call holds is the grammar's doing alone.
    const [newline] = await toolsModel.tokenizeAsync('\n', { addSpecial: false });
    const bias = [
      { token: toolsModel.info.nVocab - 2, bias: 10 },
      { token: newline!, bias: 10 },
      { token: toolsModel.info.eos, bias: 20 },
    ];
    for (const seed of [1, 2, 3]) {
      const text = await generate(toolsModel, p, seed, bias);
      const msg = await parseChatOutput(text, p);
      expect(msg.toolCalls).toHaveLength(1);
      expect(msg.toolCalls[0]!.name).toBe('pick_city');
      const args = JSON.parse(msg.toolCalls[0]!.arguments);
      expect(['Paris', 'Rome']).toContain(args.city);
      expect(Number.isInteger(args.days) && args.days >= 1 && args.days <= 9).toBe(true);
    }
  });

  it('a lazy grammar (tool_choice auto) builds with its triggers; a bad trigger token is refused', () => {
    expect(() =>
      model.createSampler({ grammar: 'root ::= "a"', grammarLazy: true, grammarTriggerTokens: [1 << 30] }),
    ).toThrow(expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' }));
    model
      .createSampler({ grammar: 'root ::= "a"', grammarLazy: true, grammarTriggerPatterns: ['<tool_call>'] })
      .dispose();
  });
});

describe("the synthetic model's own template (chat: 'tools')", () => {
  it('renders plain chats as the legacy chatml renderer does, and tools as the Jinja template says', async () => {
    const messages = [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Hello' },
      { role: 'assistant', content: 'Hi' },
      { role: 'user', content: 'Weather?' },
    ];
    const jinja = await toolsModel.applyChatCommonAsync({ messages });
    expect(jinja.prompt).toBe(await toolsModel.applyChatTemplateAsync(messages));
    const tools = await toolsModel.applyChatCommonAsync({ messages, tools: [weather] });
    expect(tools.prompt.startsWith('<|im_start|>system\nBe brief.\n\n# Tools')).toBe(true);
    expect(tools.formatName).toBe('peg-native');
    // Text right after a special token keeps no added space: the prompt's tokens spell it back.
    const ids = await toolsModel.tokenizeAsync(tools.generationPrompt, { addSpecial: false });
    expect(toolsModel.detokenize(ids, { unparseSpecial: true })).toBe(tools.generationPrompt);
  });
});

describe('messagesJson, tokenize and reasoning', () => {
  it('messages as JSON bytes and the prompt tokenized in the same job give what the text path gives', async () => {
    const messages = [
      { role: 'user', content: 'Hello' },
      { role: 'assistant', content: 'Hi' },
      { role: 'user', content: 'Weather?' },
    ];
    const text = await toolsModel.applyChatCommonAsync({ messages, tools: [weather] });
    const bytes = await toolsModel.applyChatCommonAsync(
      { tools: [weather] },
      { messagesJson: new TextEncoder().encode(JSON.stringify(messages)), tokenize: true },
    );
    expect(bytes.prompt).toBe('');
    expect(bytes.promptBytes).toBe(Buffer.byteLength(text.prompt));
    expect(Array.from(bytes.tokens!)).toEqual(Array.from(await toolsModel.tokenizeAsync(text.prompt)));
    expect(bytes.grammar).toBe(text.grammar);
  });

  it('a thinking template splits reasoning_content out of the reply (reasoning_format auto), or leaves it (none)', async () => {
    const qwen3 = readFileSync(
      fileURLToPath(new URL('../upstream/models/templates/Qwen-Qwen3-0.6B.jinja', import.meta.url)),
      'utf8',
    );
    const body = { messages: [{ role: 'user', content: 'Why?' }] };
    const auto = await model.applyChatCommonAsync(body, { template: qwen3 });
    expect(auto.supportsThinking).toBe(true);
    const reply = `${auto.generationPrompt.includes('<think>') ? '' : '<think>'}because\n</think>\n\nIt is.`;
    const parsed = await parseChatOutput(reply, auto);
    expect(parsed.reasoningContent.trim()).toBe('because');
    expect(parsed.content).toBe('It is.');
    const none = await model.applyChatCommonAsync(body, { template: qwen3, reasoningFormat: 'none' });
    const kept = await parseChatOutput(reply, none);
    expect(kept.reasoningContent).toBe('');
    expect(kept.content).toContain('because');
  });
});
