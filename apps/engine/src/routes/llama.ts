// llama-server's own routes, in its shapes (tools/server/README.md of the pinned tree): /tokenize,
// /detokenize, /apply-template, /props, /slots and /slots/{id}?action=..., and the pieces of its
// native /completion answer.
import { mkdir, open, readFile, rename, rm } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { join } from 'node:path';
import type { BodyParser } from '../body.js';
import { renderJinjaChat } from '../chat.js';
import type { Engine, GenerationParams, GenerationResult } from '../engine.js';
import { HydraError } from '../errors.js';
import { REFUSED_FIELDS } from '../request-params.js';
import type { RouteModule } from './plumbing.js';
import { decodeSlotFile, encodeSlotFile, type ModelFingerprint, validSlotFilename } from './slot-file.js';

export interface LlamaRouteOptions {
  engine: Engine;
  bodies: BodyParser;
  /** The model name answers use (`--alias`, else the file name). */
  modelId: () => string;
  /** `--slot-save-path`: where slot files go; absent, slot actions answer 501 as llama-server does. */
  slotSavePath?: string;
  /** `--no-slots` turns `GET /slots` off (501). */
  slotsEndpoint: boolean;
  /** `--props` turns `POST /props` on (else 501, as llama-server). */
  propsEndpoint?: boolean;
  readBody: (req: IncomingMessage) => Promise<Buffer>;
  promptByteLimit: () => number;
  messageLimit: () => number;
  build: string;
  /** `--chat-template(-file)`: rendered instead of the model's template. */
  chatTemplate?: string;
  /** `--jinja` (default true), `--reasoning-format`, `--chat-template-kwargs` (see HttpOptions). */
  jinja?: boolean;
  reasoningFormat?: string;
  chatTemplateKwargs?: Record<string, unknown>;
}

type Send = (status: number, body: unknown) => void;

function bad(message: string, key: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_REQUEST', message, { keys: [key] });
}

function flag(body: Record<string, unknown>, key: string, dflt: boolean): boolean {
  const v = body[key];
  if (v === undefined || v === null) return dflt;
  if (typeof v !== 'boolean') throw bad(`${key} must be a boolean`, key);
  return v;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** A token's piece as llama-server's /tokenize gives it: the text, or its bytes when not UTF-8. */
function piece(bytes: Uint8Array): string | number[] {
  try {
    return utf8.decode(bytes);
  } catch {
    return [...bytes];
  }
}

/**
 * One native call per token (a piece each): a 1 MB text is 160k of them, so the loop yields to
 * the event loop between slices and `/health` keeps answering.
 */
async function inSlices(ids: Int32Array, each: (id: number) => void): Promise<void> {
  const SLICE = 2048;
  for (let at = 0; at < ids.length; at += SLICE) {
    if (at > 0) await new Promise((r) => setImmediate(r));
    for (const id of ids.subarray(at, at + SLICE)) each(id);
  }
}

function fingerprint(engine: Engine): ModelFingerprint {
  const m = engine.model!.info;
  return {
    arch: m.arch,
    nVocab: m.nVocab,
    nLayer: m.nLayer,
    nEmbd: m.nEmbd,
    nParams: m.nParams,
    size: m.size,
  };
}

/**
 * llama-server's `generation_settings` / slot `params` from a configuration (the one in force, or
 * a request's settings merged over it: request-params.ts `requestSettings().effective`).
 */
export function generationSettings(
  cfg: Record<string, unknown>,
  request?: { stop: string[]; stream: boolean },
): Record<string, unknown> {
  const s = (k: string) => cfg[`sampling.${k}`];
  const nPredict = cfg.n_predict as number;
  return {
    seed: cfg.seed,
    temperature: s('temp'),
    dynatemp_range: s('dynatemp_range'),
    dynatemp_exponent: s('dynatemp_exponent'),
    top_k: s('top_k'),
    top_p: s('top_p'),
    min_p: s('min_p'),
    top_n_sigma: s('top_n_sigma'),
    xtc_probability: s('xtc_probability'),
    xtc_threshold: s('xtc_threshold'),
    typical_p: s('typ_p'),
    repeat_last_n: s('penalty_last_n'),
    repeat_penalty: s('penalty_repeat'),
    presence_penalty: s('penalty_present'),
    frequency_penalty: s('penalty_freq'),
    dry_multiplier: s('dry_multiplier'),
    dry_base: s('dry_base'),
    dry_allowed_length: s('dry_allowed_length'),
    dry_penalty_last_n: s('dry_penalty_last_n'),
    dry_sequence_breakers: s('dry_sequence_breakers'),
    mirostat: s('mirostat'),
    mirostat_tau: s('mirostat_tau'),
    mirostat_eta: s('mirostat_eta'),
    adaptive_target: s('adaptive_target'),
    adaptive_decay: s('adaptive_decay'),
    stop: request?.stop ?? [],
    max_tokens: nPredict,
    n_predict: nPredict,
    n_keep: 0,
    n_discard: 0,
    ignore_eos: s('ignore_eos'),
    stream: request?.stream ?? true,
    // llama-server's shape: [{bias, token}], bias null for "never" (its -INFINITY).
    logit_bias: Object.entries((s('logit_bias') as Record<string, number> | undefined) ?? {}).map(
      ([token, bias]) => ({ bias: bias <= -1e9 ? null : bias, token: Number(token) }),
    ),
    n_probs: s('n_probs') ?? 0,
    min_keep: s('min_keep'),
    grammar: s('grammar') ?? '',
    samplers: s('samplers'),
  };
}

/**
 * The chat-template fields of a chat body (llama-server's oaicompat_chat_params_parse):
 * `add_generation_prompt` is honoured; those only Jinja templates give meaning to are refused by
 * name (HYDRA_ERR_UNSUPPORTED_FIELD) rather than rendered as if absent.
 */
export function chatTemplateOptions(body: Record<string, unknown>): { addAssistant: boolean } {
  const refused: string[] = [];
  const kwargs = body.chat_template_kwargs;
  if (
    kwargs !== undefined &&
    kwargs !== null &&
    !(typeof kwargs === 'object' && Object.keys(kwargs).length === 0)
  )
    refused.push('chat_template_kwargs');
  if (
    body.reasoning_format !== undefined &&
    body.reasoning_format !== null &&
    body.reasoning_format !== 'none'
  )
    refused.push('reasoning_format');
  if (body.continue_final_message === true) refused.push('continue_final_message');
  for (const f of ['tools', 'tool_choice', 'functions', 'function_call']) {
    const v = body[f];
    if (v !== undefined && v !== null && !REFUSED_FIELDS[f]!.neutral(v)) refused.push(f);
  }
  if (refused.length > 0)
    throw new HydraError(
      'HYDRA_ERR_UNSUPPORTED_FIELD',
      `unsupported chat fields: ${refused.join(', ')} (they need Jinja chat templates, not implemented yet)`,
      { keys: refused },
    );
  return { addAssistant: flag(body, 'add_generation_prompt', true) };
}

/** How a native `/completion` ended, as llama-server's `stop_type` and `stopping_word` say it. */
export function stopType(
  result: GenerationResult,
  params: GenerationParams,
  fullText: string,
): { stop_type: 'eos' | 'word' | 'limit' | 'none'; stopping_word: string } {
  if (result.finishReason === 'length') return { stop_type: 'limit', stopping_word: '' };
  if (result.finishReason !== 'stop') return { stop_type: 'none', stopping_word: '' };
  // The text ends where a stop string began; the generated bytes say which one.
  const rest = fullText.slice(result.text.length);
  const word = params.stop.find((s) => rest.startsWith(s));
  return word !== undefined
    ? { stop_type: 'word', stopping_word: word }
    : { stop_type: 'eos', stopping_word: '' };
}

/** The handlers of llama-server's own routes; {@link handle} answers false for other paths. */
export class LlamaRoutes {
  readonly #o: LlamaRouteOptions;

  constructor(options: LlamaRouteOptions) {
    this.#o = options;
  }

  async #json(req: IncomingMessage, chat = false) {
    const data = await this.#o.readBody(req);
    return this.#o.bodies.parse(
      data.length === 0 ? Buffer.from('{}') : data,
      chat,
      this.#o.messageLimit(),
      chat && this.#o.jinja !== false,
    );
  }

  /**
   * Answers `path` when it is one of these routes (true), else false. `methodNotAllowed` is called
   * for a known path with another method.
   */
  async handle(
    req: IncomingMessage,
    url: URL,
    path: string,
    send: Send,
    methodNotAllowed: () => void,
  ): Promise<boolean> {
    const post = (answer: () => Promise<unknown>) => this.#only(req, 'POST', answer, send, methodNotAllowed);
    switch (path) {
      case '/tokenize':
        return post(() => this.#tokenize(req));
      case '/detokenize':
        return post(() => this.#detokenize(req));
      case '/apply-template':
        return post(() => this.#applyTemplate(req));
      case '/props':
        if (req.method === 'POST') {
          if (!this.#o.propsEndpoint) {
            req.resume();
            throw new HydraError(
              'HYDRA_ERR_NOT_SUPPORTED',
              'This server does not support changing global properties. Start it with `--props`',
            );
          }
          return post(() => this.#postProps(req));
        }
        return this.#only(req, 'GET', async () => this.props(), send, methodNotAllowed);
      case '/slots':
        return this.#only(req, 'GET', async () => this.#slots(url), send, methodNotAllowed);
    }
    const m = /^\/slots\/([^/]+)$/.exec(path);
    if (!m) return false;
    return post(() => this.#slotAction(req, m[1]!, url.searchParams.get('action')));
  }

  async #only(
    req: IncomingMessage,
    method: string,
    answer: () => Promise<unknown>,
    send: Send,
    methodNotAllowed: () => void,
  ): Promise<true> {
    if (req.method !== method) methodNotAllowed();
    else send(200, await answer());
    return true;
  }

  // llama-server's POST /props changes no property ("update any props here") and answers success
  // to any body: here a body that names a property is refused by name rather than ignored.
  async #postProps(req: IncomingMessage): Promise<unknown> {
    const { body } = await this.#json(req);
    const keys = Object.keys(body);
    if (keys.length > 0)
      throw new HydraError(
        'HYDRA_ERR_UNSUPPORTED_FIELD',
        `no global property can be changed through POST /props: ${keys.join(', ')}`,
        { keys },
      );
    return { success: true };
  }

  async #tokenize(req: IncomingMessage): Promise<unknown> {
    const { engine } = this.#o;
    const { body } = await this.#json(req);
    const content = body.content;
    if (content === undefined) return { tokens: [] };
    if (typeof content !== 'string') throw bad('content must be a string', 'content');
    const addSpecial = flag(body, 'add_special', false);
    const parseSpecial = flag(body, 'parse_special', true);
    const withPieces = flag(body, 'with_pieces', false);
    if (Buffer.byteLength(content) > this.#o.promptByteLimit())
      throw new HydraError(
        'HYDRA_ERR_PROMPT_TOO_LARGE',
        `content exceeds ${this.#o.promptByteLimit()} bytes`,
        {
          keys: ['content'],
        },
      );
    engine.assertReady();
    const model = engine.model!;
    const ids = await model.tokenizeAsync(content, { addSpecial, parseSpecial });
    if (!withPieces) return { tokens: [...ids] };
    const out: { id: number; piece: string | number[] }[] = [];
    await inSlices(ids, (id) => {
      out.push({ id, piece: piece(model.tokenBytes(id, true)) });
    });
    return { tokens: out };
  }

  async #detokenize(req: IncomingMessage): Promise<unknown> {
    const { engine } = this.#o;
    const prepared = await this.#json(req);
    let ids: Int32Array | undefined;
    const tokens = prepared.body.tokens;
    if (tokens !== undefined) {
      if (!Array.isArray(tokens) || !tokens.every((t) => Number.isSafeInteger(t)))
        throw bad('tokens must be an array of token ids', 'tokens');
      ids = Int32Array.from(tokens as number[]);
    }
    engine.assertReady();
    const model = engine.model!;
    if (!ids || ids.length === 0) return { content: '' };
    const nVocab = model.info.nVocab;
    for (const t of ids)
      if (t < 0 || t >= nVocab) throw bad(`token ids must be in 0..${nVocab - 1}, got ${t}`, 'tokens');
    // llama-server concatenates each token's piece, specials rendered.
    const parts: Buffer[] = [];
    await inSlices(ids, (t) => {
      parts.push(model.tokenBytes(t, true));
    });
    return { content: Buffer.concat(parts).toString('utf8') };
  }

  async #applyTemplate(req: IncomingMessage): Promise<unknown> {
    const { engine } = this.#o;
    const prepared = await this.#json(req, true);
    if (prepared.chat!.bytes > this.#o.promptByteLimit())
      throw new HydraError(
        'HYDRA_ERR_PROMPT_TOO_LARGE',
        `messages exceed ${this.#o.promptByteLimit()} bytes`,
        {
          keys: ['messages'],
        },
      );
    if (prepared.chat?.messagesJson) {
      engine.assertReady();
      const o = this.#o;
      const rendered = await renderJinjaChat(engine.model!, prepared.body, prepared.chat.messagesJson, {
        ...(o.chatTemplate !== undefined ? { template: o.chatTemplate } : {}),
        ...(o.reasoningFormat !== undefined ? { reasoningFormat: o.reasoningFormat } : {}),
        ...(o.chatTemplateKwargs !== undefined ? { chatTemplateKwargs: o.chatTemplateKwargs } : {}),
      });
      return { prompt: rendered.prompt };
    }
    const { addAssistant } = chatTemplateOptions(prepared.body);
    engine.assertReady();
    const template = this.#o.chatTemplate;
    const packed = prepared.chat!.packed;
    return {
      prompt: await (template === undefined && addAssistant
        ? engine.chatPromptAsync(packed)
        : engine.model!.applyChatTemplateAsync(packed, {
            addAssistant,
            ...(template !== undefined ? { template } : {}),
          })),
    };
  }

  /** `GET /props`: llama-server's global properties. */
  props(): Record<string, unknown> {
    const { engine } = this.#o;
    const cfg = engine.layers.effective() as Record<string, unknown>;
    const model = engine.model;
    return {
      default_generation_settings: this.#slotJson(0, false, cfg),
      total_slots: engine.slots.total || (cfg.n_parallel as number),
      model_alias: this.#o.modelId(),
      model_path: engine.modelPath ?? '',
      chat_template: model?.info.chatTemplate ?? '',
      chat_template_caps: {},
      modalities: { vision: false, audio: false },
      endpoint_slots: this.#o.slotsEndpoint,
      endpoint_props: this.#o.propsEndpoint ?? false,
      endpoint_metrics: true,
      build_info: this.#o.build,
      is_sleeping: false,
    };
  }

  #slotJson(id: number, busy: boolean, cfg: Record<string, unknown>): Record<string, unknown> {
    return {
      id,
      id_task: -1,
      n_ctx: this.#o.engine.slots.nCtxSeq,
      speculative: false,
      is_processing: busy,
      params: generationSettings(cfg),
      prompt: '',
      next_token: {
        has_next_token: busy,
        has_new_line: false,
        n_remain: -1,
        n_decoded: 0,
        stopping_word: '',
      },
    };
  }

  #slots(url: URL): unknown {
    const { engine } = this.#o;
    if (!this.#o.slotsEndpoint)
      throw new HydraError(
        'HYDRA_ERR_NOT_SUPPORTED',
        'This server does not support slots endpoint (started with --no-slots)',
      );
    engine.assertReady();
    const info = engine.slotInfo();
    if (url.searchParams.get('fail_on_no_slot') && info.every((s) => s.busy))
      throw new HydraError('HYDRA_ERR_NO_SLOT', 'no slot available');
    const cfg = engine.layers.effective() as Record<string, unknown>;
    return info.map((s, i) => ({
      ...this.#slotJson(i, s.busy, cfg),
      speculative: s.speculative,
      // Hydra's: which speculative.types the running request drafts with (absent when none).
      ...(s.speculativeType ? { speculative_type: s.speculativeType } : {}),
      n_cached: s.cachedTokens,
      // llama-server's timings names: guessed tokens and those confirmed, of the slot's last request.
      draft_n: s.draftN,
      draft_n_accepted: s.draftAccepted,
      // Hydra's: the slot's prompt checkpoints (recurrent or hybrid memory) and their bytes.
      n_ctx_checkpoints: s.checkpoints,
      checkpoints_bytes: s.checkpointBytes,
    }));
  }

  async #slotAction(req: IncomingMessage, idText: string, action: string | null) {
    const { engine } = this.#o;
    const dir = this.#o.slotSavePath;
    if (dir === undefined) {
      req.resume();
      throw new HydraError(
        'HYDRA_ERR_NOT_SUPPORTED',
        'This server does not support slots action. Start it with `--slot-save-path`',
      );
    }
    if (!/^\d+$/.test(idText)) {
      req.resume();
      throw bad('Invalid slot ID', 'id_slot');
    }
    const id = Number(idText);
    if (action !== 'save' && action !== 'restore' && action !== 'erase') {
      req.resume();
      throw bad('Invalid action: must be save, restore or erase', 'action');
    }
    const { body } = await this.#json(req);
    engine.assertReady();
    if (id >= engine.slots.total)
      throw bad(`slot ${id} does not exist (0..${engine.slots.total - 1})`, 'id_slot');
    if (action === 'erase') {
      return { id_slot: id, n_erased: await engine.eraseSlot(id) };
    }
    const filename = body.filename;
    if (!validSlotFilename(filename)) throw bad('Invalid filename', 'filename');
    const file = join(dir, filename);
    const t0 = performance.now();
    if (action === 'save') {
      const state = await engine.getSlotState(id);
      const data = encodeSlotFile(state, fingerprint(engine));
      await mkdir(dir, { recursive: true });
      // Written beside and renamed: a crash mid-write never leaves a truncated file under the name.
      const tmp = `${file}.${process.pid}.tmp`;
      try {
        const fh = await open(tmp, 'w', 0o600);
        try {
          await fh.writeFile(data);
          await fh.sync();
        } finally {
          await fh.close();
        }
        await rename(tmp, file);
      } catch (err) {
        await rm(tmp, { force: true });
        throw new HydraError(
          'HYDRA_ERR_STATE_FAILED',
          `cannot write ${filename}: ${(err as Error).message}`,
          {
            cause: err,
          },
        );
      }
      return {
        id_slot: id,
        filename,
        n_saved: state.readUInt32LE(8),
        n_written: data.length,
        timings: { save_ms: performance.now() - t0 },
      };
    }
    let data: Buffer;
    try {
      data = await readFile(file);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      throw new HydraError(
        code === 'ENOENT' ? 'HYDRA_ERR_NOT_FOUND' : 'HYDRA_ERR_STATE_FAILED',
        `cannot read ${filename}: ${(err as Error).message}`,
        { keys: ['filename'], cause: err },
      );
    }
    const state = decodeSlotFile(data, fingerprint(engine));
    await engine.setSlotState(id, state);
    return {
      id_slot: id,
      filename,
      n_restored: state.readUInt32LE(8),
      n_read: data.length,
      timings: { restore_ms: performance.now() - t0 },
    };
  }
}

export const llamaRoutes: RouteModule = (ctx) => {
  const o = ctx.opts;
  const routes = new LlamaRoutes({
    engine: ctx.engine,
    bodies: ctx.bodies,
    modelId: () => ctx.modelName(),
    ...(o.slotSavePath !== undefined ? { slotSavePath: o.slotSavePath } : {}),
    slotsEndpoint: o.slotsEndpoint ?? true,
    propsEndpoint: o.propsEndpoint ?? false,
    readBody: (req) => ctx.readBody(req),
    promptByteLimit: () => ctx.promptByteLimit(),
    messageLimit: () => ctx.messageLimit(),
    build: o.build ?? 'hydra-engine',
    ...(o.chatTemplate !== undefined ? { chatTemplate: o.chatTemplate } : {}),
    jinja: o.jinja ?? true,
    ...(o.reasoningFormat !== undefined ? { reasoningFormat: o.reasoningFormat } : {}),
    ...(o.chatTemplateKwargs !== undefined ? { chatTemplateKwargs: o.chatTemplateKwargs } : {}),
  });
  return (req, res, url, path) =>
    routes.handle(
      req,
      url,
      path,
      (status, body) => ctx.send(res, status, body),
      () => ctx.methodNotAllowed(req, res),
    );
};
