// The OpenAI-compatible completions and chat (`/v1/completions`, `/v1/chat/completions`, also
// without `/v1`) and llama-server's native `/completion` (`/completions`): a body in, one
// generation through the engine, the answer streamed or whole in the route's shape.
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { type ChatCommonParams, jsonSchemaToGrammar } from '@hydra-engine/native-ggml';
import type { PreparedBody } from '../body.js';
import { ChatStreamDiff, chatReply, chatSampler, renderJinjaChat, withoutChatFields } from '../chat.js';
import type { Engine, GenerationParams, GenerationResult } from '../engine.js';
import { HydraError } from '../errors.js';
import { checkSampler, requestSettings } from '../request-params.js';
import { chatTemplateOptions, generationSettings, stopType } from './llama.js';
import { badRequest, type RouteContext, type RouteModule, sendError, sendJson } from './plumbing.js';

/** llama-server's `timings` of a native answer (server_slot_stats::to_json). */
function nativeTimings(
  result: GenerationResult,
  promptMs: number,
  predictedMs: number,
): Record<string, number> {
  const promptN = result.promptTokens - result.cachedTokens;
  const n = result.completionTokens;
  return {
    cache_n: result.cachedTokens,
    prompt_n: promptN,
    prompt_ms: promptMs,
    prompt_per_token_ms: promptN > 0 ? promptMs / promptN : 0,
    prompt_per_second: promptMs > 0 ? (1000 * promptN) / promptMs : 0,
    predicted_n: n,
    predicted_ms: predictedMs,
    predicted_per_token_ms: n > 0 ? predictedMs / n : 0,
    predicted_per_second: predictedMs > 0 ? (1000 * n) / predictedMs : 0,
  };
}

/** llama-server's `response_fields` (json_get_nested_values): only those paths, `a/b` keyed as given. */
function pickFields(fields: unknown, answer: Record<string, unknown>): Record<string, unknown> {
  if (!Array.isArray(fields) || fields.length === 0) return answer;
  const out: Record<string, unknown> = {};
  for (const path of fields as string[]) {
    let at: unknown = answer;
    let found = true;
    for (const k of path.split('/')) {
      if (found && typeof at === 'object' && at !== null && !Array.isArray(at) && k in at)
        at = (at as Record<string, unknown>)[k];
      else found = false;
    }
    if (found) out[path] = at;
  }
  return out;
}

/** Validates a request's T1 settings (see request-params.ts) and merges them over the configuration in force. */
export function generationParams(engine: Engine, body: Record<string, unknown>): GenerationParams {
  const settings = requestSettings(body, engine.layers.effective(), { jsonSchemaToGrammar });
  if (engine.model) checkSampler(engine.model, settings.sampler, settings.fields);
  let stop: string[] = [];
  if (typeof body.stop === 'string') stop = [body.stop];
  else if (Array.isArray(body.stop)) {
    if (!body.stop.every((s) => typeof s === 'string') || body.stop.length > 16) {
      throw badRequest('stop must be a string or an array of at most 16 strings', 'stop');
    }
    stop = body.stop as string[];
  } else if (body.stop !== undefined && body.stop !== null)
    throw badRequest('stop must be a string or an array of strings', 'stop');
  stop = stop.filter((s) => s.length > 0);
  return {
    maxTokens: settings.nPredict < 0 ? Number.MAX_SAFE_INTEGER : settings.nPredict,
    stop,
    sampler: settings.sampler,
    ignoreEos: settings.ignoreEos,
  };
}

// llama-server's native /completion answer (server_task_result_cmpl_final::to_json_non_oaicompat).
function nativeFinal(
  ctx: RouteContext,
  body: Record<string, unknown>,
  params: GenerationParams,
  prompt: Int32Array,
  result: GenerationResult,
  model: string,
  stream: boolean,
): Record<string, unknown> {
  const m = ctx.engine.model;
  const full = m ? Buffer.concat(result.tokens.map((t) => m.tokenBytes(t))).toString('utf8') : result.text;
  // The request's settings once more, for their names (already validated; the grammar fields are
  // taken from the sampler, which holds the converted grammar).
  const { json_schema: _j, response_format: _r, ...plain } = body;
  const settings = requestSettings(plain, ctx.engine.layers.effective()).effective;
  const grammar = (params.sampler as { grammar?: string }).grammar;
  if (grammar !== undefined) settings['sampling.grammar'] = grammar;
  const nCtx = ctx.engine.slots.nCtxSeq;
  return {
    index: 0,
    content: result.text,
    tokens: body.return_tokens === true || stream ? result.tokens : [],
    id_slot: result.slot,
    stop: true,
    model,
    tokens_predicted: result.completionTokens,
    tokens_evaluated: result.promptTokens,
    generation_settings: {
      n_ctx: nCtx,
      model,
      ...generationSettings(settings, { stop: params.stop, stream }),
    },
    prompt: typeof body.prompt === 'string' ? body.prompt : m ? m.detokenize(prompt) : '',
    has_new_line: result.text.includes('\n'),
    truncated: result.finishReason === 'length' && result.promptTokens + result.completionTokens >= nCtx,
    ...stopType(result, params, full),
    tokens_cached: result.cachedTokens,
  };
}

function checkPromptBytes(ctx: RouteContext, bytes: number, key: string): void {
  const limit = ctx.promptByteLimit();
  if (bytes > limit) {
    throw new HydraError(
      'HYDRA_ERR_PROMPT_TOO_LARGE',
      `the prompt is ${bytes} bytes; the limit is ${limit}`,
      {
        keys: [key],
      },
    );
  }
}

async function complete(
  ctx: RouteContext,
  req: IncomingMessage,
  res: ServerResponse,
  prepared: PreparedBody,
  chat: boolean,
  native = false,
): Promise<void> {
  const { engine } = ctx;
  const { body } = prepared;
  const stream = body.stream === true;
  if (body.stream !== undefined && typeof body.stream !== 'boolean')
    throw badRequest('stream must be a boolean', 'stream');
  const fields = body.response_fields;
  if (fields !== undefined && fields !== null) {
    if (!native)
      throw new HydraError('HYDRA_ERR_UNSUPPORTED_FIELD', 'response_fields is for /completion only', {
        keys: ['response_fields'],
      });
    if (!Array.isArray(fields) || !fields.every((f) => typeof f === 'string'))
      throw badRequest('response_fields must be an array of strings', 'response_fields');
  }
  let promptText = '';
  if (prepared.chat) checkPromptBytes(ctx, prepared.chat.bytes, 'messages');
  else if (!prepared.tokens) {
    if (typeof body.prompt !== 'string')
      throw badRequest('prompt must be a string or an array of token ids', 'prompt');
    checkPromptBytes(ctx, Buffer.byteLength(body.prompt), 'prompt');
    promptText = body.prompt;
  }
  const slotField = body.slot_id ?? body.id_slot;
  if (slotField !== undefined && slotField !== null && slotField !== -1 && !Number.isSafeInteger(slotField))
    throw badRequest('slot_id must be an integer', 'slot_id');
  if (body.cache_prompt !== undefined && typeof body.cache_prompt !== 'boolean')
    throw badRequest('cache_prompt must be a boolean', 'cache_prompt');
  // Jinja templates: llama.cpp's common chat layer renders the chat and gives the tool-call grammar.
  let rendered: ChatCommonParams | undefined;
  if (prepared.chat?.messagesJson) {
    engine.assertReady();
    rendered = await renderJinjaChat(
      engine.model!,
      body,
      prepared.chat.messagesJson,
      {
        ...(ctx.opts.chatTemplate !== undefined ? { template: ctx.opts.chatTemplate } : {}),
        ...(ctx.opts.reasoningFormat !== undefined ? { reasoningFormat: ctx.opts.reasoningFormat } : {}),
        ...(ctx.opts.chatTemplateKwargs !== undefined
          ? { chatTemplateKwargs: ctx.opts.chatTemplateKwargs }
          : {}),
      },
      true,
    );
  }
  let params = generationParams(engine, rendered ? withoutChatFields(body) : body);
  if (rendered) {
    params = {
      ...params,
      sampler: chatSampler(params.sampler, rendered, body),
      stop: [...params.stop, ...rendered.additionalStops],
    };
    if (engine.model && rendered.grammar !== '')
      checkSampler(engine.model, params.sampler, {
        grammar: 'tools',
        logit_bias: 'logit_bias',
        samplers: 'samplers',
      });
  }
  const chatOptions = prepared.chat && !rendered ? chatTemplateOptions(body) : undefined;
  let prompt: Int32Array;
  if (prepared.tokens) {
    const nVocab = engine.model?.info.nVocab ?? 0;
    if (prepared.tokens.max >= nVocab) throw badRequest(`prompt token ids must be below ${nVocab}`, 'prompt');
    engine.assertReady();
    prompt = prepared.tokens.ids;
  } else {
    // Rendering and tokenizing run off the JS thread: a big input must not stall /health. A model
    // swapped meanwhile has another vocabulary: the tokens are made again for the new one.
    let tokens: Int32Array | undefined;
    for (let attempt = 0; attempt < 2 && tokens === undefined; attempt++) {
      const model = engine.model;
      // The chat layer tokenized a rendered prompt in its own job, with the model it rendered for.
      const t = rendered
        ? rendered.tokens!
        : prepared.chat
          ? await (ctx.opts.chatTemplate === undefined && chatOptions!.addAssistant
              ? engine.chatTokensAsync(prepared.chat.packed)
              : engine.model!.tokenizeChatAsync(prepared.chat.packed, {
                  addAssistant: chatOptions!.addAssistant,
                  ...(ctx.opts.chatTemplate !== undefined ? { template: ctx.opts.chatTemplate } : {}),
                }))
          : await engine.tokenizeAsync(promptText);
      if (engine.model === model) tokens = t;
    }
    if (tokens === undefined)
      throw new HydraError('HYDRA_ERR_LOADING', 'the model changed while the prompt was tokenized');
    prompt = tokens;
    if (req.socket.destroyed) return;
  }
  const id = `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID()}`;
  const created = Math.floor(Date.now() / 1000);
  const model = ctx.modelName();
  const abort = new AbortController();
  const includeUsage = (body.stream_options as Record<string, unknown> | undefined)?.include_usage === true;
  const onClose = () => {
    if (!res.writableFinished) abort.abort();
  };
  res.on('close', onClose);
  const epochHeaders = ctx.epochHeader();
  let onText: ((t: string) => void) | undefined;
  const chunk = (delta: Record<string, unknown>, finish: string | null) =>
    chat
      ? {
          id,
          object: 'chat.completion.chunk',
          created,
          model,
          choices: [{ index: 0, delta, finish_reason: finish }],
        }
      : {
          id,
          object: 'text_completion',
          created,
          model,
          choices: [{ index: 0, text: delta.content ?? '', finish_reason: finish }],
        };
  const write = (obj: unknown) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
  let diff: ChatStreamDiff | undefined;
  // Generated token ids since the last streamed text (llama-server's native chunks carry them).
  let pendingTokens: number[] = [];
  let predicted = 0;
  if (stream && native) {
    onText = (text) => {
      if (!res.headersSent) {
        res.writeHead(200, {
          'content-type': 'text/event-stream',
          'cache-control': 'no-cache',
          connection: 'keep-alive',
          ...epochHeaders,
        });
      }
      write({
        index: 0,
        content: text,
        tokens: pendingTokens,
        stop: false,
        id_slot: -1,
        tokens_predicted: predicted,
        tokens_evaluated: prompt.length,
      });
      pendingTokens = [];
    };
  } else if (stream) {
    let first = true;
    const send = (delta: Record<string, unknown>) => {
      if (!res.headersSent) {
        res.writeHead(200, {
          'content-type': 'text/event-stream',
          'cache-control': 'no-cache',
          connection: 'keep-alive',
          ...epochHeaders,
        });
      }
      write(chunk(first && chat ? { role: 'assistant', ...delta } : delta, null));
      first = false;
    };
    // Parsing the text so far after every piece (as llama-server) is only needed where it can
    // differ from the text: tool calls or reasoning to split out.
    if (rendered && (rendered.parseToolCalls || rendered.supportsThinking)) {
      diff = new ChatStreamDiff(rendered, send);
      const d = diff;
      onText = (text) => d.push(text);
    } else onText = (text) => send({ content: text });
  }
  const rec = ctx.record(res);
  // Absolute times until the record is closed (#track makes ttftMs relative to the request).
  let lastToken = 0;
  const onToken = rec
    ? () => {
        lastToken = performance.now();
        rec.ttftMs ??= lastToken;
      }
    : undefined;
  // llama-server's timings, seen from here: the prompt from admission to the first token,
  // generation from there to the end.
  const submitted = performance.now();
  let firstToken: number | undefined;
  const nativeToken = native
    ? (t: number) => {
        firstToken ??= performance.now();
        if (stream) {
          pendingTokens.push(t);
          predicted++;
        }
        onToken?.();
      }
    : undefined;
  // Admission errors throw here, before any byte of the response.
  const pending = engine.submit(prompt, params, {
    signal: abort.signal,
    ...(onText ? { onText } : {}),
    ...(onToken ? { onToken } : {}),
    ...(nativeToken ? { onToken: nativeToken } : {}),
    ...(typeof slotField === 'number' && slotField >= 0 ? { slot: slotField } : {}),
    // On by default, as llama-server: a request that shares a slot's prefix skips its prefill.
    ...((body.cache_prompt ?? ctx.opts.cachePrompt ?? true) === true ? { cachePrompt: true } : {}),
  });
  let result: GenerationResult;
  try {
    result = await pending;
  } catch (err) {
    if (rec) rec.code = (err as HydraError).code ?? 'HYDRA_ERR_INTERNAL';
    if (res.headersSent) {
      const e = err as HydraError;
      write({ error: { message: e.message, code: e.code ?? 'HYDRA_ERR_INTERNAL' } });
      // The terminator too: an OpenAI client waits for it to tell an ended stream from a cut one.
      res.end('data: [DONE]\n\n');
      return;
    }
    throw err;
  } finally {
    res.off('close', onClose);
  }
  if (rec) {
    rec.promptTokens = result.promptTokens;
    rec.completionTokens = result.completionTokens;
    rec.cachedTokens = result.cachedTokens;
    rec.finishReason = result.finishReason;
    rec.epoch = result.epoch;
    rec.slot = result.slot;
    rec.queueMs = result.queueMs;
    if (rec.ttftMs !== undefined) rec.decodeMs = lastToken - rec.ttftMs;
  }
  if (result.finishReason === 'cancelled') {
    res.destroy();
    return;
  }
  const usage = {
    prompt_tokens: result.promptTokens,
    completion_tokens: result.completionTokens,
    total_tokens: result.promptTokens + result.completionTokens,
    prompt_tokens_details: { cached_tokens: result.cachedTokens },
  };
  const headers = { 'x-hydra-config-epoch': String(result.epoch) };
  if (native) {
    const ended = performance.now();
    // The prompt's time from when the request got its slot (llama-server's timings start there).
    const timings = nativeTimings(
      result,
      Math.max(0, (firstToken ?? ended) - submitted - result.queueMs),
      ended - (firstToken ?? ended),
    );
    const final = pickFields(body.response_fields, {
      ...nativeFinal(ctx, body, params, prompt, result, model, stream),
      timings,
    });
    if (stream) {
      if (!res.headersSent)
        res.writeHead(200, {
          'content-type': 'text/event-stream',
          'cache-control': 'no-cache',
          ...headers,
        });
      // llama-server ends a native stream with the final object (stop: true), no [DONE].
      write({ ...final, content: '', tokens: pendingTokens });
      res.end();
      return;
    }
    sendJson(res, 200, final, headers);
    return;
  }
  if (stream) {
    if (diff) await diff.end();
    if (!res.headersSent) {
      res.writeHead(200, {
        'content-type': 'text/event-stream',
        'cache-control': 'no-cache',
        connection: 'keep-alive',
        ...headers,
      });
    }
    const finish = diff?.calledTools && result.finishReason === 'stop' ? 'tool_calls' : result.finishReason;
    write(chunk(chat ? {} : { content: '' }, finish));
    if (includeUsage)
      write({
        id,
        object: chat ? 'chat.completion.chunk' : 'text_completion',
        created,
        model,
        choices: [],
        usage,
      });
    res.end('data: [DONE]\n\n');
    return;
  }
  const reply = rendered ? await chatReply(result.text, rendered, result.finishReason) : undefined;
  const choice = chat
    ? {
        index: 0,
        message: reply?.message ?? { role: 'assistant', content: result.text },
        finish_reason: reply?.finishReason ?? result.finishReason,
        logprobs: null,
      }
    : {
        index: 0,
        text: result.text,
        finish_reason: result.finishReason,
        logprobs: null,
        // llama.cpp server's `return_tokens`: the ids to continue a cached slot with.
        ...(body.return_tokens === true ? { tokens: result.tokens } : {}),
      };
  sendJson(
    res,
    200,
    { id, object: chat ? 'chat.completion' : 'text_completion', created, model, choices: [choice], usage },
    headers,
  );
}

const PATHS = new Set([
  '/v1/chat/completions',
  '/chat/completions',
  '/v1/completions',
  '/completions',
  '/completion',
]);

export const completionRoutes: RouteModule = (ctx) => async (req, res, _url, path) => {
  if (!PATHS.has(path)) return false;
  if (req.method !== 'POST') {
    ctx.methodNotAllowed(req, res);
    return true;
  }
  const data = await ctx.readBody(req).catch((err) => {
    sendError(res, err, { connection: 'close' });
    return undefined;
  });
  if (data === undefined) return true;
  const chat = path.endsWith('/chat/completions');
  const prepared = await ctx.bodies.parse(data, chat, ctx.messageLimit(), chat && ctx.opts.jinja !== false);
  // llama-server: /completion and /completions answer in its own shape, /v1/completions in OpenAI's.
  await complete(ctx, req, res, prepared, chat, path === '/completion' || path === '/completions');
  return true;
};
