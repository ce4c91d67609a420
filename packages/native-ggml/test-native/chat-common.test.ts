import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initBackend, Model, parseChatOutput } from '../src/index.js';
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
beforeAll(async () => {
  initBackend();
  model = await Model.load({ path: await tinyModel('f32'), nGpuLayers: 0 });
});
afterAll(() => model?.dispose());

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
