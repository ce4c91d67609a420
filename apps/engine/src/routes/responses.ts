// OpenAI's Responses API (`/v1/responses`, `/responses`) as llama-server serves it: the body is
// converted to a chat completion (server_chat_convert_responses_to_chatcmpl), run through the chat
// path, and answered as a `response` object or its streamed events (to_json_oaicompat_resp*).
import { randomBytes } from 'node:crypto';
import { HydraError } from '../errors.js';
import { complete, inputTokens } from './completions.js';
import { badRequest, type RouteModule, sendError } from './plumbing.js';

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
const isString = (o: Json, k: string) => typeof o[k] === 'string';

function unsupported(key: string, why: string): HydraError {
  return new HydraError('HYDRA_ERR_UNSUPPORTED_FIELD', `${key}: ${why}`, { keys: [key] });
}

function inputText(parts: unknown[], at: string): Json[] {
  return parts.map((p, j) => {
    const type = isObject(p) ? p.type : undefined;
    if (type === 'input_text' || type === 'output_text') {
      if (!isString(p as Json, 'text')) throw badRequest(`${at}[${j}].text must be a string`, 'input');
      return { type: 'text', text: (p as Json).text };
    }
    if (type === 'refusal') {
      if (!isString(p as Json, 'refusal')) throw badRequest(`${at}[${j}].refusal must be a string`, 'input');
      return { type: 'refusal', refusal: (p as Json).refusal };
    }
    if (type === 'input_image' || type === 'input_file')
      throw unsupported('input', `${at}[${j}]: ${type} (multimodal input is not implemented)`);
    throw badRequest(`${at}[${j}].type must be input_text or output_text`, 'input');
  });
}

/**
 * A Responses body as a chat completion body, item by item as llama-server converts it: input
 * messages, assistant output messages (merged into the assistant turn before), function calls and
 * their outputs, reasoning items; `instructions` as the system message; function tools; and
 * `max_output_tokens`, `reasoning.effort`, `text.format`, a named `tool_choice` renamed. What it
 * cannot honour is refused by name: `previous_response_id`, `store: true`, `background`,
 * `include`, non-function tools.
 */
export function responsesToChat(body: Json): Json {
  if (body.input === undefined) throw badRequest("'input' is required", 'input');
  if (typeof body.previous_response_id === 'string' && body.previous_response_id !== '')
    throw unsupported('previous_response_id', 'responses are not stored; send the conversation as input');
  if (body.store === true) throw unsupported('store', 'responses are not stored (send store: false)');
  if (body.background === true) throw unsupported('background', 'background responses are not implemented');
  if (Array.isArray(body.include) && body.include.length > 0)
    throw unsupported('include', 'extra output data is not implemented');
  const {
    input,
    instructions,
    tools,
    max_output_tokens,
    reasoning,
    text,
    tool_choice,
    store: _s,
    include: _i,
    previous_response_id: _p,
    background: _b,
    ...rest
  } = body;
  const chat: Json = { ...rest };
  const messages: Json[] = [];
  if (instructions !== undefined && instructions !== null) {
    if (typeof instructions !== 'string') throw badRequest('instructions must be a string', 'instructions');
    messages.push({ role: 'system', content: instructions });
  }
  if (typeof input === 'string') messages.push({ role: 'user', content: input });
  else if (Array.isArray(input)) {
    input.forEach((raw, i) => {
      if (!isObject(raw)) throw badRequest(`input[${i}] must be an object`, 'input');
      const item: Json = { ...raw };
      const at = `input[${i}]`;
      const prev = messages.at(-1);
      const mergePrev = prev?.role === 'assistant';
      if (typeof item.content === 'string' && item.type !== 'message')
        item.content = [{ type: 'input_text', text: item.content }];
      const role = item.role;
      if (Array.isArray(item.content) && (role === 'user' || role === 'system' || role === 'developer')) {
        messages.push({ role, content: inputText(item.content, `${at}.content`) });
      } else if (role === 'assistant' && item.type === 'message') {
        const content =
          typeof item.content === 'string'
            ? [{ type: 'text', text: item.content }]
            : Array.isArray(item.content)
              ? inputText(item.content, `${at}.content`)
              : [];
        if (mergePrev) prev!.content = [...(Array.isArray(prev!.content) ? prev!.content : []), ...content];
        else messages.push({ role: 'assistant', content });
      } else if (
        item.type === 'function_call' &&
        isString(item, 'arguments') &&
        isString(item, 'call_id') &&
        isString(item, 'name')
      ) {
        const call = {
          id: item.call_id,
          type: 'function',
          function: { name: item.name, arguments: item.arguments },
        };
        if (mergePrev) prev!.tool_calls = [...((prev!.tool_calls as Json[] | undefined) ?? []), call];
        else messages.push({ role: 'assistant', content: null, tool_calls: [call] });
      } else if (
        item.type === 'function_call_output' &&
        isString(item, 'call_id') &&
        (typeof item.output === 'string' || Array.isArray(item.output))
      ) {
        const content =
          typeof item.output === 'string'
            ? item.output
            : (item.output as unknown[]).map((o, j) => {
                if (!isObject(o) || o.type !== 'input_text' || typeof o.text !== 'string')
                  throw badRequest(`${at}.output[${j}] must be input_text`, 'input');
                return { type: 'text', text: o.text };
              });
        messages.push({ role: 'tool', content, tool_call_id: item.call_id });
      } else if (item.type === 'reasoning' && Array.isArray(item.summary)) {
        const first = Array.isArray(item.content) ? (item.content[0] as Json | undefined) : undefined;
        if (!first || typeof first.text !== 'string')
          throw badRequest(`${at}.content[0].text must be a string`, 'input');
        if (mergePrev) prev!.reasoning_content = first.text;
        else messages.push({ role: 'assistant', content: [], reasoning_content: first.text });
      } else throw badRequest(`cannot determine the type of ${at}`, 'input');
    });
  } else throw badRequest("'input' must be a string or an array of items", 'input');
  if (messages.length === 0) throw badRequest("'input' must not be empty", 'input');
  chat.messages = messages;
  if (tools !== undefined && tools !== null) {
    if (!Array.isArray(tools)) throw badRequest('tools must be an array of objects', 'tools');
    chat.tools = tools.map((t, i) => {
      if (!isObject(t) || t.type !== 'function')
        throw unsupported('tools', `tools[${i}]: only function tools are implemented`);
      const { type: _t, ...fn } = t;
      return { type: 'function', function: { strict: true, ...fn } };
    });
  }
  if (tool_choice !== undefined && tool_choice !== null)
    chat.tool_choice =
      isObject(tool_choice) && tool_choice.type === 'function' && typeof tool_choice.name === 'string'
        ? { type: 'function', function: { name: tool_choice.name } }
        : tool_choice;
  if (max_output_tokens !== undefined) chat.max_tokens = max_output_tokens;
  if (reasoning !== undefined && reasoning !== null) {
    if (!isObject(reasoning)) throw badRequest('reasoning must be an object', 'reasoning');
    const { effort, ...other } = reasoning;
    if (Object.keys(other).length > 0)
      throw unsupported('reasoning', `${Object.keys(other).join(', ')} (only effort is implemented)`);
    if (effort !== undefined) chat.reasoning_effort = effort;
  }
  if (text !== undefined && text !== null) {
    if (!isObject(text)) throw badRequest('text must be an object', 'text');
    const { format, ...other } = text;
    if (Object.keys(other).length > 0)
      throw unsupported('text', `${Object.keys(other).join(', ')} (only format is implemented)`);
    if (isObject(format)) {
      const { type, ...schema } = format;
      chat.response_format =
        type === 'json_schema' ? { type, json_schema: schema } : type === 'json_object' ? { type } : format;
    } else if (format !== undefined) throw badRequest('text.format must be an object', 'text');
  }
  return chat;
}

const randomId = () => randomBytes(16).toString('hex');

/** A finished reply's output items (to_json_oaicompat_resp). */
export function responseOutput(message: Json, ids: { message: string; reasoning: string }): Json[] {
  const out: Json[] = [];
  const reasoning = typeof message.reasoning_content === 'string' ? message.reasoning_content : '';
  const content = typeof message.content === 'string' ? message.content : '';
  if (reasoning !== '')
    out.push({
      id: ids.reasoning,
      summary: [],
      type: 'reasoning',
      content: [{ text: reasoning, type: 'reasoning_text' }],
      encrypted_content: '',
      status: 'completed',
    });
  if (content !== '')
    out.push({
      content: [{ type: 'output_text', annotations: [], logprobs: [], text: content }],
      id: ids.message,
      role: 'assistant',
      status: 'completed',
      type: 'message',
    });
  for (const call of (message.tool_calls as {
    id: string;
    function: { name: string; arguments: string };
  }[]) ?? [])
    out.push({
      id: `fc_${call.id}`,
      type: 'function_call',
      status: 'completed',
      arguments: call.function.arguments,
      call_id: `call_${call.id}`,
      name: call.function.name,
    });
  return out;
}

/** The `response` object of a finished reply. */
export function responseObject(
  id: string,
  model: string,
  output: Json[],
  usage: { prompt_tokens: number; completion_tokens: number; cached_tokens: number },
): Json {
  const t = Math.floor(Date.now() / 1000);
  return {
    completed_at: t,
    created_at: t,
    id,
    model,
    object: 'response',
    output,
    status: 'completed',
    usage: {
      input_tokens: usage.prompt_tokens,
      output_tokens: usage.completion_tokens,
      total_tokens: usage.prompt_tokens + usage.completion_tokens,
      input_tokens_details: { cached_tokens: usage.cached_tokens },
    },
  };
}

/**
 * A reply's events as llama-server streams them: response.created and in_progress first, then per
 * chat delta the items it opens and their text, reasoning and argument deltas; {@link end} sends
 * the done events and response.completed.
 */
export class ResponsesStream {
  readonly id = `resp_${randomId()}`;
  readonly ids = { message: `msg_${randomId()}`, reasoning: `rs_${randomId()}` };
  readonly #emit: (event: string, data: Json) => void;
  #created = false;
  #text = false;
  #thinking = false;
  #content = '';
  #reasoning = '';
  readonly #calls: { id: string; function: { name: string; arguments: string } }[] = [];

  constructor(emit: (event: string, data: Json) => void) {
    this.#emit = emit;
  }

  #event(type: string, data: Json): void {
    this.#emit(type, { type, ...data });
  }

  #start(): void {
    if (this.#created) return;
    this.#created = true;
    for (const type of ['response.created', 'response.in_progress'])
      this.#event(type, { response: { id: this.id, object: 'response', status: 'in_progress' } });
  }

  /** One chat delta (content, reasoning_content, tool_calls as ChatStreamDiff emits them). */
  delta(d: Json): void {
    this.#start();
    if (typeof d.reasoning_content === 'string' && d.reasoning_content !== '') {
      if (!this.#thinking) {
        this.#thinking = true;
        this.#event('response.output_item.added', {
          item: {
            id: this.ids.reasoning,
            summary: [],
            type: 'reasoning',
            content: [],
            encrypted_content: '',
            status: 'in_progress',
          },
        });
      }
      this.#reasoning += d.reasoning_content;
      this.#event('response.reasoning_text.delta', {
        delta: d.reasoning_content,
        item_id: this.ids.reasoning,
      });
    }
    if (typeof d.content === 'string' && d.content !== '') {
      if (!this.#text) {
        this.#text = true;
        this.#event('response.output_item.added', {
          item: {
            content: [],
            id: this.ids.message,
            role: 'assistant',
            status: 'in_progress',
            type: 'message',
          },
        });
        this.#event('response.content_part.added', {
          item_id: this.ids.message,
          part: { type: 'output_text', text: '' },
        });
      }
      this.#content += d.content;
      this.#event('response.output_text.delta', { item_id: this.ids.message, delta: d.content });
    }
    for (const c of (d.tool_calls as { index: number; id?: string; function: Json }[] | undefined) ?? []) {
      if (c.id !== undefined) {
        const name = String(c.function.name);
        this.#calls[c.index] = { id: c.id, function: { name, arguments: '' } };
        this.#event('response.output_item.added', {
          item: {
            id: `fc_${c.id}`,
            arguments: '',
            call_id: `call_${c.id}`,
            name,
            type: 'function_call',
            status: 'in_progress',
          },
        });
      }
      const call = this.#calls[c.index];
      const args = typeof c.function.arguments === 'string' ? c.function.arguments : '';
      if (call && args !== '') {
        call.function.arguments += args;
        this.#event('response.function_call_arguments.delta', { delta: args, item_id: `fc_${call.id}` });
      }
    }
  }

  /** The done events and response.completed (to_json_oaicompat_resp_stream). */
  end(
    model: string,
    usage: { prompt_tokens: number; completion_tokens: number; cached_tokens: number },
  ): void {
    this.#start();
    const message: Json = {
      content: this.#content,
      reasoning_content: this.#reasoning,
      tool_calls: this.#calls,
    };
    const output = responseOutput(message, this.ids);
    for (const item of output) {
      if (item.type === 'reasoning') {
        const { status: _s, ...done } = item;
        this.#event('response.output_item.done', { item: done });
      } else if (item.type === 'message') {
        const part = (item.content as Json[])[0]!;
        this.#event('response.output_text.done', { item_id: this.ids.message, text: this.#content });
        this.#event('response.content_part.done', { item_id: this.ids.message, part });
        this.#event('response.output_item.done', { item });
      } else this.#event('response.output_item.done', { item });
    }
    const { completed_at: _c, ...response } = responseObject(this.id, model, output, usage);
    this.#event('response.completed', { response });
  }
}

const PATHS = new Set(['/v1/responses', '/responses']);
const COUNT_PATHS = new Set(['/v1/responses/input_tokens', '/responses/input_tokens']);

export const responsesRoutes: RouteModule = (ctx) => async (req, res, _url, path) => {
  const count = COUNT_PATHS.has(path);
  if (!PATHS.has(path) && !count) return false;
  if (req.method !== 'POST') {
    ctx.methodNotAllowed(req, res);
    return true;
  }
  const data = await ctx.readBody(req).catch((err) => {
    sendError(res, err, { connection: 'close' });
    return undefined;
  });
  if (data === undefined) return true;
  let body: unknown;
  try {
    body = JSON.parse(data.toString('utf8'));
  } catch (err) {
    throw new HydraError('HYDRA_ERR_BAD_JSON', `the body is not valid JSON: ${(err as Error).message}`);
  }
  if (!isObject(body)) throw badRequest('the body must be a JSON object');
  const chat = Buffer.from(JSON.stringify(responsesToChat(body)));
  const prepared = await ctx.bodies.parse(chat, true, ctx.messageLimit(), ctx.opts.jinja !== false);
  if (count) ctx.send(res, 200, await inputTokens(ctx, prepared));
  else await complete(ctx, req, res, prepared, 'responses');
  return true;
};
