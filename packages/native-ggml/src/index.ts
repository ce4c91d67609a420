import { connect } from 'node:net';
import { availableParallelism } from 'node:os';
import { HydraError, isHydraError } from '@hydra-engine/errors';
import {
  addonCandidates,
  type ContextHandle,
  type ContextMemoryRow,
  loadBinding,
  type ModelHandle,
  type NativeBinding,
  type NativeContextParams,
  type NativeDevice,
  type NativeEmbedInfo,
  type NativeLocalAccounting,
  type NativeModelInfo,
  type NativeModelParams,
  type NativeRpcAccounting,
  type NativeRpcPeerAccounting,
  type NativeRpcTcp,
  type NativeSamplerParams,
  type NativeServeSummary,
  type NativeWeightsIndexAdded,
  type NativeWeightsIndexInfo,
  type NgramDrafterParams,
  type NgramDrafterType,
  type NgramHandle,
  type PoolingType,
  type RpcCommandName,
  type SamplerHandle,
  type SamplerStage,
} from './binding.js';

export { ERROR_CODES, type ErrorCode } from './errors.js';
export { addonCandidates };
export { freeLoopbackPort } from './ports.js';
export type {
  ContextMemoryRow,
  NativeContextParams as ContextParams,
  NativeDevice as Device,
  NativeEmbedInfo as EmbedInfo,
  NativeModelInfo as ModelInfo,
  PoolingType,
  NativeSamplerParams as SamplerParams,
  SamplerStage,
  NativeServeSummary as ServeSummary,
  NativeWeightsIndexAdded as WeightsIndexAdded,
  NativeWeightsIndexInfo as WeightsIndexInfo,
};

/** The GGML log levels accepted by {@link initBackend}. */
export const LogLevel = { debug: 1, info: 2, warn: 3, error: 4 } as const;

let initialised: ReturnType<NativeBinding['backendInit']> | undefined;

function native(): NativeBinding {
  const { binding } = loadBinding();
  if (!initialised) initialised = binding.backendInit(LogLevel.error);
  return binding;
}

/** Converts an error thrown by the addon (an Error with a string `code`) into a HydraError. */
function rethrow(err: unknown): never {
  if (err instanceof HydraError) throw err;
  if (isHydraError(err)) throw new HydraError(err.code, err.message, { cause: err });
  throw new HydraError('HYDRA_ERR_INTERNAL', (err as Error)?.message ?? String(err), { cause: err });
}

function call<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    rethrow(err);
  }
}

async function callAsync<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    rethrow(err);
  }
}

/**
 * Loads the addon and initialises the llama.cpp backend once per thread.
 * @returns facts about the build (system info, GPU offload support, path of the addon).
 */
export function initBackend(options: { logLevel?: keyof typeof LogLevel } = {}): {
  systemInfo: string;
  supportsGpuOffload: boolean;
  addonPath: string;
} {
  const { binding, path } = loadBinding();
  initialised = binding.backendInit(LogLevel[options.logLevel ?? 'error']);
  // Local devices' compute and synchronize timing (rpcAccounting's `local`), before any backend exists.
  binding.rpcAccountingInstall();
  return {
    systemInfo: initialised.systemInfo,
    supportsGpuOffload: initialised.supportsGpuOffload,
    addonPath: path,
  };
}

/**
 * Every device the backend sees, local and registered ggml-RPC ones, with memory in bytes. Asks
 * every ggml-RPC device for its memory on the calling thread: use {@link describeDevices} once a
 * peer may be registered.
 */
export function listDevices(): NativeDevice[] {
  return call(() => native().devicesList());
}

/**
 * Describes the named devices (memory included) off the JS thread, on a detached native thread of
 * their own: a ggml-RPC device whose peer is gone never answers, and the promise then never
 * settles (it does not keep the process alive). Callers bound the wait themselves. An unknown name
 * throws HYDRA_ERR_NO_DEVICE; a peer that refuses the connection rejects with
 * HYDRA_ERR_PEER_UNREACHABLE.
 */
export function describeDevices(names: readonly string[]): Promise<NativeDevice[]> {
  return callAsync(() => native().devicesDescribe([...names]));
}

/** The ggml-RPC protocol version of the pinned llama.cpp (`RPC_PROTO_*_VERSION` in ggml-rpc.h). */
export const GGML_RPC_VERSION = { major: 6, minor: 0, patch: 0 } as const;

const RPC_CMD_HELLO = 14;
const HELLO_REQ_SIZE = 24;
const HELLO_RSP_SIZE = 28;

/**
 * Checks that `endpoint` answers a ggml-RPC HELLO of a compatible version. Upstream's client aborts
 * the whole process when it cannot reach a server, so every peer is probed before it is used.
 */
export function probeRpcServer(
  endpoint: string,
  timeoutMs = 3000,
): Promise<{ major: number; minor: number; patch: number }> {
  const match = /^(.+):(\d+)$/.exec(endpoint);
  if (!match) {
    return Promise.reject(
      new HydraError('HYDRA_ERR_BAD_ARGUMENT', `endpoint must be host:port, got ${endpoint}`),
    );
  }
  const host = match[1]!.replace(/^\[|\]$/g, '');
  const port = Number(match[2]);
  return new Promise((resolve, reject) => {
    const socket = connect({ host, port });
    const chunks: Buffer[] = [];
    let size = 0;
    const fail = (why: string) => {
      socket.destroy();
      reject(
        new HydraError('HYDRA_ERR_PEER_UNREACHABLE', `ggml-RPC peer ${endpoint}: ${why}`, {
          keys: [endpoint],
        }),
      );
    };
    socket.setTimeout(timeoutMs, () => fail(`no answer within ${timeoutMs} ms`));
    socket.on('error', (err) => fail(err.message));
    socket.on('connect', () => {
      const req = Buffer.alloc(1 + 8 + HELLO_REQ_SIZE);
      req.writeUInt8(RPC_CMD_HELLO, 0);
      req.writeBigUInt64LE(BigInt(HELLO_REQ_SIZE), 1);
      socket.write(req);
    });
    socket.on('data', (chunk) => {
      chunks.push(chunk);
      size += chunk.length;
      if (size < 8 + HELLO_RSP_SIZE) return;
      const rsp = Buffer.concat(chunks);
      socket.destroy();
      if (rsp.readBigUInt64LE(0) !== BigInt(HELLO_RSP_SIZE)) {
        fail(`not a ggml-RPC server of protocol ${GGML_RPC_VERSION.major} (HELLO reply size differs)`);
        return;
      }
      const version = { major: rsp[8]!, minor: rsp[9]!, patch: rsp[10]! };
      if (version.major !== GGML_RPC_VERSION.major) {
        const v = `${version.major}.${version.minor}.${version.patch}`;
        fail(`speaks ggml-RPC ${v}, this build speaks ${GGML_RPC_VERSION.major}.x`);
        return;
      }
      resolve(version);
    });
    socket.on('end', () => {
      if (size < 8 + HELLO_RSP_SIZE) fail('closed the connection during HELLO');
    });
  });
}

/**
 * Registers the devices of a ggml-RPC server (`host:port`) after a HELLO probe, so models can
 * place layers on them (device names `RPC0`, `RPC1`, ...). Registering the same endpoint again
 * returns the same devices.
 */
export async function addRpcServer(
  endpoint: string,
  options: { timeoutMs?: number } = {},
): Promise<NativeDevice[]> {
  await probeRpcServer(endpoint, options.timeoutMs);
  const devices = await callAsync(() => native().rpcServerAdd(endpoint));
  // Before any model uses the new devices: backends and buffers made earlier are not counted.
  native().rpcAccountingInstall();
  // Learnt from the new devices (described off the JS thread), never by listing every device again:
  // that would dial peers lost earlier, whose parked dispatchers never answer.
  if (devices.some(isOffloadDevice)) offloadCheck = true;
  return devices;
}

// Whether an offload device exists: listed once, then only raised by new peers' devices.
// devicesList() asks every ggml-RPC device for its memory, a round trip on the JS thread that never
// returns once that peer is lost (its client thread is parked): a model loaded after a peer loss
// must not ask again.
let offloadCheck: boolean | undefined;
const isOffloadDevice = (d: { type: string }): boolean => d.type === 'gpu' || d.type === 'igpu';
function hasOffloadDevice(binding: NativeBinding): boolean {
  offloadCheck ??= binding.devicesList().some(isOffloadDevice);
  return offloadCheck;
}

/** Parses `<regex>=<buffer type>` (llama.cpp `-ot`) into its parts. */
export function parseOverride(spec: string): { pattern: string; bufferType: string } {
  const at = spec.lastIndexOf('=');
  if (at <= 0 || at === spec.length - 1) {
    throw new HydraError(
      'HYDRA_ERR_BAD_OVERRIDE',
      `override must be "<regex>=<buffer type>", got ${JSON.stringify(spec)}`,
      {
        keys: [spec],
      },
    );
  }
  return { pattern: spec.slice(0, at), bufferType: spec.slice(at + 1) };
}

/**
 * llama.cpp's own default is one thread per physical core (`cpu_get_num_math`); with SMT that is
 * half the logical CPUs. Every logical CPU spinning in ggml's thread pool also starves the thread
 * that feeds the GPU when layers are offloaded.
 */
function defaultThreads(): number {
  const logical = availableParallelism();
  return logical >= 4 ? Math.floor(logical / 2) : logical;
}

/** Parameters of {@link Model.load}: the load-time (T3) llama.cpp parameters. */
export interface ModelLoadParams extends Omit<NativeModelParams, 'overrides'> {
  /** llama.cpp `-ot` strings, `<regex>=<buffer type>`. */
  overrides?: string[];
}

export interface ModelLoadOptions {
  /** Called with 0..1 as the load progresses (at most once per percent). */
  onProgress?: (progress: number) => void;
  /** Aborting cancels the load (`HYDRA_ERR_LOAD_CANCELLED`). */
  signal?: AbortSignal;
}

/**
 * Packs chat messages for {@link Model.applyChatTemplateAsync}: u32 LE count, then per message a
 * u32 LE byte length and the UTF-8 role, a u32 LE byte length and the UTF-8 content.
 */
export function packChatMessages(messages: readonly { role: string; content: string }[]): Uint8Array {
  const enc = new TextEncoder();
  const parts = messages.flatMap((m) => [enc.encode(m.role), enc.encode(m.content)]);
  const out = new Uint8Array(4 + parts.reduce((n, p) => n + 4 + p.length, 0));
  const view = new DataView(out.buffer);
  view.setUint32(0, messages.length, true);
  let at = 4;
  for (const p of parts) {
    view.setUint32(at, p.length, true);
    out.set(p, at + 4);
    at += 4 + p.length;
  }
  return out;
}

/** A loaded model. Dispose it explicitly; contexts must be disposed first. */
export class Model {
  readonly #binding: NativeBinding;
  #handle: ModelHandle | undefined;
  readonly info: NativeModelInfo;
  readonly path: string;
  readonly #contexts = new Set<Context>();
  #jobs = 0;
  #freeAfterJobs: ModelHandle | undefined;

  readonly #offloaded: boolean;

  private constructor(binding: NativeBinding, handle: ModelHandle, params: NativeModelParams) {
    this.#binding = binding;
    this.#handle = handle;
    this.path = params.path;
    this.info = binding.modelInfo(handle);
    // On-device sampling pays off where the output layer sits on a GPU; on the CPU backend it is
    // slower than the host sampler (measured: 0.6x on the tiny model).
    this.#offloaded = (params.nGpuLayers ?? -1) !== 0 && hasOffloadDevice(binding);
  }

  /** Loads a GGUF model off the JS thread. */
  static async load(params: ModelLoadParams, options: ModelLoadOptions = {}): Promise<Model> {
    const binding = native();
    const overrides = (params.overrides ?? []).map(parseOverride);
    if (options.signal?.aborted)
      throw new HydraError('HYDRA_ERR_LOAD_CANCELLED', 'model load aborted before start');
    const { promise, cancel } = call(() => binding.modelLoad({ ...params, overrides }, options.onProgress));
    const onAbort = () => cancel();
    options.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      const handle = await callAsync(() => promise);
      return new Model(binding, handle, { ...params, overrides });
    } finally {
      options.signal?.removeEventListener('abort', onAbort);
    }
  }

  get disposed(): boolean {
    return this.#handle === undefined;
  }

  #h(): ModelHandle {
    if (!this.#handle) throw new HydraError('HYDRA_ERR_DISPOSED', 'model was disposed');
    return this.#handle;
  }

  tokenize(text: string, options: { addSpecial?: boolean; parseSpecial?: boolean } = {}): Int32Array {
    return call(() =>
      this.#binding.tokenize(
        this.#h(),
        text,
        options.addSpecial ?? this.info.addBos,
        options.parseSpecial ?? true,
      ),
    );
  }

  /** Raw bytes of one token (may be part of a UTF-8 sequence). */
  tokenBytes(token: number, special = false): Buffer {
    return call(() => this.#binding.tokenToPiece(this.#h(), token, special));
  }

  detokenize(
    tokens: Int32Array,
    options: { removeSpecial?: boolean; unparseSpecial?: boolean } = {},
  ): string {
    return call(() =>
      this.#binding.detokenize(
        this.#h(),
        tokens,
        options.removeSpecial ?? false,
        options.unparseSpecial ?? false,
      ),
    );
  }

  isEndOfGeneration(token: number): boolean {
    return this.#binding.tokenIsEog(this.#h(), token);
  }

  /** Formats messages with the model's chat template (or `template`). */
  applyChatTemplate(
    messages: { role: string; content: string }[],
    options: { addAssistant?: boolean; template?: string } = {},
  ): string {
    return call(() =>
      this.#binding.chatApplyTemplate(this.#h(), messages, options.addAssistant ?? true, options.template),
    );
  }

  /**
   * {@link tokenize} off the JS thread, in time linear in the text (llama.cpp's own special-token
   * partition is quadratic in the number of special tokens; `upstream: true` runs it as is).
   */
  tokenizeAsync(
    text: string,
    options: { addSpecial?: boolean; parseSpecial?: boolean; upstream?: boolean } = {},
  ): Promise<Int32Array> {
    return this.#job(() =>
      this.#binding.tokenizeAsync(
        this.#h(),
        text,
        options.addSpecial ?? this.info.addBos,
        options.parseSpecial ?? true,
        options.upstream ?? false,
      ),
    );
  }

  /**
   * {@link applyChatTemplate} off the JS thread. `messages` may come packed
   * ({@link packChatMessages}): one copy on the JS thread instead of one per string.
   */
  applyChatTemplateAsync(
    messages: readonly { role: string; content: string }[] | Uint8Array,
    options: { addAssistant?: boolean; template?: string } = {},
  ): Promise<string> {
    const addAssistant = options.addAssistant ?? true;
    if (messages instanceof Uint8Array) {
      return this.#job(() =>
        this.#binding.chatApplyTemplatePackedAsync(this.#h(), messages, addAssistant, options.template),
      );
    }
    const roles = messages.map((m) => m.role);
    const contents = messages.map((m) => m.content);
    return this.#job(() =>
      this.#binding.chatApplyTemplateAsync(this.#h(), roles, contents, addAssistant, options.template),
    );
  }

  /**
   * {@link applyChatTemplateAsync} then {@link tokenizeAsync} in one job off the JS thread: the
   * rendered text never becomes a JS string.
   */
  tokenizeChatAsync(
    messages: readonly { role: string; content: string }[] | Uint8Array,
    options: { addAssistant?: boolean; template?: string; addSpecial?: boolean; parseSpecial?: boolean } = {},
  ): Promise<Int32Array> {
    const packed = messages instanceof Uint8Array ? messages : packChatMessages(messages);
    return this.#job(() =>
      this.#binding.chatTokenizePackedAsync(
        this.#h(),
        packed,
        options.addAssistant ?? true,
        options.template,
        options.addSpecial ?? this.info.addBos,
        options.parseSpecial ?? true,
      ),
    );
  }

  /**
   * Renders an OpenAI chat body (messages with tool_calls and tool results, tools, tool_choice,
   * parallel_tool_calls, add_generation_prompt, chat_template_kwargs, reasoning_format) through
   * llama.cpp's common chat layer, as llama-server does: the prompt, the grammar and triggers that
   * constrain tool calls, extra stops, and what {@link parseChatOutput} needs to read the reply.
   * A body the layer refuses (bad messages, a template error) is HYDRA_ERR_BAD_ARGUMENT.
   */
  applyChatCommonAsync(body: object, options: ChatCommonOptions = {}): Promise<ChatCommonParams> {
    const text = JSON.stringify(body);
    const tokenize = options.tokenize === true;
    const opts = JSON.stringify({
      use_jinja: options.useJinja ?? true,
      reasoning_format: options.reasoningFormat ?? 'auto',
      enable_thinking: options.enableThinking ?? true,
      chat_template_kwargs: options.chatTemplateKwargs ?? {},
    });
    return this.#job(() =>
      this.#binding.chatCommonApplyAsync(
        this.#h(),
        options.template ?? '',
        text,
        opts,
        options.messagesJson,
        tokenize,
      ),
    ).then((res) => {
      const r = JSON.parse(typeof res === 'string' ? res : res.json) as RawChatCommonParams;
      return {
        prompt: r.prompt,
        format: r.format,
        formatName: r.format_name,
        grammar: r.grammar,
        grammarLazy: r.grammar_lazy,
        grammarTriggers: r.grammar_triggers,
        generationPrompt: r.generation_prompt,
        supportsThinking: r.supports_thinking,
        preservedTokens: r.preserved_tokens,
        additionalStops: r.additional_stops,
        parser: r.parser,
        reasoningFormat: r.reasoning_format,
        parseToolCalls: r.parse_tool_calls,
        ...(typeof res === 'string' ? {} : { tokens: res.tokens, promptBytes: r.prompt_bytes ?? 0 }),
      };
    });
  }

  // A job holds the native model until it settles: dispose() while one runs frees it afterwards.
  async #job<T>(start: () => Promise<T>): Promise<T> {
    const promise = call(start);
    this.#jobs++;
    try {
      return await callAsync(() => promise);
    } finally {
      if (--this.#jobs === 0 && this.#freeAfterJobs) {
        const handle = this.#freeAfterJobs;
        this.#freeAfterJobs = undefined;
        call(() => this.#binding.modelFree(handle));
      }
    }
  }

  /** Creates a context with the context-time (T2) parameters, off the JS thread. */
  async createContext(params: NativeContextParams = {}): Promise<Context> {
    const threads = defaultThreads();
    // Callers pass unset options as undefined; those must not hide the defaults.
    const given = Object.fromEntries(Object.entries(params).filter(([, v]) => v !== undefined));
    const handle = await callAsync(() =>
      this.#binding.contextCreate(this.#h(), {
        backendSampling: this.#offloaded,
        nThreads: threads,
        nThreadsBatch: threads,
        ...given,
      }),
    );
    const ctx = new Context(this.#binding, handle, this, () => this.#contexts.delete(ctx));
    this.#contexts.add(ctx);
    return ctx;
  }

  /** A sampler chain with the per-request (T1) sampling parameters; `temp <= 0` is greedy. */
  /** Why `draft` cannot draft for this model (llama.cpp's vocab compatibility check), or "". */
  draftVocabMismatch(draft: Model): string {
    return this.#binding.draftVocabMismatch(this.#h(), draft.#h());
  }

  createSampler(params: NativeSamplerParams = {}): Sampler {
    return new Sampler(
      this.#binding,
      call(() => this.#binding.samplerCreate(this.#h(), params)),
    );
  }

  /** Frees the model. Throws if contexts are still alive. */
  dispose(): void {
    if (!this.#handle) return;
    if (this.#contexts.size > 0) {
      throw new HydraError(
        'HYDRA_ERR_BAD_ARGUMENT',
        `model still has ${this.#contexts.size} live context(s)`,
      );
    }
    const handle = this.#handle;
    this.#handle = undefined;
    if (this.#jobs > 0) this.#freeAfterJobs = handle;
    else call(() => this.#binding.modelFree(handle));
  }
}

/** Options of {@link Model.applyChatCommonAsync} (the server-wide defaults a body may override). */
export interface ChatCommonOptions {
  /** A Jinja template (or a llama.cpp template name) used instead of the model's. */
  template?: string;
  /** false: the legacy llama_chat_apply_template renderer (no tools). Default true. */
  useJinja?: boolean;
  /** none, auto, deepseek, deepseek-legacy (llama-server's --reasoning-format). Default auto. */
  reasoningFormat?: string;
  enableThinking?: boolean;
  /** Server-wide template variables; the body's chat_template_kwargs win. */
  chatTemplateKwargs?: Record<string, unknown>;
  /** The body's `messages` as JSON text (UTF-8), copied once instead of made on the JS thread. */
  messagesJson?: Uint8Array;
  /**
   * Tokenize the prompt in the same job (as {@link Model.tokenizeAsync}): `tokens` and
   * `promptBytes` come back and `prompt` is empty, so a long chat never becomes a JS string.
   */
  tokenize?: boolean;
}

/** A grammar trigger as common_chat_params gives it. */
export interface ChatGrammarTrigger {
  type: 'token' | 'word' | 'pattern' | 'pattern_full';
  value: string;
  token?: number;
}

/** What llama.cpp's common chat layer made of a chat body. */
export interface ChatCommonParams {
  prompt: string;
  /** common_chat_format (a number) and its name. */
  format: number;
  formatName: string;
  /** GBNF constraining the reply (tool calls, schema); empty when none. */
  grammar: string;
  /** The grammar applies only from a trigger on. */
  grammarLazy: boolean;
  grammarTriggers: ChatGrammarTrigger[];
  generationPrompt: string;
  supportsThinking: boolean;
  preservedTokens: string[];
  additionalStops: string[];
  /** The serialized PEG parser for {@link parseChatOutput}; empty for formats without one. */
  parser: string;
  reasoningFormat: string;
  parseToolCalls: boolean;
  /** With `tokenize`: the prompt's tokens and its length in bytes. */
  tokens?: Int32Array;
  promptBytes?: number;
}

interface RawChatCommonParams {
  prompt: string;
  format: number;
  format_name: string;
  grammar: string;
  grammar_lazy: boolean;
  grammar_triggers: ChatGrammarTrigger[];
  generation_prompt: string;
  supports_thinking: boolean;
  preserved_tokens: string[];
  additional_stops: string[];
  parser: string;
  reasoning_format: string;
  parse_tool_calls: boolean;
  prompt_bytes?: number;
}

/** A reply as common_chat_parse reads it. */
export interface ParsedChatMessage {
  content: string;
  reasoningContent: string;
  toolCalls: { name: string; arguments: string; id: string }[];
}

/**
 * Reads generated text with what {@link Model.applyChatCommonAsync} returned (llama.cpp's
 * common_chat_parse): content, reasoning_content and tool calls. `partial: true` reads a stream
 * so far (a call still being written is left out or cut where it stands, as llama-server does).
 * Text the format cannot read is HYDRA_ERR_BAD_ARGUMENT.
 */
export async function parseChatOutput(
  text: string,
  params: Pick<
    ChatCommonParams,
    'format' | 'parser' | 'generationPrompt' | 'reasoningFormat' | 'parseToolCalls'
  >,
  partial = false,
): Promise<ParsedChatMessage> {
  const args = JSON.stringify({
    text,
    is_partial: partial,
    format: params.format,
    parser: params.parser,
    generation_prompt: params.generationPrompt,
    reasoning_format: params.reasoningFormat,
    parse_tool_calls: params.parseToolCalls,
  });
  const out = await callAsync(() => native().chatCommonParseAsync(args));
  const r = JSON.parse(out) as {
    content_text: string;
    reasoning_text: string;
    hydra_tool_calls: ParsedChatMessage['toolCalls'];
  };
  return { content: r.content_text, reasoningContent: r.reasoning_text, toolCalls: r.hydra_tool_calls };
}

/**
 * The GBNF grammar (root rule `root`) that llama-server builds for a JSON schema, with the pinned
 * llama.cpp's `json_schema_to_grammar`. A schema it cannot convert (or JSON text over 1 MiB) is
 * HYDRA_ERR_BAD_ARGUMENT.
 */
export function jsonSchemaToGrammar(schema: unknown): string {
  const text = JSON.stringify(schema);
  if (text === undefined) throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'a JSON schema must be JSON');
  return call(() => native().jsonSchemaToGrammar(text));
}

/** A sampler chain for one sequence. */
export class Sampler {
  readonly #binding: NativeBinding;
  #handle: SamplerHandle | undefined;

  constructor(binding: NativeBinding, handle: SamplerHandle) {
    this.#binding = binding;
    this.#handle = handle;
  }

  /** @internal */
  get handle(): SamplerHandle {
    if (!this.#handle) throw new HydraError('HYDRA_ERR_DISPOSED', 'sampler was disposed');
    return this.#handle;
  }

  /** Adds tokens to the sampler's history (prompt tokens, for penalties and DRY; a grammar skips them). */
  accept(tokens: Int32Array): void {
    this.#binding.samplerAccept(this.handle, tokens);
  }

  /** The stages of the chain llama.cpp runs, as llama.cpp names them (`top-k`, `dist`, `greedy`, ...). */
  names(): string[] {
    return call(() => this.#binding.samplerNames(this.handle));
  }

  dispose(): void {
    if (!this.#handle) return;
    this.#binding.samplerFree(this.#handle);
    this.#handle = undefined;
  }
}

/** One sequence's work in a {@link Context.decode} step. */
export type DecodeEntry = DecodeTokens | DecodeFollow;

interface DecodeCommon {
  seq: number;
  /** Position of the first token. */
  pos: number;
  /** Sample the token after the last one with this chain. */
  sampler?: Sampler;
  /** Return the logits after the last token. */
  logits?: boolean;
  /**
   * Report the sampled token's probability and the `probs` most likely tokens (needs a sampler, no
   * `draft`), as llama-server's `n_probs`: a softmax over the whole vocabulary, or with
   * `postSampling` the candidates the chain leaves (zero-probability ones dropped). Such an entry
   * samples on the host.
   */
  probs?: number;
  postSampling?: boolean;
  /**
   * Read this sequence's partial state (the part of the memory that cannot be rolled back: a
   * recurrent or hybrid model's recurrent state, not the attention KV) right after the step, before
   * any other call can touch the context: the step's `checkpoints` entry. For prompt checkpoints,
   * restored with {@link Context.setSequenceState} and `{ partial: true }`.
   */
  checkpoint?: boolean;
}

/** Feeds the given tokens. */
export interface DecodeTokens extends DecodeCommon {
  tokens: Int32Array | number[];
  follow?: false;
  /**
   * The last `draft` tokens are guesses (speculative decoding; needs a sampler, no `logits`, at
   * most n_batch tokens). The sampler runs after each of the last `draft + 1` positions in turn and
   * stops at the first sample that differs from the next guess: the step's `runs` entry holds those
   * samples (1 to draft + 1), `tokens` the last. The KV keeps every position fed; the caller
   * removes those after the accepted guesses.
   */
  draft?: number;
}

/** What {@link Context.decode} resolves to. */
export interface DecodeResult {
  tokens: Int32Array;
  logits: (Float32Array | null)[];
  /** Present when an entry had `draft`: per entry, its samples (null for entries without). */
  runs?: (Int32Array | null)[];
  /**
   * Present when an entry asked for `probs`: per entry (null for entries without) the sampled
   * token's probability and the most likely tokens, most likely first.
   */
  probs?: (TokenProbs | null)[];
  /** Present when an entry asked for `checkpoint`: per entry, its partial state (null for entries without). */
  checkpoints?: (Buffer | null)[];
}

/** One sampled token's probabilities ({@link DecodeCommon.probs}). */
export interface TokenProbs {
  /** Probability of the sampled token. */
  prob: number;
  /** Token ids, most likely first, and their probabilities. */
  ids: Int32Array;
  probs: Float32Array;
}

/**
 * Feeds the one token this sequence sampled at its previous step, known only when that step ends.
 * This lets a caller queue step k+1 before step k resolves, so the device starts it at once.
 * Needs a sampler. If the previous step failed, this one fails too (`HYDRA_ERR_DECODE_FAILED`).
 */
export interface DecodeFollow extends DecodeCommon {
  follow: true;
  sampler: Sampler;
}

/**
 * A llama.cpp context. Operations run one at a time, in call order, off the JS thread. Decode steps
 * may be queued back to back (await neither): each starts the moment the one before ends.
 */
export class Context {
  readonly #binding: NativeBinding;
  #handle: ContextHandle | undefined;
  readonly model: Model;
  readonly #onDispose: () => void;
  #queue: Promise<unknown> = Promise.resolve();
  /** Queued operations not yet settled: state get/set and what waits behind them. Decode skips #queue only at 0. */
  #exclusive = 0;

  constructor(binding: NativeBinding, handle: ContextHandle, model: Model, onDispose: () => void) {
    this.#binding = binding;
    this.#handle = handle;
    this.model = model;
    this.#onDispose = onDispose;
  }

  #h(): ContextHandle {
    if (!this.#handle) throw new HydraError('HYDRA_ERR_DISPOSED', 'context was disposed');
    return this.#handle;
  }

  #enqueue<T>(op: () => Promise<T>): Promise<T> {
    this.#exclusive += 1;
    const run = this.#queue.then(op, op).finally(() => {
      this.#exclusive -= 1;
    });
    this.#queue = run.catch(() => undefined);
    return run.catch(rethrow);
  }

  get info(): {
    nCtx: number;
    nCtxSeq: number;
    nBatch: number;
    nUbatch: number;
    nSeqMax: number;
    /** Recurrent-state snapshots per sequence in force (0: no partial rollback). */
    nRsSeq: number;
    nThreads: number;
    nThreadsBatch: number;
  } {
    return this.#binding.contextInfo(this.#h());
  }

  /** Bytes llama.cpp allocated per buffer type: weights (`model`), KV cache (`context`), `compute`. */
  memory(): ContextMemoryRow[] {
    return this.#binding.contextMemory(this.#h());
  }

  /**
   * One decode step for every listed sequence: a single native call that evaluates all tokens
   * (prompt chunks included, split by n_batch) and samples each sequence that has a sampler.
   * @returns the sampled token per entry (-1 where none) and the logits where asked.
   */
  decode(entries: DecodeEntry[]): Promise<DecodeResult> {
    const native = entries.map((e) => ({
      seq: e.seq,
      pos: e.pos,
      ...(e.follow === true
        ? { follow: true }
        : { tokens: e.tokens instanceof Int32Array ? e.tokens : Int32Array.from(e.tokens) }),
      sampler: e.sampler ? e.sampler.handle : null,
      logits: e.logits ?? false,
      ...(e.follow !== true && e.draft ? { draft: e.draft } : {}),
      ...(e.probs ? { probs: e.probs, postSampling: e.postSampling === true } : {}),
      ...(e.checkpoint ? { checkpoint: true } : {}),
    }));
    const step = () => this.#binding.decodeStep(this.#h(), native);
    // Behind an exclusive operation (state get/set) queued or running: wait in line. Otherwise
    // straight to the native runner, which keeps steps in call order and runs the next as soon as
    // the current one ends; steps settle in that order, so this one is the queue's new tail.
    if (this.#exclusive > 0) return this.#enqueue(step);
    let run: Promise<DecodeResult>;
    try {
      run = step();
    } catch (err) {
      return Promise.reject(err).catch(rethrow);
    }
    this.#queue = run.catch(() => undefined);
    return run.catch(rethrow);
  }

  /**
   * Speculative drafting on a draft model's context (llama.cpp's draft-simple): feeds each entry's
   * `tokens` at `pos` (what the sequence lacks, ending with the target's last sample), then guesses
   * greedily, one token per sequence per step, while the top candidate's probability among the
   * top 10 is at least `pMin` and fewer than `nMax` were guessed; a draft shorter than `nMin` is
   * dropped. `fed`: guesses decoded into the KV (all but the last).
   */
  draft(
    entries: { seq: number; pos: number; tokens: Int32Array; nMax: number }[],
    nMin: number,
    pMin: number,
  ): Promise<{ tokens: Int32Array; fed: number }[]> {
    const run = () => this.#binding.draftGenerate(this.#h(), entries, nMin, pMin);
    if (this.#exclusive > 0) return this.#enqueue(run);
    let out: Promise<{ tokens: Int32Array; fed: number }[]>;
    try {
      out = run();
    } catch (err) {
      return Promise.reject(err).catch(rethrow);
    }
    this.#queue = out.catch(() => undefined);
    return out.catch(rethrow);
  }

  /** Removes positions [p0, p1) of a sequence from the KV cache (p1 < 0: to the end). */
  removeSequence(seq: number, p0 = -1, p1 = -1): boolean {
    return this.#binding.memorySeqRm(this.#h(), seq, p0, p1);
  }

  /**
   * Moves positions [p0, p1) of a sequence by `delta` (llama_memory_seq_add), as a context shift
   * does after removing the discarded span; throws HYDRA_ERR_BAD_ARGUMENT where `canShift` is false.
   */
  shiftSequence(seq: number, p0: number, p1: number, delta: number): void {
    this.#binding.memorySeqAdd(this.#h(), seq, p0, p1, delta);
  }

  /** Whether the memory can move positions (false for recurrent and hybrid models). */
  get canShift(): boolean {
    return this.#binding.memoryCanShift(this.#h());
  }

  copySequence(src: number, dst: number, p0 = -1, p1 = -1): void {
    this.#binding.memorySeqCp(this.#h(), src, dst, p0, p1);
  }

  /** Largest position held for a sequence, -1 when empty. */
  sequenceEnd(seq: number): number {
    return this.#binding.memorySeqPosMax(this.#h(), seq);
  }

  clear(): void {
    this.#binding.memoryClear(this.#h());
  }

  /** What the context pools ({@link embed}), and the rerank prompt pieces of its model. */
  get embedInfo(): NativeEmbedInfo {
    return this.#binding.embedInfo(this.#h());
  }

  /**
   * Embeds each input in its own sequence (emptied before and after) in one llama_decode, with the
   * context's pooling: one row of `nEmbdOut` per input normalized as llama.cpp's
   * common_embd_normalize does (`normalize`: -1 none, 0 max-abs int16, 2 euclidean, p: p-norm;
   * rank pooling: the `nClsOut` scores, never normalized), or with pooling `none` every token's row
   * (`tokens x nEmbdOut`, not normalized, as llama-server). All inputs together must fit one ubatch.
   */
  embed(entries: { seq: number; tokens: Int32Array }[], normalize = 2): Promise<Float32Array[]> {
    return this.#enqueue(() => this.#binding.embedBatch(this.#h(), entries, normalize));
  }

  /**
   * Serialised KV state of one sequence; `partial`: only the part that cannot be rolled back
   * (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: a hybrid's recurrent state without its attention KV).
   */
  getSequenceState(seq: number, options?: { partial?: boolean }): Promise<Buffer> {
    const o = options?.partial ? { partial: true } : undefined;
    return this.#enqueue(() => this.#binding.stateSeqGet(this.#h(), seq, o));
  }

  /**
   * Restores a sequence from {@link getSequenceState} output (copied before the work is queued),
   * with the same `partial` it was read with: a partial restore leaves the attention KV as it is.
   */
  setSequenceState(seq: number, data: Uint8Array, options?: { partial?: boolean }): Promise<number> {
    const o = options?.partial ? { partial: true } : undefined;
    return this.#enqueue(() => this.#binding.stateSeqSet(this.#h(), seq, data, o));
  }

  /** Frees the context after its queued operations finish. */
  async dispose(): Promise<void> {
    if (!this.#handle) return;
    await this.#queue;
    const handle = this.#handle;
    this.#handle = undefined;
    call(() => this.#binding.contextFree(handle));
    this.#onDispose();
  }
}

/** Resolves the first byte of a socket without consuming it; -1 on EOF or timeout. */
export function peekFirstByte(fd: number, timeoutMs: number): Promise<number> {
  return callAsync(() => native().peekFirstByte(fd, timeoutMs));
}

/** Duplicates a socket fd as a blocking fd with TCP_NODELAY (the caller then destroys its socket). */
export function detachFd(fd: number): number {
  return call(() => native().detachFd(fd));
}

/**
 * Ends the process at once with `code`, without running static destructors: `process.exit()` while a
 * decode is in flight on a worker thread tears ggml's backends down under it (SIGSEGV). Write
 * (synchronously) whatever must be said before calling it.
 */
export function exitNow(code: number): never {
  return native().exitNow(code);
}

export function closeFd(fd: number): void {
  native().fdClose(fd);
}

/** Shuts a served connection down so the worker blocked on it returns (the worker still closes it). */
export function shutdownFd(fd: number): void {
  native().fdShutdown(fd);
}

/** Absolute path of the module that serves one ggml-RPC session per task (an rpc-host's worker thread). */
export const rpcWorkerPath: string = new URL('./rpc-worker.js', import.meta.url).pathname;

/**
 * Adds a GGUF this process holds to the ggml-RPC weights index (process-wide, read-only mmap).
 * Every session served by this process then answers a client's `SET_TENSOR_HASH` from the file,
 * so a head loading the same model sends no weight bytes for tensors above upstream's 10 MiB hash
 * threshold. Adding the same file twice is free (`already`).
 */
export function rpcWeightsIndexAdd(path: string): Promise<NativeWeightsIndexAdded> {
  return callAsync(() => native().rpcWeightsIndexAdd(path));
}

/** What the ggml-RPC weights index holds, and how many hash requests it answered. */
export function rpcWeightsIndexInfo(): NativeWeightsIndexInfo {
  return native().rpcWeightsIndexInfo();
}

/**
 * Makes a failed ggml-RPC send or receive park the failing client thread for good instead of
 * aborting the process (upstream's `RPC_STATUS_ASSERT`). The decode waiting on that peer then
 * never resolves: the caller must watch for the stall and abandon (never reuse or free) the model
 * and context that used the peer. Other aborts keep upstream's behaviour. Idempotent.
 */
export function installRpcAbortPark(): void {
  native().rpcAbortParkInstall();
}

/** How many ggml-RPC client threads were parked so far, and the last abort message. */
export function rpcParkedInfo(): { parked: number; last: string } {
  return native().rpcParkedInfo();
}

/**
 * Per-peer accounting of the ggml-RPC client path, cumulative since each peer's registration
 * (`addRpcServer` installs it): commands by type, round trips, time blocked on the peer, time
 * serializing, and the kernel's TCP counters of the connection; plus each local device's graph
 * compute and synchronize time. Reading it costs one `getsockopt` per peer (a `/proc/self/fd`
 * scan, at most 4 a second, until the peer's connection is found).
 */
export function rpcAccounting(): NativeRpcAccounting {
  return native().rpcAccounting();
}

export type {
  NativeLocalAccounting as LocalAccounting,
  NativeRpcAccounting as RpcAccounting,
  NativeRpcPeerAccounting as RpcPeerAccounting,
  NativeRpcTcp as RpcTcp,
  RpcCommandName,
};

export type { NgramDrafterParams, NgramDrafterType };

/**
 * One of llama.cpp's draft-free drafters (`ngram_map_k`, `ngram_map_k4v`, `ngram_mod`,
 * `ngram_cache`: the pinned common/ code) for `nSeq` sequences, as common_speculative runs them:
 * {@link begin} when a sequence's generation starts, {@link draft} before each step, {@link accept}
 * after a non-empty draft was verified. ngram_mod's hash is shared by all sequences, as upstream's.
 */
export class NgramDrafter {
  readonly type: NgramDrafterType;
  readonly #binding: NativeBinding;
  #handle: NgramHandle | undefined;

  constructor(type: NgramDrafterType, params: NgramDrafterParams, nSeq: number) {
    this.#binding = native();
    this.type = type;
    this.#handle = call(() => this.#binding.ngramCreate(type, params, nSeq));
  }

  #h(): NgramHandle {
    if (!this.#handle) throw new HydraError('HYDRA_ERR_DISPOSED', 'ngram drafter was disposed');
    return this.#handle;
  }

  /** Sequence `seq` starts generating after `prompt`. */
  begin(seq: number, prompt: Int32Array): void {
    call(() => this.#binding.ngramBegin(this.#h(), seq, prompt));
  }

  /** The guess after `history` (its last token is the one just sampled), at most `limit` tokens. */
  draft(seq: number, history: Int32Array, limit: number): Int32Array {
    return call(() => this.#binding.ngramDraft(this.#h(), seq, history, limit));
  }

  /** How many tokens of `seq`'s last non-empty draft the target confirmed. */
  accept(seq: number, nAccepted: number): void {
    call(() => this.#binding.ngramAccept(this.#h(), seq, nAccepted));
  }

  dispose(): void {
    if (!this.#handle) return;
    this.#binding.ngramFree(this.#handle);
    this.#handle = undefined;
  }
}
