// The compiled addon, typed by hand, and the one place that loads it. Tries the CUDA build, then
// the CPU build (or the file named by HYDRA_NATIVE_ADDON), and otherwise throws one error that
// lists what was tried and how to fix it.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { HydraError } from '@hydra-engine/errors';

declare const modelHandle: unique symbol;
declare const contextHandle: unique symbol;
declare const samplerHandle: unique symbol;
/** Opaque native handles. */
export type ModelHandle = { readonly [modelHandle]: true };
export type ContextHandle = { readonly [contextHandle]: true };
export type SamplerHandle = { readonly [samplerHandle]: true };
declare const ngramHandle: unique symbol;
export type NgramHandle = { readonly [ngramHandle]: true };

/** llama.cpp's n-gram drafters other than ngram_simple (common/ngram-map, ngram-mod, ngram-cache). */
export type NgramDrafterType = 'ngram_map_k' | 'ngram_map_k4v' | 'ngram_mod' | 'ngram_cache';

/** Their settings: sizeN/sizeM/minHits for the maps, nMatch/nMax/nMin for ngram_mod, none for ngram_cache. */
export interface NgramDrafterParams {
  sizeN?: number;
  sizeM?: number;
  minHits?: number;
  nMatch?: number;
  nMax?: number;
  nMin?: number;
}

export interface NativeDevice {
  name: string;
  description: string;
  type: 'cpu' | 'gpu' | 'igpu' | 'accel' | 'unknown';
  free: number;
  total: number;
  bufferType: string;
}

export interface NativeModelParams {
  path: string;
  nGpuLayers?: number;
  splitMode?: 'none' | 'layer' | 'row';
  mainGpu?: number;
  tensorSplit?: number[];
  devices?: string[];
  overrides?: { pattern: string; bufferType: string }[];
  kvOverrides?: { key: string; type: 'int' | 'float' | 'bool' | 'str'; value: number | boolean | string }[];
  useMmap?: boolean;
  useMlock?: boolean;
  /** Read the file with O_DIRECT (llama.cpp's load mode dio); wins over useMmap/useMlock. */
  useDirectIo?: boolean;
  checkTensors?: boolean;
  /** Keep weights out of the CPU's extra buffer types (the repacked CPU_REPACK layouts). */
  noExtraBufts?: boolean;
  /** Keep weights out of a GPU device's pinned host buffer. */
  noHost?: boolean;
}

export interface NativeModelInfo {
  arch: string;
  description: string;
  name: string;
  nLayer: number;
  nEmbd: number;
  nHead: number;
  nHeadKv: number;
  nCtxTrain: number;
  nVocab: number;
  nParams: number;
  size: number;
  nExpert: number;
  chatTemplate: string | null;
  bos: number;
  eos: number;
  addBos: boolean;
  /** Recurrent or hybrid memory: a sequence's last positions cannot be removed alone. */
  recurrent: boolean;
  /** Fill-in-the-middle tokens (llama_vocab_fim_pre/suf/mid/rep/sep); -1: none. */
  fimPre: number;
  fimSuf: number;
  fimMid: number;
  fimRep: number;
  fimSep: number;
}

export interface NativeContextParams {
  nCtx?: number;
  nBatch?: number;
  nUbatch?: number;
  nSeqMax?: number;
  /**
   * Outputs one sequence may sample on the device in a step (llama.cpp's default 1; 0: n_batch).
   * A speculative draft of N guesses needs N + 1, else its positions sample on the host.
   */
  nOutputsMaxPerSeq?: number;
  /**
   * Recurrent-state snapshots kept per sequence (llama.cpp's n_rs_seq, default 0), so removing the
   * last k <= nRsSeq positions of a recurrent or hybrid memory restores the state before them; the
   * recurrent state grows (1 + nRsSeq) times. An arch without partial rollback clamps it to 0
   * (read back in `Context.info.nRsSeq`).
   */
  nRsSeq?: number;
  nThreads?: number;
  nThreadsBatch?: number;
  flashAttn?: 'auto' | 'on' | 'off';
  typeK?: string;
  typeV?: string;
  ropeFreqBase?: number;
  ropeFreqScale?: number;
  ropeScalingType?: 'none' | 'linear' | 'yarn';
  yarnExtFactor?: number;
  yarnAttnFactor?: number;
  yarnBetaFast?: number;
  yarnBetaSlow?: number;
  yarnOrigCtx?: number;
  offloadKqv?: boolean;
  opOffload?: boolean;
  swaFull?: boolean;
  kvUnified?: boolean;
  noPerf?: boolean;
  /** Create the context for embeddings (llama-server's --embedding); decode steps still run without. */
  embeddings?: boolean;
  /** How embeddings are pooled per sequence; unspecified: the model's default. */
  poolingType?: PoolingType;
  /** Sample on the device where the chain allows (default true): a step returns token ids only. */
  backendSampling?: boolean;
  /** llama_attention_type: unspecified takes the model's (causal for a decoder). */
  attentionType?: 'unspecified' | 'causal' | 'non_causal';
  /**
   * CPU affinity of the compute threads (hex, lowest bit CPU 0), as llama-server's --cpu-mask: the
   * context gets a ggml threadpool attached. `cpuStrict` gives each thread one CPU of the mask.
   */
  cpuMask?: string;
  cpuStrict?: boolean;
  /** The same for batch (prompt) processing (--cpu-mask-batch, --cpu-strict-batch). */
  cpuMaskBatch?: string;
  cpuStrictBatch?: boolean;
}

/** llama_pooling_type by name (llama-server's --pooling). */
export type PoolingType = 'unspecified' | 'none' | 'mean' | 'cls' | 'last' | 'rank';

/** What a context pools and returns, and the pieces of a rerank prompt (embedInfo). */
export interface NativeEmbedInfo {
  /** The pooling in force (the model's default resolved); never `unspecified`. */
  poolingType: Exclude<PoolingType, 'unspecified'>;
  nEmbdOut: number;
  /** Scores per sequence with rank pooling. */
  nClsOut: number;
  /** The model has a classification head (cls / cls_out tensors) for rank pooling. */
  hasRankHead: boolean;
  /** The GGUF's `rerank` template ({query}, {document}), if any. */
  rerankTemplate: string | null;
  addBos: boolean;
  addEos: boolean;
  addSep: boolean;
  bos: number;
  eos: number;
  sep: number;
}

/** The sampler stages of common_params_sampling's `samplers` order. */
export type SamplerStage =
  | 'penalties'
  | 'dry'
  | 'top_n_sigma'
  | 'top_k'
  | 'typ_p'
  | 'top_p'
  | 'min_p'
  | 'xtc'
  | 'temperature'
  | 'infill'
  | 'adaptive_p';

/**
 * common_params_sampling in camelCase; absent fields take llama.cpp's defaults. `penaltyLastN` and
 * `dryPenaltyLastN` -1 mean the model's training context. `logitBias` token ids must be below the
 * vocabulary size.
 */
export interface NativeSamplerParams {
  temp?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  typP?: number;
  minKeep?: number;
  penaltyRepeat?: number;
  penaltyFreq?: number;
  penaltyPresent?: number;
  penaltyLastN?: number;
  seed?: number;
  /** GBNF with a `root` rule; a grammar that does not parse is HYDRA_ERR_BAD_ARGUMENT. */
  grammar?: string;
  /** The grammar applies from a trigger on (a pattern match or a token), as a lazy grammar. */
  grammarLazy?: boolean;
  /** Regexes over the text so far; a match turns a lazy grammar on (llama_sampler_init_grammar_lazy_patterns). */
  grammarTriggerPatterns?: string[];
  grammarTriggerTokens?: number[];
  /** Text the prompt already ends with that the (non-lazy) grammar must first accept (a chat's generation prompt). */
  grammarPrefill?: string;
  xtcProbability?: number;
  xtcThreshold?: number;
  dynatempRange?: number;
  dynatempExponent?: number;
  dryMultiplier?: number;
  dryBase?: number;
  dryAllowedLength?: number;
  dryPenaltyLastN?: number;
  drySequenceBreakers?: string[];
  adaptiveTarget?: number;
  adaptiveDecay?: number;
  /** 0 off, 1 Mirostat, 2 Mirostat 2.0 (then only temperature comes before it, as upstream). */
  mirostat?: number;
  mirostatTau?: number;
  mirostatEta?: number;
  topNSigma?: number;
  logitBias?: { token: number; bias: number }[];
  /** Stage order (default: penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature). */
  samplers?: SamplerStage[];
}

export interface NativeDecodeEntry {
  seq: number;
  pos: number;
  tokens?: Int32Array;
  follow?: boolean;
  sampler?: SamplerHandle | null;
  logits?: boolean;
  /** The last `draft` tokens are guesses to verify (see DecodeTokens.draft). */
  draft?: number;
  /** Report this many most likely tokens (see DecodeCommon.probs). */
  probs?: number;
  postSampling?: boolean;
  /** Read the sequence's partial state right after the step (see DecodeCommon.checkpoint). */
  checkpoint?: boolean;
}

/** One sampled token's probabilities (see DecodeResult.probs). */
export interface NativeTokenProbs {
  prob: number;
  ids: Int32Array;
  probs: Float32Array;
}

/**
 * Per-session caps and timeouts of a served ggml-RPC session (native/hydra_rpc_guard.cpp); each is
 * optional and keeps its default when absent. Sizes in bytes, times in milliseconds.
 */
export interface NativeServeLimits {
  /** Bytes all live buffers of the session may hold (default: GPU total memory; CPU half the host's). */
  maxAllocBytes?: number;
  /** Largest buffered message, i.e. GRAPH_COMPUTE (default 64 MiB). */
  maxMessageBytes?: number;
  /** Nodes of one graph (default 32768). */
  maxGraphNodes?: number;
  /** Tensors of one graph (default 131072). */
  maxGraphTensors?: number;
  /** Longest chain of tensor sources in one graph (default 16384). */
  maxGraphDepth?: number;
  /** Live buffers of the session (default 1024). */
  maxBuffers?: number;
  /** From the session's start to a complete HELLO (default 10000). */
  helloTimeoutMs?: number;
  /** Without progress inside a message, either direction (default 30000). */
  stallTimeoutMs?: number;
  /** Between messages while the session holds no buffer (default 60000; 0: never). */
  idleTimeoutMs?: number;
}

export interface NativeServeSummary {
  commands: number;
  setTensorBytes: number;
  setTensorHashHits: number;
  bytesIn: number;
  bytesOut: number;
  durationMs: number;
  devices: string[];
  /** An upstream assert or exception that ended the session. */
  error?: string;
  /** How the session ended: the client left, the guard refused a message, a timeout, or upstream ended it. */
  ended: 'client' | 'refused' | 'timeout' | 'server';
  /** Why, when `ended` is 'refused' or 'timeout'. */
  reason?: string;
  /** The refused command's name, when `ended` is 'refused'. */
  refusedCommand?: string;
  /** Messages refused, the session-ending one and denied allocations included. */
  refusals: number;
  /** Client messages the guard relayed or answered, HELLO included: 0 means no HELLO was answered. */
  messages: number;
  /** ALLOC_BUFFER requests answered as failed because of maxAllocBytes or maxBuffers. */
  allocDenied: number;
  /** Most bytes the session's live buffers held at once. */
  allocBytesPeak: number;
}

/** The flat surface of hydra_ggml.node. */
/** One buffer type of llama.cpp's memory breakdown (llama_get_memory_breakdown), in bytes. */
export interface ContextMemoryRow {
  bufferType: string;
  /** The buffer type's device (`CUDA0`, `RPC0`, `CPU`), or null when it has none. */
  device: string | null;
  /** Whether the buffer lives in host memory (a pinned `CUDA_Host` buffer names a CUDA device). */
  host: boolean;
  /** Weights. */
  model: number;
  /** KV cache and recurrent state. */
  context: number;
  compute: number;
}

export interface NativeBinding {
  backendInit(logLevel?: number): {
    systemInfo: string;
    rpcProtoMajor: number;
    supportsGpuOffload: boolean;
    supportsMmap: boolean;
    maxDevices: number;
  };
  /** _exit(code): no static destructors, so a decode running on another thread cannot crash the exit. */
  exitNow(code: number): never;
  devicesList(): NativeDevice[];
  /** The named devices (memory included) described on a detached thread; see devicesDescribe in hydra_addon.cpp. */
  devicesDescribe(names: string[]): Promise<NativeDevice[]>;
  rpcServerAdd(endpoint: string): Promise<NativeDevice[]>;
  modelLoad(
    params: NativeModelParams,
    onProgress?: (progress: number) => void,
  ): { promise: Promise<ModelHandle>; cancel(): void };
  modelInfo(model: ModelHandle): NativeModelInfo;
  modelFree(model: ModelHandle): void;
  tokenIsEog(model: ModelHandle, token: number): boolean;
  tokenize(model: ModelHandle, text: string, addSpecial: boolean, parseSpecial: boolean): Int32Array;
  tokenToPiece(model: ModelHandle, token: number, special: boolean): Buffer;
  detokenize(model: ModelHandle, tokens: Int32Array, removeSpecial: boolean, unparseSpecial: boolean): string;
  chatApplyTemplate(
    model: ModelHandle,
    messages: { role: string; content: string }[],
    addAssistant: boolean,
    template?: string,
  ): string;
  tokenizeAsync(
    model: ModelHandle,
    text: string,
    addSpecial: boolean,
    parseSpecial: boolean,
    upstream?: boolean,
  ): Promise<Int32Array>;
  chatApplyTemplateAsync(
    model: ModelHandle,
    roles: string[],
    contents: string[],
    addAssistant: boolean,
    template?: string,
  ): Promise<string>;
  chatApplyTemplatePackedAsync(
    model: ModelHandle,
    packed: Uint8Array,
    addAssistant: boolean,
    template?: string,
  ): Promise<string>;
  chatTokenizePackedAsync(
    model: ModelHandle,
    packed: Uint8Array,
    addAssistant: boolean,
    template: string | undefined,
    addSpecial: boolean,
    parseSpecial: boolean,
  ): Promise<Int32Array>;
  /** Why `draft` cannot draft for `target` (upstream's vocab compatibility check), or "". */
  draftVocabMismatch(target: ModelHandle, draft: ModelHandle): string;
  /** One of upstream's n-gram drafters for `nSeq` sequences (hydra_ngram.cpp). */
  ngramCreate(type: NgramDrafterType, params: NgramDrafterParams, nSeq: number): NgramHandle;
  ngramFree(h: NgramHandle): void;
  ngramBegin(h: NgramHandle, seq: number, prompt: Int32Array): void;
  ngramDraft(h: NgramHandle, seq: number, history: Int32Array, limit: number): Int32Array;
  ngramAccept(h: NgramHandle, seq: number, nAccepted: number): void;
  /** Feeds each entry's tokens to the draft context, then drafts greedily (hydra_draft.cpp). */
  draftGenerate(
    ctx: ContextHandle,
    entries: { seq: number; pos: number; tokens: Int32Array; nMax: number }[],
    nMin: number,
    pMin: number,
  ): Promise<{ tokens: Int32Array; fed: number }[]>;
  contextCreate(model: ModelHandle, params: NativeContextParams): Promise<ContextHandle>;
  contextFree(ctx: ContextHandle): void;
  contextInfo(ctx: ContextHandle): {
    nCtx: number;
    nCtxSeq: number;
    nBatch: number;
    nUbatch: number;
    nSeqMax: number;
    nRsSeq: number;
    nThreads: number;
    nThreadsBatch: number;
  };
  contextMemory(ctx: ContextHandle): ContextMemoryRow[];
  samplerCreate(model: ModelHandle, params: NativeSamplerParams): SamplerHandle;
  samplerFree(sampler: SamplerHandle): void;
  samplerAccept(sampler: SamplerHandle, tokens: Int32Array): void;
  /** The chain's stages as llama.cpp names them (llama_sampler_name). */
  samplerNames(sampler: SamplerHandle): string[];
  /** GBNF for a JSON schema given as JSON text (common's json_schema_to_grammar). */
  jsonSchemaToGrammar(schema: string): string;
  /** common_chat_templates_apply over an OpenAI chat body (JSON text); resolves JSON text. */
  chatCommonApplyAsync(
    model: ModelHandle,
    templateOverride: string,
    body: string,
    options: string,
    messagesJson?: Uint8Array,
    tokenize?: boolean,
  ): Promise<string | { json: string; tokens: Int32Array }>;
  /** common_chat_parse of generated text; arguments and result as JSON text. */
  chatCommonParseAsync(args: string): Promise<string>;
  decodeStep(
    ctx: ContextHandle,
    entries: NativeDecodeEntry[],
  ): Promise<{
    tokens: Int32Array;
    logits: (Float32Array | null)[];
    runs?: (Int32Array | null)[];
    probs?: (NativeTokenProbs | null)[];
    checkpoints?: (Buffer | null)[];
  }>;
  memorySeqRm(ctx: ContextHandle, seq: number, p0: number, p1: number): boolean;
  memorySeqAdd(ctx: ContextHandle, seq: number, p0: number, p1: number, delta: number): void;
  memoryCanShift(ctx: ContextHandle): boolean;
  memorySeqCp(ctx: ContextHandle, src: number, dst: number, p0: number, p1: number): void;
  memorySeqPosMax(ctx: ContextHandle, seq: number): number;
  memoryClear(ctx: ContextHandle): void;
  /** Evaluates each input in its own sequence in one llama_decode; pooled (normalized) or per-token rows. */
  embedBatch(
    ctx: ContextHandle,
    entries: { seq: number; tokens: Int32Array }[],
    normalize: number,
  ): Promise<Float32Array[]>;
  embedInfo(ctx: ContextHandle): NativeEmbedInfo;
  stateSeqGet(ctx: ContextHandle, seq: number, options?: { partial?: boolean }): Promise<Buffer>;
  stateSeqSet(
    ctx: ContextHandle,
    seq: number,
    data: Uint8Array,
    options?: { partial?: boolean },
  ): Promise<number>;
  peekFirstByte(fd: number, timeoutMs: number): Promise<number>;
  detachFd(fd: number): number;
  fdClose(fd: number): void;
  fdShutdown(fd: number): void;
  /** The kernel's byte counters of a TCP socket ([received, acked]); undefined for another fd. */
  fdTcpBytes(fd: number): [bytesIn: number, bytesOut: number] | undefined;
  serveRpcFd(
    fd: number,
    options: { devices?: string[]; threads?: number; cacheDir?: string } & NativeServeLimits,
    stats?: BigUint64Array,
  ): NativeServeSummary;
  rpcWeightsIndexAdd(path: string): Promise<NativeWeightsIndexAdded>;
  rpcWeightsIndexInfo(): NativeWeightsIndexInfo;
  rpcAbortParkInstall(): boolean;
  rpcParkedInfo(): { parked: number; last: string };
  /** Wraps the backend tables of every device registered so far (idempotent); returns how many were new. */
  rpcAccountingInstall(): number;
  rpcAccounting(): NativeRpcAccounting;
}

/** The ggml-RPC client commands a head counts per peer (one upstream client call each). */
export type RpcCommandName =
  | 'set_tensor'
  | 'set_tensor_hash'
  | 'get_tensor'
  | 'copy_tensor'
  | 'graph_compute'
  | 'graph_recompute'
  | 'memset_tensor'
  | 'buffer_clear'
  | 'init_tensor'
  | 'alloc_buffer';

/** The kernel's TCP_INFO of the socket upstream's dispatcher holds for a peer. */
export interface NativeRpcTcp {
  fd: number;
  bytesSent: number;
  bytesAcked: number;
  bytesReceived: number;
  segsOut: number;
  segsIn: number;
  dataSegsOut: number;
  dataSegsIn: number;
  /** The kernel's smoothed round-trip time, its variance and its minimum (microseconds). */
  rttUs: number;
  rttVarUs: number;
  minRttUs: number;
  retransmits: number;
}

/** One peer's cumulative client-side figures since the accounting was installed. */
export interface NativeRpcPeerAccounting {
  endpoint: string;
  commands: Record<RpcCommandName, number>;
  /** Payload bytes per command (offered for sets, asked for by gets, buffer size for allocs). */
  commandBytes: Record<RpcCommandName, number>;
  /** Commands the server answers (the client reads a reply before its next command). */
  roundTrips: number;
  /** backend synchronize and event_synchronize calls. */
  syncs: number;
  /** Nodes of the graphs sent (or recomputed) on the peer. */
  graphNodes: number;
  /** Time calling threads were blocked waiting for a reply (or for everything queued before one). */
  waitReplyMs: number;
  waitReplyCalls: number;
  /** Time calling threads were blocked until a command without a reply was written. */
  waitSendMs: number;
  waitSendCalls: number;
  /** Time serializing graphs (graph_compute, queued, not waited for). */
  serializeMs: number;
  /** Time queueing async sets and gets (a set's payload copy included). */
  enqueueMs: number;
  /** null until upstream's dispatcher socket for the peer exists. */
  tcp: NativeRpcTcp | null;
}

/** A local device's graph compute and synchronize time (sessions served for peers excluded). */
export interface NativeLocalAccounting {
  device: string;
  computes: number;
  computeMs: number;
  syncs: number;
  syncMs: number;
}

export interface NativeRpcAccounting {
  peers: NativeRpcPeerAccounting[];
  local: NativeLocalAccounting[];
}

/** One GGUF added to the ggml-RPC weights index. */
export interface NativeWeightsIndexAdded {
  /** The real path. */
  file: string;
  tensors: number;
  /** Tensors above upstream's hash threshold (10 MiB), newly indexed. */
  indexed: number;
  bytes: number;
  ms: number;
  /** The file was indexed before; nothing was done. */
  already: boolean;
}

export interface NativeWeightsIndexInfo {
  files: string[];
  tensors: number;
  bytes: number;
  /** SET_TENSOR_HASH requests answered from the index, in every session so far. */
  hits: number;
}

const packageDir = join(dirname(fileURLToPath(import.meta.url)), '..');

/** Where the loader looks, in order. */
export function addonCandidates(): string[] {
  // An explicit choice is the only candidate: falling back behind the user's back would hide a
  // broken CUDA install behind a slow CPU engine.
  const fromEnv = process.env.HYDRA_NATIVE_ADDON;
  if (fromEnv) return [fromEnv];
  return [
    join(packageDir, 'build-cuda', 'bin', 'hydra_ggml.node'),
    join(packageDir, 'build', 'bin', 'hydra_ggml.node'),
  ];
}

let loaded: { binding: NativeBinding; path: string } | undefined;

/** Loads the addon once per thread; throws `HYDRA_ERR_NATIVE_MISSING` listing what was tried. */
export function loadBinding(): { binding: NativeBinding; path: string } {
  if (loaded) return loaded;
  const require = createRequire(import.meta.url);
  const tried: string[] = [];
  for (const candidate of addonCandidates()) {
    if (!existsSync(candidate)) {
      tried.push(`${candidate} (missing)`);
      continue;
    }
    try {
      const binding = require(candidate) as NativeBinding;
      loaded = { binding, path: candidate };
      return loaded;
    } catch (err) {
      tried.push(`${candidate} (${(err as Error).message.split('\n')[0]})`);
    }
  }
  throw new HydraError(
    'HYDRA_ERR_NATIVE_MISSING',
    `the hydra_ggml native addon could not be loaded. Tried:\n  ${tried.join('\n  ')}\n` +
      'Build it with `pnpm --filter @hydra-engine/native-ggml build` (CPU) or with HYDRA_CUDA=1 for CUDA.',
    { details: { tried } },
  );
}
