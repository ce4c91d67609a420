import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Model } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { tinyModel as kitTinyModel } from '@hydra-engine/test-kit';
import { parseServeArgs } from '../src/args.js';
import { type RunningEngine, startEngine } from '../src/serve.js';

export { CLI, runCli, waitFor } from '@hydra-engine/test-kit';

/** The fresh tiny synthetic model, in a folder of its own (variants may be written beside it). */
export const tinyModel = (): Promise<string> => kitTinyModel();

const quiet = { write: () => true };

/** An in-process engine on 127.0.0.1 with an ephemeral port, model loaded. */
export async function engineWith(flags: string[]): Promise<RunningEngine & { url: string }> {
  const running = await startEngine(
    parseServeArgs(['--port', '0', '--progress', 'off', '-t', '1', ...flags]),
    { log: quiet },
  );
  await running.loaded;
  return Object.assign(running, { url: `http://127.0.0.1:${running.httpPort}` });
}

/** A JSON POST to `url + path`: the status and the parsed reply. */
export async function postJson(
  url: string,
  path: string,
  body: unknown,
): Promise<{ status: number; json: any }> {
  const res = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: (await res.json()) as any };
}

/** The tool-calling suites' model: the tiny llama, f32, seed 5, with `chat: 'tools'`, in a fresh folder. */
export async function tinyToolsModel(prefix: string): Promise<string> {
  const out = join(mkdtempSync(join(tmpdir(), prefix)), 'tiny-tools.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 5, out, chat: 'tools' });
  return out;
}

/**
 * A logit_bias for {@link tinyToolsModel}: the chat layer's grammar lets text come before a call,
 * up to "<tool_call>\n", and random weights would write text for long, so those two tokens are
 * favoured, and the end of the turn once the grammar allows it.
 */
export async function toolCallBias(model: Model): Promise<Record<string, number>> {
  const [newline] = await model.tokenizeAsync('\n', { addSpecial: false });
  return { [model.info.nVocab - 2]: 10, [newline!]: 10, [model.info.eos]: 20 };
}

/** The tool suites' `pick_city` arguments: a city of two and 1-9 days, both required. */
export const pickCityParameters = {
  type: 'object',
  properties: {
    city: { type: 'string', enum: ['Paris', 'Rome'] },
    days: { type: 'integer', minimum: 1, maximum: 9 },
  },
  required: ['city', 'days'],
};

/** A chat tool whose arguments are all optional. */
export const weatherTool = {
  type: 'function' as const,
  function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } },
};

/** A chat that already holds a get_weather call and its result, ending on a user turn. */
export const toolConversation = [
  { role: 'system', content: 'Plan trips.' },
  { role: 'user', content: 'Weather in Paris?' },
  {
    role: 'assistant',
    content: null,
    tool_calls: [
      { id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } },
    ],
  },
  { role: 'tool', tool_call_id: 'c1', content: 'sunny' },
  { role: 'user', content: 'Then pick a city.' },
];
