// The OpenAI-compatible completions and chat (`/v1/completions`, `/v1/chat/completions`, also
// without `/v1`) and llama-server's native `/completion` (`/completions`): a body in, one
// generation through the engine, the answer streamed or whole in the route's shape.
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { type ChatCommonParams, jsonSchemaToGrammar, type Model } from '@hydra-engine/native-ggml';
import type { PreparedBody } from '../body.js';
import {
  ChatStreamDiff,
  chatReply,
  chatSampler,
  type JinjaChatOptions,
  renderJinjaChat,
  withoutChatFields,
} from '../chat.js';
import type { TokenProb } from '../core/output.js';
import type { Engine, GenerationParams, GenerationResult } from '../engine.js';
import { HydraError } from '../errors.js';
import { CodePointOffsets, chatLogprobs, completionLogprobs, probsJson } from '../logprobs.js';
import { checkSampler, requestSettings } from '../request-params.js';
import { chatTemplateOptions, generationSettings, stopType } from './llama.js';
import { badRequest, type RouteContext, type RouteModule, sendError, sendJson } from './plumbing.js';
import { ResponsesStream, responseObject, responseOutput } from './responses.js';

/** common_reasoning_format_name of each --reasoning-format (auto resolves to deepseek upstream). */
const REASONING_NAMES: Record<string, string> = {
  none: 'none',
  auto: 'deepseek',
  deepseek: 'deepseek',
  'deepseek-legacy': 'deepseek-legacy',
};

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
export function generationParams(
  engine: Engine,
  body: Record<string, unknown>,
  logprobs: 'chat' | 'count' = 'count',
): GenerationParams {
  const settings = requestSettings(body, engine.layers.effective(), { jsonSchemaToGrammar, logprobs });
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
    ...(settings.probs ? { probs: settings.probs } : {}),
    ...(settings.nKeep !== undefined ? { nKeep: settings.nKeep } : {}),
  };
}

// llama-server's native /completion answer (server_task_result_cmpl_final::to_json_non_oaicompat).
function nativeFinal(
  ctx: RouteContext,
  body: Record<string, unknown>,
  params: GenerationParams,
  prompt: { ids: Int32Array; text: string },
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
      // The rest of llama-server's params.to_json, as a native completion has them: no chat
      // parsing, an eager grammar, host sampling, no adapters.
      chat_format: 'Content-only',
      reasoning_format: REASONING_NAMES[ctx.opts.reasoningFormat ?? 'auto'] ?? ctx.opts.reasoningFormat,
      reasoning_in_content: false,
      generation_prompt: '',
      grammar_lazy: false,
      grammar_triggers: [],
      preserved_tokens: [],
      'speculative.types': ((settings['speculative.types'] as string[] | undefined) ?? ['none']).join(','),
      timings_per_token: false,
      post_sampling_probs: body.post_sampling_probs === true,
      backend_sampling: false,
      lora: [],
    },
    prompt: prompt.text,
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

/** One prompt of a request, tokenized, with the text `echo` and the native `prompt` field give back. */
interface PromptInput {
  ids: Int32Array;
  text: string;
}

/** A prompt piece as llama-server's tokenize_mixed reads it: a text or one token id. */
type PromptPart = string | number;

const isTokenId = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/**
 * The prompts of a completion body as llama-server's tokenize_input_prompts splits them: a string,
 * token ids or a mix of both is one prompt; an array of those (without bare numbers) is one each.
 */
function promptParts(prompt: unknown): PromptPart[][] {
  const one = (p: unknown, at: string): PromptPart[] => {
    if (typeof p === 'string') return [p];
    if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === 'string' || isTokenId(x)))
      return p as PromptPart[];
    if (typeof p === 'object' && p !== null && !Array.isArray(p) && 'prompt_string' in p) {
      if ('multimodal_data' in p)
        throw new HydraError(
          'HYDRA_ERR_UNSUPPORTED_FIELD',
          `${at}.multimodal_data: multimodal input is not implemented`,
          {
            keys: ['prompt'],
          },
        );
      return one((p as Record<string, unknown>).prompt_string, `${at}.prompt_string`);
    }
    throw badRequest(
      `${at} must be a string, a list of token ids, a list of strings and token ids, or an object with prompt_string`,
      'prompt',
    );
  };
  if (Array.isArray(prompt) && !prompt.some((p) => typeof p === 'number')) {
    if (prompt.length === 0) throw badRequest('prompt must not be empty', 'prompt');
    return prompt.map((p, i) => one(p, `prompt[${i}]`));
  }
  return [one(prompt, 'prompt')];
}

/** `n` (llama-server's `n_cmpl`): choices per prompt, at most one per slot as llama-server allows. */
function choicesPerPrompt(body: Record<string, unknown>, engine: Engine): number {
  const given = [body.n, body.n_cmpl].filter((v) => v !== undefined && v !== null);
  if (given.length === 2 && given[0] !== given[1]) throw badValue('n conflicts with n_cmpl', 'n');
  const n = given[0] ?? 1;
  if (!Number.isSafeInteger(n) || (n as number) < 1) throw badValue('n must be a positive integer', 'n');
  if (n === 1) return 1;
  // The slot count is the loaded context's.
  engine.assertReady();
  const nSlots = engine.slots.total;
  if ((n as number) > nSlots)
    throw badValue(`n must be at most ${nSlots} (one choice per slot: -np ${nSlots})`, 'n');
  return n as number;
}

function unsupportedField(key: string, why: string): HydraError {
  return new HydraError('HYDRA_ERR_UNSUPPORTED_FIELD', `${key}: ${why}`, { keys: [key] });
}

function badValue(message: string, key: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_VALUE', message, { keys: [key] });
}

const DEFAULT_SEED = 0xffff_ffff;

function offsetsOf(text: string): CodePointOffsets {
  const o = new CodePointOffsets();
  o.feed(text);
  return o;
}

/** One generation of a request: a choice of one of its prompts. */
interface Choice {
  index: number;
  prompt: PromptInput;
  /** The first choice of its prompt (the one that prefills; its usage counts the prompt). */
  first: boolean;
  group: object;
  params: GenerationParams;
  diff?: ChatStreamDiff;
  /** The Responses events of a streamed `responses` answer. */
  events?: ResponsesStream;
  /** Generated token ids since the last streamed text (llama-server's native chunks carry them). */
  pendingTokens: number[];
  predicted: number;
  firstToken?: number;
  result?: GenerationResult;
  /** Token probabilities final but not yet streamed (GenerationParams.probs). */
  probs: TokenProb[];
  /** Completions' text_offset of the streamed tokens. */
  offsets: CodePointOffsets;
}

function jinjaOptions(ctx: RouteContext): JinjaChatOptions {
  return {
    ...(ctx.opts.chatTemplate !== undefined ? { template: ctx.opts.chatTemplate } : {}),
    ...(ctx.opts.reasoningFormat !== undefined ? { reasoningFormat: ctx.opts.reasoningFormat } : {}),
    ...(ctx.opts.chatTemplateKwargs !== undefined ? { chatTemplateKwargs: ctx.opts.chatTemplateKwargs } : {}),
  };
}

/**
 * llama-server's `.../input_tokens` answer for a chat body: the tokens its rendered prompt has
 * (handle_count_tokens), rendered as a completion would be.
 */
export async function inputTokens(
  ctx: RouteContext,
  prepared: PreparedBody,
): Promise<Record<string, unknown>> {
  const { engine } = ctx;
  const chat = prepared.chat!;
  checkPromptBytes(ctx, chat.bytes, 'messages');
  engine.assertReady();
  let ids: Int32Array;
  if (chat.messagesJson)
    ids = (await renderJinjaChat(engine.model!, prepared.body, chat.messagesJson, jinjaOptions(ctx), true))
      .tokens!;
  else {
    const { addAssistant } = chatTemplateOptions(prepared.body);
    ids = await (ctx.opts.chatTemplate === undefined && addAssistant
      ? engine.chatTokensAsync(chat.packed)
      : engine.model!.tokenizeChatAsync(chat.packed, {
          addAssistant,
          ...(ctx.opts.chatTemplate !== undefined ? { template: ctx.opts.chatTemplate } : {}),
        }));
  }
  return { input_tokens: ids.length, object: 'response.input_tokens' };
}

/**
 * The answer's shape: OpenAI chat or completions, llama-server's native one (`infill`: its
 * /infill, a FIM prompt in the native shape), OpenAI Responses.
 */
export type CompletionKind = 'chat' | 'completions' | 'native' | 'infill' | 'responses';

/** Runs a completion body (chat bodies: `prepared.chat`) and answers it in `kind`'s shape. */
export async function complete(
  ctx: RouteContext,
  req: IncomingMessage,
  res: ServerResponse,
  prepared: PreparedBody,
  kind: CompletionKind,
): Promise<void> {
  const chat = kind === 'chat' || kind === 'responses';
  const native = kind === 'native' || kind === 'infill';
  const responses = kind === 'responses';
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
  if (body.echo !== undefined && body.echo !== null && body.echo !== false) {
    if (chat || native)
      throw new HydraError(
        'HYDRA_ERR_UNSUPPORTED_FIELD',
        'echo is for /v1/completions only (OpenAI has no echo for chat; llama-server none on /completion)',
        { keys: ['echo'] },
      );
    if (body.echo !== true) throw badRequest('echo must be a boolean', 'echo');
  }
  const echo = body.echo === true;
  const n = choicesPerPrompt(body, engine);
  if (responses && n !== 1) throw unsupportedField('n', 'a response has one output');
  let parts: PromptPart[][] | undefined;
  let infill: InfillInput | undefined;
  const suffix = body.suffix;
  if (suffix !== undefined && suffix !== null && kind !== 'completions')
    throw new HydraError(
      'HYDRA_ERR_UNSUPPORTED_FIELD',
      'suffix is for /v1/completions (llama-server: /infill)',
      {
        keys: ['suffix'],
      },
    );
  if (kind === 'infill') {
    if (prepared.tokens) throw badRequest('prompt must be a string', 'prompt');
    infill = infillFields(body);
  } else if (typeof suffix === 'string' && suffix !== '') {
    // OpenAI's suffix: the text after the completion, as /infill's input_suffix after the prompt.
    if (typeof body.prompt !== 'string')
      throw badRequest('prompt must be one string with suffix (llama-server: /infill)', 'prompt');
    infill = { prefix: [body.prompt], suffix: [suffix], extra: [], prompt: '' };
  } else if (suffix !== undefined && suffix !== null && suffix !== '')
    throw badRequest('suffix must be a string', 'suffix');
  if (infill) {
    let bytes = Buffer.byteLength(infill.prompt);
    for (const p of [...infill.prefix, ...infill.suffix, ...infill.extra.map((c) => c.text)])
      if (typeof p === 'string') bytes += Buffer.byteLength(p);
    checkPromptBytes(ctx, bytes, kind === 'infill' ? 'input_prefix' : 'prompt');
  } else if (prepared.chat) checkPromptBytes(ctx, prepared.chat.bytes, 'messages');
  else if (!prepared.tokens) {
    parts = promptParts(body.prompt);
    let bytes = 0;
    for (const p of parts) for (const x of p) if (typeof x === 'string') bytes += Buffer.byteLength(x);
    checkPromptBytes(ctx, bytes, 'prompt');
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
      jinjaOptions(ctx),
      true,
    );
  }
  const {
    n: _n,
    n_cmpl: _nc,
    echo: _e,
    suffix: _s,
    input_prefix: _ip,
    input_suffix: _is,
    input_extra: _ie,
    ...sampling
  } = body;
  let params = generationParams(
    engine,
    rendered ? withoutChatFields(sampling) : sampling,
    chat ? 'chat' : 'count',
  );
  // OpenAI's echo with logprobs gives the prompt tokens' too, which needs the prompt's logits.
  if (echo && params.probs)
    throw new HydraError(
      'HYDRA_ERR_UNSUPPORTED_FIELD',
      "logprobs with echo (the prompt tokens' log probabilities) is not implemented",
      {
        keys: ['logprobs'],
      },
    );
  if (responses && params.probs) {
    // Responses' output_text carries no log probabilities here: an explicit ask is refused, and the
    // configured default (sampling.n_probs) is not computed for nothing.
    const asked = ['logprobs', 'top_logprobs', 'n_probs'].find(
      (k) => body[k] !== undefined && body[k] !== null,
    );
    if (asked) throw unsupportedField(asked, 'a Responses answer carries no log probabilities');
    const { probs: _probs, ...rest } = params;
    params = rest;
  }
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
  let prompts: PromptInput[];
  if (prepared.tokens) {
    const nVocab = engine.model?.info.nVocab ?? 0;
    if (prepared.tokens.max >= nVocab) throw badRequest(`prompt token ids must be below ${nVocab}`, 'prompt');
    engine.assertReady();
    const ids = prepared.tokens.ids;
    prompts = [{ ids, text: engine.model!.detokenize(ids, { removeSpecial: true }) }];
  } else {
    // Rendering and tokenizing run off the JS thread: a big input must not stall /health. A model
    // swapped meanwhile has another vocabulary: the tokens are made again for the new one.
    let made: PromptInput[] | undefined;
    for (let attempt = 0; attempt < 2 && made === undefined; attempt++) {
      engine.assertReady();
      const model = engine.model!;
      let t: PromptInput[];
      if (infill) {
        checkFim(model);
        const cfg = engine.layers.effective();
        t = [
          await formatInfill(model, infill, {
            nBatch: cfg.n_batch as number,
            nPredict: cfg.n_predict as number,
            nCtx: engine.slots.nCtxSeq,
          }),
        ];
        if (kind === 'completions') t[0]!.text = body.prompt as string;
      } else if (parts) t = await Promise.all(parts.map((p) => tokenizeMixed(model, p)));
      else {
        // The chat layer tokenized a rendered prompt in its own job, with the model it rendered for.
        const ids = rendered
          ? rendered.tokens!
          : await (ctx.opts.chatTemplate === undefined && chatOptions!.addAssistant
              ? engine.chatTokensAsync(prepared.chat!.packed)
              : model.tokenizeChatAsync(prepared.chat!.packed, {
                  addAssistant: chatOptions!.addAssistant,
                  ...(ctx.opts.chatTemplate !== undefined ? { template: ctx.opts.chatTemplate } : {}),
                }));
        t = [{ ids, text: '' }];
      }
      if (engine.model === model) made = t;
    }
    if (made === undefined)
      throw new HydraError('HYDRA_ERR_LOADING', 'the model changed while the prompt was tokenized');
    prompts = made;
    if (req.socket.destroyed) return;
  }
  const seed = params.sampler.seed ?? DEFAULT_SEED;
  const choices: Choice[] = [];
  for (const prompt of prompts) {
    const group = {};
    for (let j = 0; j < n; j++) {
      // llama-server's child tasks: a set seed gets +1 per child, so seeded choices differ.
      const p =
        j > 0 && seed !== DEFAULT_SEED
          ? { ...params, sampler: { ...params.sampler, seed: (seed + j) >>> 0 } }
          : params;
      choices.push({
        index: choices.length,
        prompt,
        first: j === 0,
        group,
        params: p,
        pendingTokens: [],
        predicted: 0,
        probs: [],
        offsets: new CodePointOffsets(),
      });
    }
  }
  const id = responses ? '' : `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID()}`;
  const created = Math.floor(Date.now() / 1000);
  const model = ctx.modelName();
  const abort = new AbortController();
  const includeUsage = (body.stream_options as Record<string, unknown> | undefined)?.include_usage === true;
  const onClose = () => {
    if (!res.writableFinished) abort.abort();
  };
  res.on('close', onClose);
  const epochHeaders = ctx.epochHeader();
  const object = chat ? 'chat.completion.chunk' : 'text_completion';
  // A streamed choice's chunk carries the probabilities of the tokens that became final since the
  // last one (all of them on the first chunk sent after they did, as llama-server).
  const streamProbs = (c: Choice, text: string): { logprobs?: unknown } => {
    const req = c.params.probs;
    if (!req) return {};
    c.offsets.feed(text);
    const probs = c.probs.splice(0);
    if (probs.length === 0) return { logprobs: null };
    return { logprobs: chat ? chatLogprobs(probs, req) : completionLogprobs(probs, req, c.offsets) };
  };
  const chunk = (c: Choice, delta: Record<string, unknown>, finish: string | null) => ({
    id,
    object,
    created,
    model,
    choices: [
      chat
        ? { index: c.index, delta, ...streamProbs(c, ''), finish_reason: finish }
        : {
            index: c.index,
            text: delta.content ?? '',
            ...streamProbs(c, (delta.content as string | undefined) ?? ''),
            finish_reason: finish,
          },
    ],
  });
  const write = (obj: unknown) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
  const head = (headers: Record<string, string>) => {
    if (!res.headersSent)
      res.writeHead(200, {
        'content-type': 'text/event-stream',
        'cache-control': 'no-cache',
        connection: 'keep-alive',
        ...headers,
      });
  };
  const onTextFor = (c: Choice): ((t: string) => void) | undefined => {
    if (!stream) return undefined;
    if (native)
      return (text) => {
        head(epochHeaders);
        write({
          index: c.index,
          content: text,
          tokens: c.pendingTokens,
          stop: false,
          id_slot: -1,
          tokens_predicted: c.predicted,
          tokens_evaluated: c.prompt.ids.length,
          ...(c.params.probs && c.probs.length > 0
            ? { completion_probabilities: probsJson(c.probs.splice(0), c.params.probs) }
            : {}),
        });
        c.pendingTokens = [];
      };
    let first = true;
    const send = responses
      ? (delta: Record<string, unknown>) => c.events!.delta(delta)
      : (delta: Record<string, unknown>) => {
          head(epochHeaders);
          write(chunk(c, first && chat ? { role: 'assistant', ...delta } : delta, null));
          first = false;
        };
    if (responses)
      c.events = new ResponsesStream((event, data) => {
        head(epochHeaders);
        res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
      });
    // OpenAI's echo streams the prompt first.
    if (echo) send({ content: c.prompt.text });
    // Parsing the text so far after every piece (as llama-server) is only needed where it can
    // differ from the text: tool calls or reasoning to split out.
    if (rendered && (rendered.parseToolCalls || rendered.supportsThinking)) {
      const d = new ChatStreamDiff(rendered, send);
      c.diff = d;
      return (text) => d.push(text);
    }
    return (text) => send({ content: text });
  };
  const rec = ctx.record(res);
  // Absolute times until the record is closed (#track makes ttftMs relative to the request).
  let lastToken = 0;
  const onToken = (c: Choice) => (t: number) => {
    c.firstToken ??= performance.now();
    if (native && stream) {
      c.pendingTokens.push(t);
      c.predicted++;
    }
    if (rec) {
      lastToken = performance.now();
      rec.ttftMs ??= lastToken;
    }
  };
  // llama-server's timings, seen from here: the prompt from admission to the first token,
  // generation from there to the end.
  const submitted = performance.now();
  const cachePrompt = (body.cache_prompt ?? ctx.opts.cachePrompt ?? true) === true;
  // Admission errors throw here, before any byte of the response; choices already queued go.
  const pending: Promise<GenerationResult>[] = [];
  try {
    for (const c of choices) {
      const shown = onTextFor(c);
      const onText =
        shown && c.params.probs
          ? (text: string, probs?: TokenProb[]) => {
              if (probs) c.probs.push(...probs);
              shown(text);
            }
          : shown;
      pending.push(
        engine.submit(c.prompt.ids, c.params, {
          signal: abort.signal,
          ...(onText ? { onText } : {}),
          onToken: onToken(c),
          // llama-server: child tasks cannot pin a slot.
          ...(c.first && typeof slotField === 'number' && slotField >= 0 ? { slot: slotField } : {}),
          // On by default, as llama-server: a request that shares a slot's prefix skips its prefill.
          ...(cachePrompt ? { cachePrompt: true } : {}),
          ...(n > 1 ? { promptGroup: c.group } : {}),
        }),
      );
    }
  } catch (err) {
    abort.abort();
    res.off('close', onClose);
    await Promise.allSettled(pending);
    throw err;
  }
  const ends: Promise<void>[] = choices.map((c, i) =>
    pending[i]!.then(async (r) => {
      c.result = r;
      // Each choice's end goes out as it ends (OpenAI streams finish_reason per choice).
      if (stream && !native && r.finishReason !== 'cancelled') {
        if (c.diff) await c.diff.end();
        if (responses) return;
        head({ 'x-hydra-config-epoch': String(r.epoch) });
        const finish = c.diff?.calledTools && r.finishReason === 'stop' ? 'tool_calls' : r.finishReason;
        write(chunk(c, chat ? {} : { content: '' }, finish));
      }
    }),
  );
  try {
    await Promise.all(ends);
  } catch (err) {
    abort.abort();
    await Promise.allSettled(ends);
    if (rec) rec.code = (err as HydraError).code ?? 'HYDRA_ERR_INTERNAL';
    if (res.headersSent) {
      const e = err as HydraError;
      write({ error: { message: e.message, code: e.code ?? 'HYDRA_ERR_INTERNAL' } });
      // The terminator too: an OpenAI client waits for it to tell an ended stream from a cut one
      // (llama-server ends a Responses stream without one).
      res.end(responses ? undefined : 'data: [DONE]\n\n');
      return;
    }
    throw err;
  } finally {
    res.off('close', onClose);
  }
  const results = choices.map((c) => c.result!);
  let promptTokens = 0;
  let cachedTokens = 0;
  let completionTokens = 0;
  for (const c of choices) {
    // OpenAI's usage: each prompt once, every choice's completion.
    if (c.first) {
      promptTokens += c.result!.promptTokens;
      cachedTokens += c.result!.cachedTokens;
    }
    completionTokens += c.result!.completionTokens;
  }
  const r0 = results[0]!;
  if (rec) {
    rec.promptTokens = promptTokens;
    rec.completionTokens = completionTokens;
    rec.cachedTokens = cachedTokens;
    rec.finishReason = r0.finishReason;
    rec.epoch = r0.epoch;
    rec.slot = r0.slot;
    rec.queueMs = Math.max(...results.map((r) => r.queueMs));
    if (rec.ttftMs !== undefined) rec.decodeMs = lastToken - rec.ttftMs;
  }
  if (results.some((r) => r.finishReason === 'cancelled')) {
    res.destroy();
    return;
  }
  const usage = {
    prompt_tokens: promptTokens,
    completion_tokens: completionTokens,
    total_tokens: promptTokens + completionTokens,
    prompt_tokens_details: { cached_tokens: cachedTokens },
  };
  const headers = { 'x-hydra-config-epoch': String(r0.epoch) };
  if (native) {
    const ended = performance.now();
    const finals = choices.map((c) => {
      const r = c.result!;
      // The prompt's time from when the request got its slot (llama-server's timings start there).
      const timings = nativeTimings(
        r,
        Math.max(0, (c.firstToken ?? ended) - submitted - r.queueMs),
        ended - (c.firstToken ?? ended),
      );
      return pickFields(body.response_fields, {
        ...nativeFinal(ctx, body, c.params, c.prompt, r, model, stream),
        index: c.index,
        timings,
        // llama-server: streamed, the chunks carried them.
        ...(!stream && c.params.probs && r.probs && r.probs.length > 0
          ? { completion_probabilities: probsJson(r.probs, c.params.probs) }
          : {}),
      });
    });
    if (stream) {
      if (!res.headersSent)
        res.writeHead(200, {
          'content-type': 'text/event-stream',
          'cache-control': 'no-cache',
          ...headers,
        });
      // llama-server ends a native stream with the final object (stop: true), no [DONE].
      for (let i = 0; i < finals.length; i++)
        write({ ...finals[i], content: '', tokens: choices[i]!.pendingTokens });
      res.end();
      return;
    }
    // llama-server: one result is an object, several (prompts x n) an array.
    ctx.send(res, 200, finals.length === 1 ? finals[0] : finals);
    return;
  }
  if (responses) {
    const counts = {
      prompt_tokens: promptTokens,
      completion_tokens: completionTokens,
      cached_tokens: cachedTokens,
    };
    const c = choices[0]!;
    if (stream) {
      c.events!.end(model, counts);
      res.end();
      return;
    }
    const r = c.result!;
    const reply = rendered
      ? await chatReply(r.text, rendered, r.finishReason)
      : { message: { role: 'assistant', content: r.text } };
    const ids = { message: `msg_${randomUUID()}`, reasoning: `rs_${randomUUID()}` };
    sendJson(
      res,
      200,
      responseObject(`resp_${randomUUID()}`, model, responseOutput(reply.message, ids), counts),
      headers,
    );
    return;
  }
  if (stream) {
    head(headers);
    if (includeUsage) write({ id, object, created, model, choices: [], usage });
    res.end('data: [DONE]\n\n');
    return;
  }
  const out = await Promise.all(
    choices.map(async (c) => {
      const r = c.result!;
      if (chat) {
        const reply = rendered ? await chatReply(r.text, rendered, r.finishReason) : undefined;
        return {
          index: c.index,
          message: reply?.message ?? { role: 'assistant', content: r.text },
          finish_reason: reply?.finishReason ?? r.finishReason,
          logprobs: c.params.probs && r.probs ? chatLogprobs(r.probs, c.params.probs) : null,
        };
      }
      return {
        index: c.index,
        text: echo ? c.prompt.text + r.text : r.text,
        finish_reason: r.finishReason,
        logprobs:
          c.params.probs && r.probs ? completionLogprobs(r.probs, c.params.probs, offsetsOf(r.text)) : null,
        // llama.cpp server's `return_tokens`: the ids to continue a cached slot with.
        ...(body.return_tokens === true ? { tokens: r.tokens } : {}),
      };
    }),
  );
  // llama-server's extensions of OpenAI's answer: its build as the fingerprint and the first
  // choice's timings (scripts read tokens per second from them).
  const ended = performance.now();
  const c0 = choices[0]!;
  const timings = nativeTimings(
    r0,
    Math.max(0, (c0.firstToken ?? ended) - submitted - r0.queueMs),
    ended - (c0.firstToken ?? ended),
  );
  sendJson(
    res,
    200,
    {
      id,
      object: chat ? 'chat.completion' : 'text_completion',
      created,
      model,
      ...(ctx.opts.build !== undefined ? { system_fingerprint: ctx.opts.build } : {}),
      choices: out,
      usage,
      timings,
    },
    headers,
  );
}

/** The fill-in-the-middle fields of an `/infill` body, or of `/v1/completions` with `suffix`. */
interface InfillInput {
  prefix: PromptPart[];
  suffix: PromptPart[];
  extra: { text: string; filename: string }[];
  /** Text after the FIM prefix (llama-server's `prompt` of /infill). */
  prompt: string;
}

/** `/infill`'s fields as llama-server checks them (each a 400 naming it). */
function infillFields(body: Record<string, unknown>): InfillInput {
  const part = (key: string): PromptPart[] => {
    const v = body[key];
    if (v === undefined || v === null) throw badRequest(`"${key}" is required`, key);
    if (typeof v === 'string') return [v];
    if (Array.isArray(v) && v.every((x) => typeof x === 'string' || isTokenId(x))) return v as PromptPart[];
    throw badRequest(`${key} must be a string or a list of strings and token ids`, key);
  };
  const prefix = part('input_prefix');
  const suffix = part('input_suffix');
  const rawExtra = body.input_extra ?? [];
  if (!Array.isArray(rawExtra))
    throw badRequest('input_extra must be an array of {"filename": string, "text": string}', 'input_extra');
  const extra = rawExtra.map((c) => {
    const chunk = (typeof c === 'object' && c !== null ? c : {}) as Record<string, unknown>;
    if (typeof chunk.text !== 'string')
      throw badRequest('an input_extra chunk must have a "text" string', 'input_extra');
    if (chunk.filename !== undefined && typeof chunk.filename !== 'string')
      throw badRequest('an input_extra chunk\'s "filename" must be a string', 'input_extra');
    return { text: chunk.text, filename: (chunk.filename as string | undefined) ?? 'tmp' };
  });
  const prompt = body.prompt ?? '';
  if (typeof prompt !== 'string') throw badRequest('prompt must be a string', 'prompt');
  return { prefix, suffix, extra, prompt };
}

/** llama-server's refusal of a model without FIM tokens, naming what is missing. */
function checkFim(model: Model): void {
  const missing = [
    model.info.fimPre < 0 ? 'prefix' : '',
    model.info.fimSuf < 0 ? 'suffix' : '',
    model.info.fimMid < 0 ? 'middle' : '',
  ].filter((m) => m !== '');
  if (missing.length > 0)
    throw new HydraError(
      'HYDRA_ERR_NOT_SUPPORTED',
      `Infill is not supported by this model: ${missing.map((m) => `${m} token is missing.`).join(' ')}`,
    );
}

// llama-server's separator of extra chunks when the vocabulary has no FIM_SEP token.
const CHUNK_PREFIX = '\n\n--- snippet ---\n\n';

/**
 * The prompt of a fill-in-the-middle request as llama-server's format_prompt_infill builds it (the
 * repo-level FIM pattern): the extra chunks, [BOS], FIM_PRE prefix prompt, FIM_SUF suffix, FIM_MID,
 * with the prefix and suffix cut to fit a batch (3:1) and the extra chunks to the context.
 */
async function formatInfill(
  model: Model,
  input: InfillInput,
  sizes: { nBatch: number; nPredict: number; nCtx: number },
): Promise<PromptInput> {
  const plain = (text: string) => model.tokenizeAsync(text, { addSpecial: false, parseSpecial: false });
  const mixed = async (parts: PromptPart[]) => {
    const out: number[] = [];
    for (const p of parts) {
      if (typeof p === 'number') {
        if (p >= model.info.nVocab)
          throw badRequest(`token ids must be below ${model.info.nVocab}`, 'input_prefix');
        out.push(p);
      } else out.push(...(await plain(p)));
    }
    return out;
  };
  const { fimPre, fimSuf, fimMid, fimRep, fimSep } = model.info;
  const extra: number[] = [];
  if (fimRep >= 0) extra.push(fimRep, ...(await plain('myproject\n')));
  for (const chunk of input.extra) {
    if (fimSep >= 0) extra.push(fimSep, ...(await plain(`${chunk.filename}\n`)));
    else extra.push(...(await plain(CHUNK_PREFIX)));
    extra.push(...(await plain(chunk.text)));
  }
  if (fimSep >= 0) extra.push(fimSep, ...(await plain('filename\n')));
  let prefix = await mixed(input.prefix);
  let suffix = await mixed(input.suffix);
  const prompt = [...(await model.tokenizeAsync(input.prompt, { addSpecial: false, parseSpecial: true }))];
  const q = Math.floor(sizes.nBatch / 4);
  const nPrefix = Math.min(prefix.length, 3 * q);
  const nSuffix = Math.min(suffix.length, Math.max(0, q - (2 + prompt.length)));
  const nExtra = Math.min(Math.max(0, sizes.nCtx - sizes.nBatch - 2 * sizes.nPredict), extra.length);
  prefix = [fimPre, ...prefix.slice(prefix.length - nPrefix), ...prompt];
  suffix = [fimSuf, ...suffix.slice(0, nSuffix)];
  const ids = [
    ...extra.slice(extra.length - nExtra),
    ...(model.info.addBos ? [model.info.bos] : []),
    ...prefix,
    ...suffix,
    fimMid,
  ];
  return { ids: Int32Array.from(ids), text: input.prompt };
}

/** A prompt's pieces tokenized as llama-server's tokenize_mixed: special tokens with the first text only. */
async function tokenizeMixed(model: Model, parts: PromptPart[]): Promise<PromptInput> {
  if (parts.length === 1 && typeof parts[0] === 'string') {
    const text = parts[0];
    return { ids: await model.tokenizeAsync(text), text };
  }
  const nVocab = model.info.nVocab;
  const pieces: Int32Array[] = [];
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i]!;
    if (typeof p === 'number') {
      if (p >= nVocab) throw badRequest(`prompt token ids must be below ${nVocab}`, 'prompt');
      pieces.push(Int32Array.of(p));
    } else pieces.push(await model.tokenizeAsync(p, i === 0 ? {} : { addSpecial: false }));
  }
  const ids = new Int32Array(pieces.reduce((a, p) => a + p.length, 0));
  let at = 0;
  for (const p of pieces) {
    ids.set(p, at);
    at += p.length;
  }
  const text = parts.every((p) => typeof p === 'string')
    ? parts.join('')
    : model.detokenize(ids, { removeSpecial: true });
  return { ids, text };
}

const PATHS = new Set([
  '/infill',
  '/v1/chat/completions',
  '/chat/completions',
  '/v1/completions',
  '/completions',
  '/completion',
]);

export const completionRoutes: RouteModule = (ctx) => async (req, res, _url, path) => {
  const count = path === '/v1/chat/completions/input_tokens' || path === '/chat/completions/input_tokens';
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
  const chat = path.endsWith('/chat/completions') || count;
  const prepared = await ctx.bodies.parse(data, chat, ctx.messageLimit(), chat && ctx.opts.jinja !== false);
  if (count) {
    ctx.send(res, 200, await inputTokens(ctx, prepared));
    return true;
  }
  // llama-server: /completion and /completions answer in its own shape, /v1/completions in OpenAI's.
  const kind =
    path === '/infill'
      ? 'infill'
      : chat
        ? 'chat'
        : path === '/completion' || path === '/completions'
          ? 'native'
          : 'completions';
  await complete(ctx, req, res, prepared, kind);
  return true;
};
