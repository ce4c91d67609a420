import { randomBytes } from 'node:crypto';
import {
  type ChatCommonParams,
  type Model,
  type ParsedChatMessage,
  parseChatOutput,
  type SamplerParams,
} from '@hydra-engine/native-ggml';
import { HydraError } from './errors.js';

/** llama-server's `--reasoning-format` words (common_reasoning_format_from_name). */
export const REASONING_FORMATS = ['none', 'auto', 'deepseek', 'deepseek-legacy'] as const;

/** Server-wide settings of the Jinja chat path (llama-server's flags of the same names). */
export interface JinjaChatOptions {
  /** `--chat-template(-file)`: used instead of the model's template. */
  template?: string;
  /** `--reasoning-format` (default auto). */
  reasoningFormat?: string;
  /** `--chat-template-kwargs`: template variables; a request's own win. */
  chatTemplateKwargs?: Record<string, unknown>;
}

/** The body fields that the common chat layer reads; the sampler settings must not see them. */
const CHAT_LAYER_FIELDS = [
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'chat_template_kwargs',
  'reasoning_format',
  'reasoning_effort',
  'add_generation_prompt',
] as const;

function bad(message: string, key: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_VALUE', message, { keys: [key] });
}

/**
 * Checks the chat-layer fields of a body by name (HYDRA_ERR_BAD_VALUE, keys: the field), as
 * llama-server reads them; what the layer itself refuses later (a message it cannot read, a
 * template error) is a 400 too.
 */
export function checkChatFields(body: Record<string, unknown>): void {
  const {
    tools,
    tool_choice,
    parallel_tool_calls,
    chat_template_kwargs,
    reasoning_format,
    reasoning_effort,
  } = body;
  if (tools !== undefined && tools !== null) {
    if (!Array.isArray(tools))
      throw bad('tools must be an array of {type: "function", function: {...}}', 'tools');
    for (const [i, t] of tools.entries()) {
      const f = (t as Record<string, unknown> | null)?.function as Record<string, unknown> | undefined;
      if (
        (t as Record<string, unknown> | null)?.type !== 'function' ||
        typeof f?.name !== 'string' ||
        f.name === ''
      )
        throw bad(`tools[${i}] must be {type: "function", function: {name, parameters?}}`, 'tools');
      if (f.parameters !== undefined && (typeof f.parameters !== 'object' || f.parameters === null))
        throw bad(`tools[${i}].function.parameters must be a JSON schema object`, 'tools');
    }
  }
  if (tool_choice !== undefined && tool_choice !== null) {
    const named = tool_choice as Record<string, unknown>;
    const ok =
      tool_choice === 'none' ||
      tool_choice === 'auto' ||
      tool_choice === 'required' ||
      (typeof tool_choice === 'object' &&
        named.type === 'function' &&
        typeof (named.function as Record<string, unknown> | undefined)?.name === 'string');
    if (!ok)
      throw bad(
        'tool_choice must be "none", "auto", "required" or {type: "function", function: {name}}',
        'tool_choice',
      );
    if (typeof tool_choice === 'object') {
      const name = (named.function as Record<string, unknown>).name;
      const known =
        Array.isArray(tools) &&
        tools.some((t) => (t as { function?: { name?: unknown } }).function?.name === name);
      if (!known) throw bad(`tool_choice names ${String(name)}, which is not in tools`, 'tool_choice');
    }
  }
  if (
    parallel_tool_calls !== undefined &&
    parallel_tool_calls !== null &&
    typeof parallel_tool_calls !== 'boolean'
  )
    throw bad('parallel_tool_calls must be a boolean', 'parallel_tool_calls');
  if (
    chat_template_kwargs !== undefined &&
    chat_template_kwargs !== null &&
    (typeof chat_template_kwargs !== 'object' || Array.isArray(chat_template_kwargs))
  )
    throw bad('chat_template_kwargs must be an object', 'chat_template_kwargs');
  if (
    reasoning_format !== undefined &&
    reasoning_format !== null &&
    !(REASONING_FORMATS as readonly unknown[]).includes(reasoning_format)
  )
    throw bad(`reasoning_format must be one of ${REASONING_FORMATS.join(', ')}`, 'reasoning_format');
  if (reasoning_effort !== undefined && reasoning_effort !== null && typeof reasoning_effort !== 'string')
    throw bad('reasoning_effort must be a string', 'reasoning_effort');
  // continue_final_message is not read by this engine's chat layer call: refused, not dropped.
  const cont = body.continue_final_message;
  if (cont !== undefined && cont !== null && cont !== false)
    throw new HydraError('HYDRA_ERR_UNSUPPORTED_FIELD', 'continue_final_message is not supported yet', {
      keys: ['continue_final_message'],
    });
  if (body.add_generation_prompt !== undefined && typeof body.add_generation_prompt !== 'boolean')
    throw bad('add_generation_prompt must be a boolean', 'add_generation_prompt');
}

/** The body without the chat-layer fields, for the sampler settings (which refuse tools). */
export function withoutChatFields(body: Record<string, unknown>): Record<string, unknown> {
  const rest = { ...body };
  for (const f of CHAT_LAYER_FIELDS) delete rest[f];
  return rest;
}

/**
 * Renders a chat body through llama.cpp's common chat layer (off the JS thread); `messagesJson` is
 * the body's messages as JSON text. `tokenize`: the prompt comes back as `tokens` only.
 */
export async function renderJinjaChat(
  model: Model,
  body: Record<string, unknown>,
  messagesJson: Uint8Array,
  options: JinjaChatOptions,
  tokenize = false,
): Promise<ChatCommonParams> {
  checkChatFields(body);
  const input: Record<string, unknown> = {};
  for (const f of CHAT_LAYER_FIELDS) if (body[f] !== undefined && body[f] !== null) input[f] = body[f];
  try {
    return await model.applyChatCommonAsync(input, {
      messagesJson,
      tokenize,
      ...(options.template !== undefined ? { template: options.template } : {}),
      reasoningFormat: options.reasoningFormat ?? 'auto',
      chatTemplateKwargs: options.chatTemplateKwargs ?? {},
    });
  } catch (err) {
    const e = err as HydraError;
    if (e.code !== 'HYDRA_ERR_BAD_ARGUMENT') throw err;
    throw new HydraError('HYDRA_ERR_BAD_REQUEST', `the chat template refused the request: ${e.message}`, {
      keys: ['messages'],
      cause: err,
    });
  }
}

// std::regex ECMAScript escaping as common's regex_escape does it.
function regexEscape(s: string): string {
  return s.replace(/[.^$|()*+?[\]{}\\]/g, '\\$&');
}

/**
 * The sampler of a rendered chat: the layer's grammar (lazy with its triggers, or prefilled with
 * the generation prompt), as common_sampler_init builds it. A request grammar or schema next to
 * the layer's grammar is refused by name, as llama-server refuses a grammar with tools.
 */
export function chatSampler(
  sampler: SamplerParams,
  rendered: ChatCommonParams,
  body: Record<string, unknown>,
): SamplerParams {
  if (rendered.grammar === '') return sampler;
  for (const f of ['grammar', 'json_schema', 'response_format'] as const) {
    const v = body[f];
    if (
      v !== undefined &&
      v !== null &&
      !(f === 'response_format' && (v as { type?: unknown }).type === 'text')
    )
      throw bad(`${f} cannot be used with tools`, f);
  }
  const patterns: string[] = [];
  const tokens: number[] = [];
  for (const t of rendered.grammarTriggers) {
    if (t.type === 'word') patterns.push(regexEscape(t.value));
    else if (t.type === 'pattern') patterns.push(t.value);
    else if (t.type === 'pattern_full')
      patterns.push(
        t.value === ''
          ? '^$'
          : `${t.value.startsWith('^') ? '' : '^'}${t.value}${t.value.endsWith('$') ? '' : '$'}`,
      );
    else if (t.token !== undefined) tokens.push(t.token);
  }
  return {
    ...sampler,
    grammar: rendered.grammar,
    ...(rendered.grammarLazy
      ? { grammarLazy: true, grammarTriggerPatterns: patterns, grammarTriggerTokens: tokens }
      : { grammarPrefill: rendered.generationPrompt }),
  };
}

/** An OpenAI tool call of a reply. */
export interface OpenAiToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

// llama-server's gen_tool_call_id: 32 random letters and digits.
function toolCallId(): string {
  const abc = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
  return [...randomBytes(32)].map((b) => abc[b % abc.length]).join('');
}

/** The assistant message of a finished reply, in OpenAI's shape, and its finish reason. */
export async function chatReply(
  text: string,
  rendered: ChatCommonParams,
  finishReason: string,
): Promise<{ message: Record<string, unknown>; finishReason: string }> {
  const msg = await parseChatOutput(text, rendered).catch(() => undefined);
  // Text the format cannot read is given back as content, as llama-server does for a final reply
  // it fails to parse with tool calls off.
  if (!msg) return { message: { role: 'assistant', content: text }, finishReason };
  // llama-server keeps its last non-empty parse; with none (the text parsed to nothing, e.g. only
  // whitespace before a call that never came) the reply is the raw text.
  if (msg.content === '' && msg.reasoningContent === '' && msg.toolCalls.length === 0)
    return { message: { role: 'assistant', content: text }, finishReason };
  const toolCalls: OpenAiToolCall[] = msg.toolCalls.map((c) => ({
    id: c.id || toolCallId(),
    type: 'function',
    function: { name: c.name, arguments: c.arguments },
  }));
  const message: Record<string, unknown> = {
    role: 'assistant',
    content: toolCalls.length > 0 && msg.content === '' ? null : msg.content,
  };
  if (msg.reasoningContent !== '') message.reasoning_content = msg.reasoningContent;
  if (toolCalls.length > 0) message.tool_calls = toolCalls;
  return {
    message,
    finishReason: toolCalls.length > 0 && finishReason === 'stop' ? 'tool_calls' : finishReason,
  };
}

/**
 * Streams a reply's deltas as llama-server does (common_chat_msg_diff): the text so far is parsed
 * (partial) after each piece and what changed goes out as `content`, `reasoning_content` and
 * `tool_calls` deltas (the first of a call with its id and name, the rest argument text).
 */
export class ChatStreamDiff {
  readonly #rendered: ChatCommonParams;
  readonly #emit: (delta: Record<string, unknown>) => void;
  #text = '';
  #prev: ParsedChatMessage = { content: '', reasoningContent: '', toolCalls: [] };
  #ids: string[] = [];
  #chain: Promise<void> = Promise.resolve();
  #calls = 0;

  constructor(rendered: ChatCommonParams, emit: (delta: Record<string, unknown>) => void) {
    this.#rendered = rendered;
    this.#emit = emit;
  }

  /** Whether any tool call went out. */
  get calledTools(): boolean {
    return this.#calls > 0;
  }

  /** Adds generated text; its deltas go out in order. */
  push(piece: string): void {
    this.#text += piece;
    const text = this.#text;
    this.#chain = this.#chain.then(() => this.#step(text, true));
  }

  /** Parses the whole reply (not partial) and sends what is left. */
  async end(): Promise<void> {
    const text = this.#text;
    this.#chain = this.#chain.then(() => this.#step(text, false));
    await this.#chain;
  }

  async #step(text: string, partial: boolean): Promise<void> {
    const msg = await parseChatOutput(text, this.#rendered, partial).catch(() =>
      partial ? undefined : { content: text, reasoningContent: '', toolCalls: [] },
    );
    if (!msg) return;
    const prev = this.#prev;
    const delta: Record<string, unknown> = {};
    if (
      msg.reasoningContent.startsWith(prev.reasoningContent) &&
      msg.reasoningContent !== prev.reasoningContent
    )
      delta.reasoning_content = msg.reasoningContent.slice(prev.reasoningContent.length);
    if (msg.content.startsWith(prev.content) && msg.content !== prev.content)
      delta.content = msg.content.slice(prev.content.length);
    const calls: Record<string, unknown>[] = [];
    for (let i = 0; i < msg.toolCalls.length; i++) {
      const c = msg.toolCalls[i]!;
      const before = prev.toolCalls[i];
      if (!before) {
        if (c.name === '') continue;
        this.#ids[i] ??= c.id || toolCallId();
        calls.push({
          index: i,
          id: this.#ids[i],
          type: 'function',
          function: { name: c.name, arguments: c.arguments },
        });
      } else if (c.arguments.startsWith(before.arguments) && c.arguments !== before.arguments) {
        calls.push({ index: i, function: { arguments: c.arguments.slice(before.arguments.length) } });
      }
    }
    if (calls.length > 0) {
      delta.tool_calls = calls;
      this.#calls += calls.length;
    }
    // A call is kept as "seen" only once its name went out.
    this.#prev = { ...msg, toolCalls: msg.toolCalls.filter((c, i) => prev.toolCalls[i] || c.name !== '') };
    if (Object.keys(delta).length > 0) this.#emit(delta);
  }
}
