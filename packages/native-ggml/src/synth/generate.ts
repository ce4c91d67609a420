import { mkdir, open, rename, rm } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { HydraError } from '../errors.js';
import {
  encodeGgufHeader,
  GGML_TYPE_TRAITS,
  GGUF_ALIGNMENT,
  GgmlType,
  type GgufValue,
  padTo,
  tensorElements,
} from './gguf.js';
import { DECAY_F32, NORM_GAIN_F32, type WeightTables, weightTables, Xorshift128 } from './random.js';
import {
  FILE_TYPE,
  ggufArchName,
  SYNTH_ARCHS,
  SYNTH_QUANTS,
  SYNTH_SHAPES,
  type SynthArch,
  type SynthHparams,
  type SynthQuant,
  type SynthShape,
  type SynthTensor,
  synthHparams,
  synthTensors,
} from './shapes.js';
import {
  BOS_ID,
  buildVocabulary,
  CHATML_TEMPLATE,
  EOS_ID,
  TOOLS_TEMPLATE,
  UNK_ID,
  withFimTokens,
  withToolCallTokens,
} from './vocab.js';

/** Progress of {@link writeSyntheticModel}, reported after each chunk reaches the file. */
export interface SynthProgress {
  bytesWritten: number;
  totalBytes: number;
  tensorsDone: number;
  tensorCount: number;
}

/** Options of {@link writeSyntheticModel}. */
export interface SynthModelOptions {
  /**
   * `llama` (dense), `moe` (llama arch with 8 experts, 2 used), `qwen35` (hybrid gated delta-net +
   * full attention every 4th block) or `qwen35moe` (the same with routed and shared experts).
   */
  arch: SynthArch;
  shape: SynthShape;
  /** Type of the 2-D weight tensors; norms and the MoE router are always f32. */
  quant: SynthQuant;
  /** Unsigned 32-bit seed; the same options always give a byte-identical file. */
  seed: number;
  /** Output path; written as `<out>.partial` and renamed when complete. */
  out: string;
  onProgress?: (progress: SynthProgress) => void;
  /**
   * `chatml` (default): the plain chatml template. `tools`: {@link TOOLS_TEMPLATE}, `<tool_call>` and
   * `</tool_call>` as user-defined tokens (the vocabulary's last two ids), and no space
   * prefix after special tokens (add_space_prefix false), so that text right after
   * `<|im_start|>` tokenizes as written, as in BPE chat models: a tool-call grammar that starts
   * with the generation prompt then accepts the tokens the prompt ends with.
   */
  chat?: 'chatml' | 'tools';
  /**
   * Fill-in-the-middle tokens (`/infill`): the vocabulary's ids n-5..n-3 become Qwen 2.5 Coder's
   * `<|fim_prefix|>`, `<|fim_suffix|>`, `<|fim_middle|>` control tokens, named by the GGUF's
   * `tokenizer.ggml.fim_{pre,suf,mid}_token_id`. Off: the file is byte for byte as before.
   */
  fim?: boolean;
  /**
   * `rank`: a Qwen3-style reranker, the decoder arch the pinned loader gives a classification head
   * (`general.architecture = qwen3`: the dense llama layout plus per-head `attn_q_norm` /
   * `attn_k_norm`, and a `cls.output.weight` head over the labels yes/no, the loader's cls_out),
   * for rank pooling. Dense `llama` arch only.
   */
  head?: 'rank';
  /**
   * A speculative-decoding target (dense or MoE `llama` arch): this many blocks after the shape's
   * own, whose `attn_output` and `ffn_down` weights have `extraScale` times the usual deviation.
   * The shape's blocks, embeddings and head keep the bytes of the plain model with the same seed,
   * so that plain model is its draft and `extraScale` sets how often the two agree (SYNTH.md).
   */
  extraLayers?: number;
  /** Deviation of the extra blocks' output projections, as a multiple of weightStd (default 0). */
  extraScale?: number;
}

/** What {@link writeSyntheticModel} wrote. */
export interface SynthModelResult {
  path: string;
  /** File size in bytes. */
  bytes: number;
  nParams: number;
  /** Number of tensors in the file. */
  tensors: number;
  arch: SynthArch;
  shape: SynthShape;
  quant: SynthQuant;
  seed: number;
  hparams: SynthHparams;
  /** Bytes of the header (metadata, tensor infos, padding). */
  headerBytes: number;
  seconds: number;
  bytesPerSecond: number;
}

const CHUNK_BYTES = 16 << 20;
// Pieces have a fixed size per tensor so the random stream, and so the file, never depends on
// where chunk boundaries fall.
const PIECE_ELEMS = 1 << 18;

function badArgument(key: string, message: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_ARGUMENT', message, { keys: [key] });
}

function validateModel(options: Pick<SynthModelOptions, 'arch' | 'shape' | 'quant'>): void {
  if (typeof options !== 'object' || options === null) {
    throw badArgument('options', 'options must be an object');
  }
  if (!(SYNTH_ARCHS as readonly string[]).includes(options.arch)) {
    throw badArgument('arch', `options.arch must be one of ${SYNTH_ARCHS.join(', ')}`);
  }
  if (!(SYNTH_SHAPES as readonly string[]).includes(options.shape)) {
    throw badArgument('shape', `options.shape must be one of ${SYNTH_SHAPES.join(', ')}`);
  }
  if (!(SYNTH_QUANTS as readonly string[]).includes(options.quant)) {
    throw badArgument('quant', `options.quant must be one of ${SYNTH_QUANTS.join(', ')}`);
  }
  synthHparams(options.arch, options.shape);
}

function validate(options: SynthModelOptions): void {
  validateModel(options);
  if (!Number.isInteger(options.seed) || options.seed < 0 || options.seed > 0xffffffff) {
    throw badArgument('seed', 'options.seed must be an integer in [0, 4294967295]');
  }
  if (typeof options.out !== 'string' || options.out.length === 0) {
    throw badArgument('out', 'options.out must be a non-empty path');
  }
  if (options.onProgress !== undefined && typeof options.onProgress !== 'function') {
    throw badArgument('onProgress', 'options.onProgress must be a function');
  }
  if (options.chat !== undefined && options.chat !== 'chatml' && options.chat !== 'tools') {
    throw badArgument('chat', "options.chat must be 'chatml' or 'tools'");
  }
  if (options.fim !== undefined && typeof options.fim !== 'boolean')
    throw badArgument('fim', 'options.fim must be a boolean');
  if (options.head !== undefined && (options.head !== 'rank' || options.arch !== 'llama')) {
    throw badArgument('head', "options.head must be 'rank', with arch 'llama'");
  }
  const extra = options.extraLayers;
  if (extra !== undefined) {
    if (!Number.isInteger(extra) || extra < 0 || extra > 256)
      throw badArgument('extraLayers', 'options.extraLayers must be an integer in [0, 256]');
    if ((options.arch !== 'llama' && options.arch !== 'moe') || options.head !== undefined)
      throw badArgument('extraLayers', "options.extraLayers needs arch 'llama' or 'moe' and no head");
  }
  if (options.extraScale !== undefined) {
    if (!(extra! > 0)) throw badArgument('extraScale', 'options.extraScale needs options.extraLayers > 0');
    if (!Number.isFinite(options.extraScale) || options.extraScale < 0 || options.extraScale > 16)
      throw badArgument('extraScale', 'options.extraScale must be a number in [0, 16]');
  }
}

/**
 * The target of a synthetic speculative pair: `base` with `extra` more blocks whose output
 * projections are scaled by `scale`, and per tensor the random stream it would have in `base`
 * (the extra blocks' streams follow), so the shared tensors are byte for byte the draft's.
 */
function withExtraBlocks(
  base: SynthHparams,
  quant: SynthQuant,
  extra: number,
  scale: number,
): { hparams: SynthHparams; tensors: SynthTensor[]; streams: number[] } {
  const hparams = { ...base, nLayer: base.nLayer + extra };
  const own = new Map(synthTensors(base, quant).map((t, i) => [t.name, i]));
  let next = own.size;
  const tensors = synthTensors(hparams, quant).map((t) => {
    const m = /^blk\.(\d+)\.(attn_output|ffn_down|ffn_down_exps)\.weight$/.exec(t.name);
    return m && Number(m[1]) >= base.nLayer ? { ...t, std: base.weightStd * scale } : t;
  });
  const streams = tensors.map((t) => own.get(t.name) ?? next++);
  return { hparams, tensors, streams };
}

function metadata(
  arch: SynthArch,
  shape: SynthShape,
  quant: SynthQuant,
  seed: number,
  h: SynthHparams,
  chat: 'chatml' | 'tools' = 'chatml',
  head?: 'rank',
  fim = false,
): Array<[string, GgufValue]> {
  const plain = chat === 'tools' ? withToolCallTokens(buildVocabulary(h.nVocab)) : buildVocabulary(h.nVocab);
  const withFim = fim ? withFimTokens(plain) : undefined;
  const vocab = withFim?.vocab ?? plain;
  const a = head === 'rank' ? 'qwen3' : ggufArchName(arch);
  const y = h.hybrid;
  const kv: Array<[string, GgufValue]> = [
    ['general.architecture', { type: 'str', value: a }],
    ['general.type', { type: 'str', value: 'model' }],
    ['general.name', { type: 'str', value: `hydra-synth-${arch}-${shape}-${quant}` }],
    ['general.description', { type: 'str', value: 'synthetic random weights (hydra-engine synth-model)' }],
    // A fixed-width value: the header, and so every offset, does not depend on the seed.
    ['hydra.synth.seed', { type: 'u32', value: seed }],
    ['general.file_type', { type: 'u32', value: FILE_TYPE[quant] }],
    ['general.quantization_version', { type: 'u32', value: 2 }],
    ['general.alignment', { type: 'u32', value: GGUF_ALIGNMENT }],
    [`${a}.vocab_size`, { type: 'u32', value: h.nVocab }],
    [`${a}.context_length`, { type: 'u32', value: h.nCtxTrain }],
    [`${a}.embedding_length`, { type: 'u32', value: h.nEmbd }],
    [`${a}.block_count`, { type: 'u32', value: h.nLayer }],
    [`${a}.feed_forward_length`, { type: 'u32', value: h.nFf }],
    [`${a}.rope.dimension_count`, { type: 'u32', value: y ? y.nRot : h.nEmbd / h.nHead }],
    [`${a}.attention.head_count`, { type: 'u32', value: h.nHead }],
    [`${a}.attention.head_count_kv`, { type: 'u32', value: h.nHeadKv }],
    [`${a}.attention.layer_norm_rms_epsilon`, { type: 'f32', value: h.rmsEps }],
    [`${a}.rope.freq_base`, { type: 'f32', value: h.ropeFreqBase }],
  ];
  if (head === 'rank') kv.push([`${a}.classifier.output_labels`, { type: 'arr_str', value: RANK_LABELS }]);
  if (h.nExpert > 0) {
    kv.push([`${a}.expert_count`, { type: 'u32', value: h.nExpert }]);
    kv.push([`${a}.expert_used_count`, { type: 'u32', value: h.nExpertUsed }]);
  }
  if (y !== undefined) {
    kv.push(
      [`${a}.attention.key_length`, { type: 'u32', value: y.headDim }],
      [`${a}.attention.value_length`, { type: 'u32', value: y.headDim }],
      [`${a}.rope.dimension_sections`, { type: 'arr_i32', value: Int32Array.from(y.ropeSections) }],
      [`${a}.full_attention_interval`, { type: 'u32', value: y.fullAttentionInterval }],
      [`${a}.ssm.conv_kernel`, { type: 'u32', value: y.ssmDConv }],
      [`${a}.ssm.state_size`, { type: 'u32', value: y.ssmDState }],
      [`${a}.ssm.group_count`, { type: 'u32', value: y.ssmNGroup }],
      [`${a}.ssm.time_step_rank`, { type: 'u32', value: y.ssmDtRank }],
      [`${a}.ssm.inner_size`, { type: 'u32', value: y.ssmDInner }],
    );
    if (h.nExpert > 0) {
      kv.push(
        [`${a}.expert_feed_forward_length`, { type: 'u32', value: h.nFf }],
        [`${a}.expert_shared_feed_forward_length`, { type: 'u32', value: y.nFfShexp }],
      );
    }
  }
  kv.push(
    ['tokenizer.ggml.model', { type: 'str', value: 'llama' }],
    ['tokenizer.ggml.pre', { type: 'str', value: 'default' }],
    ['tokenizer.ggml.tokens', { type: 'arr_str', value: vocab.tokens }],
    ['tokenizer.ggml.scores', { type: 'arr_f32', value: vocab.scores }],
    ['tokenizer.ggml.token_type', { type: 'arr_i32', value: vocab.types }],
    ['tokenizer.ggml.bos_token_id', { type: 'u32', value: BOS_ID }],
    ['tokenizer.ggml.eos_token_id', { type: 'u32', value: EOS_ID }],
    ['tokenizer.ggml.unknown_token_id', { type: 'u32', value: UNK_ID }],
    ['tokenizer.ggml.add_bos_token', { type: 'bool', value: true }],
    ['tokenizer.ggml.add_eos_token', { type: 'bool', value: false }],
    ['tokenizer.chat_template', { type: 'str', value: chat === 'tools' ? TOOLS_TEMPLATE : CHATML_TEMPLATE }],
  );
  if (chat === 'tools') kv.push(['tokenizer.ggml.add_space_prefix', { type: 'bool', value: false }]);
  if (withFim) {
    const [pre, suf, mid] = withFim.ids;
    kv.push(
      ['tokenizer.ggml.fim_pre_token_id', { type: 'u32', value: pre }],
      ['tokenizer.ggml.fim_suf_token_id', { type: 'u32', value: suf }],
      ['tokenizer.ggml.fim_mid_token_id', { type: 'u32', value: mid }],
    );
  }
  return kv;
}

/**
 * Generates the next `elems` elements of a tensor (a multiple of its block size, and even) straight
 * into `out` at `offset` (4-byte aligned), returning their byte count. Quantized pieces may write
 * up to 3 bytes of scratch past that count, which the next piece or the padding overwrites.
 */
function fillPiece(
  rng: Xorshift128,
  weights: WeightTables,
  tensor: SynthTensor,
  elems: number,
  rand: Uint32Array,
  out: ArrayBuffer,
  offset: number,
): number {
  switch (tensor.type) {
    case GgmlType.F32: {
      const table =
        tensor.fill === 'norm' ? NORM_GAIN_F32 : tensor.fill === 'decay' ? DECAY_F32 : weights.f32;
      const dst = new Float32Array(out, offset, elems);
      const n = elems >>> 1;
      rng.fill(rand, n);
      for (let i = 0; i < n; i++) {
        const r = rand[i]!;
        dst[2 * i] = table[r & 0xffff]!;
        dst[2 * i + 1] = table[r >>> 16]!;
      }
      return elems * 4;
    }
    case GgmlType.F16: {
      const dst = new Uint16Array(out, offset, elems);
      const table = weights.f16;
      const n = elems >>> 1;
      rng.fill(rand, n);
      for (let i = 0; i < n; i++) {
        const r = rand[i]!;
        dst[2 * i] = table[r & 0xffff]!;
        dst[2 * i + 1] = table[r >>> 16]!;
      }
      return elems * 2;
    }
    case GgmlType.Q8_0:
    case GgmlType.Q4_0: {
      // Uniform random quants under a fixed, valid f16 scale magnitude. The scale's sign is a
      // random bit (the byte it overwrites): q4_0 nibbles minus 8 span [-8, 7], whose mean of
      // -0.5 would otherwise give every weight matrix a rank-one bias.
      const { typeSize, blockSize } = GGML_TYPE_TRAITS[tensor.type];
      const scale = tensor.type === GgmlType.Q8_0 ? weights.q8_0Scale : weights.q4_0Scale;
      const lo = scale & 0xff;
      const hi = scale >>> 8;
      const blocks = elems / blockSize;
      const size = blocks * typeSize;
      const words = Math.ceil(size / 4);
      rng.fill(new Uint32Array(out, offset, words), words);
      const dst = new Uint8Array(out, offset, size);
      for (let b = 0, o = 0; b < blocks; b++, o += typeSize) {
        const sign = (dst[o]! & 1) << 7;
        dst[o] = lo;
        dst[o + 1] = hi | sign;
      }
      return size;
    }
  }
  throw new Error(`unsupported tensor type ${tensor.type}`);
}

/** Double-buffered sequential writer: one chunk is filled while the previous one is written. */
class ChunkWriter {
  readonly #fh: Awaited<ReturnType<typeof open>>;
  readonly #bufs = [new ArrayBuffer(CHUNK_BYTES), new ArrayBuffer(CHUNK_BYTES)];
  #cur = 0;
  #pos = 0;
  #fileOffset: number;
  #pending: Promise<unknown> | null = null;
  readonly #onFlush: (bytesWritten: number) => void;

  constructor(
    fh: Awaited<ReturnType<typeof open>>,
    startOffset: number,
    onFlush: (bytesWritten: number) => void,
  ) {
    this.#fh = fh;
    this.#fileOffset = startOffset;
    this.#onFlush = onFlush;
  }

  /** Room for `n` more bytes in the current chunk (flushing first when needed). */
  async reserve(n: number): Promise<void> {
    if (this.#pos + n > CHUNK_BYTES) await this.flush();
  }

  /** The current chunk and the offset where the next bytes go. */
  get buffer(): ArrayBuffer {
    return this.#bufs[this.#cur]!;
  }

  get pos(): number {
    return this.#pos;
  }

  advance(n: number): void {
    this.#pos += n;
  }

  zeros(n: number): void {
    new Uint8Array(this.buffer, this.#pos, n).fill(0);
    this.#pos += n;
  }

  async flush(): Promise<void> {
    if (this.#pos === 0) return;
    if (this.#pending) await this.#pending;
    const length = this.#pos;
    const position = this.#fileOffset;
    this.#fileOffset += length;
    const pending = this.#fh
      .write(new Uint8Array(this.buffer, 0, length), 0, length, position)
      .then(() => this.#onFlush(position + length));
    // Marks a failed write as handled until the next flush or close awaits it and rethrows.
    pending.catch(() => undefined);
    this.#pending = pending;
    this.#cur ^= 1;
    this.#pos = 0;
  }

  async close(): Promise<void> {
    await this.flush();
    if (this.#pending) await this.#pending;
    this.#pending = null;
  }
}

/** The size of a synthetic model, known before writing it. */
export interface SynthModelPlan {
  bytes: number;
  headerBytes: number;
  nParams: number;
  tensors: number;
  hparams: SynthHparams;
}

/**
 * The reranker's labels, as Qwen3-Reranker GGUFs carry them: llama.cpp applies a softmax over them
 * for qwen3, so the score (the first) is P(yes); with one label it would always be 1.
 */
const RANK_LABELS = ['yes', 'no'];

/**
 * The llama tensors plus what LLM_ARCH_QWEN3 (src/models/qwen3.cpp) adds: q/k RMS norms over one
 * head in every block, and the `cls.output` head (cls_out: n_embd x 2 labels, f32) of rank pooling.
 */
function withRankHead(tensors: SynthTensor[], h: SynthHparams): SynthTensor[] {
  const headDim = h.nEmbd / h.nHead;
  const out: SynthTensor[] = [];
  for (const t of tensors) {
    out.push(t);
    const m = /^blk\.(\d+)\.attn_v\.weight$/.exec(t.name);
    if (m) {
      out.push({ name: `blk.${m[1]}.attn_q_norm.weight`, dims: [headDim], type: GgmlType.F32, fill: 'norm' });
      out.push({ name: `blk.${m[1]}.attn_k_norm.weight`, dims: [headDim], type: GgmlType.F32, fill: 'norm' });
    }
  }
  out.push({
    name: 'cls.output.weight',
    dims: [h.nEmbd, RANK_LABELS.length],
    type: GgmlType.F32,
    fill: 'weight',
  });
  return out;
}

/** Computes the file size and parameter count {@link writeSyntheticModel} would produce. */
export function planSyntheticModel(
  options: Pick<SynthModelOptions, 'arch' | 'shape' | 'quant'>,
): SynthModelPlan {
  validateModel(options);
  const hparams = synthHparams(options.arch, options.shape);
  const tensors = synthTensors(hparams, options.quant);
  const layout = encodeGgufHeader(metadata(options.arch, options.shape, options.quant, 0, hparams), tensors);
  return {
    bytes: layout.header.length + layout.dataBytes,
    headerBytes: layout.header.length,
    nParams: tensors.reduce((n, t) => n + tensorElements(t.dims), 0),
    tensors: tensors.length,
    hparams,
  };
}

/**
 * Writes a random-weight GGUF v3 model with the upstream llama (or qwen35 / qwen35moe) tensor layout, a SentencePiece
 * vocabulary with byte fallback, and a chatml template. Streams in 16 MiB chunks, so even the
 * 27B shape needs only a few tens of MB of memory.
 */
export async function writeSyntheticModel(options: SynthModelOptions): Promise<SynthModelResult> {
  validate(options);
  const { arch, shape, quant, seed, onProgress } = options;
  const path = resolve(options.out);
  const started = performance.now();
  const base = synthHparams(arch, shape);
  const pair =
    (options.extraLayers ?? 0) > 0
      ? withExtraBlocks(base, quant, options.extraLayers!, options.extraScale ?? 0)
      : undefined;
  const hparams = pair?.hparams ?? base;
  const tensors =
    pair?.tensors ??
    (options.head === 'rank'
      ? withRankHead(synthTensors(hparams, quant), hparams)
      : synthTensors(hparams, quant));
  const layout = encodeGgufHeader(
    metadata(arch, shape, quant, seed, hparams, options.chat, options.head, options.fim),
    tensors,
  );
  const totalBytes = layout.header.length + layout.dataBytes;
  const partial = `${path}.partial`;

  try {
    await mkdir(dirname(path), { recursive: true });
  } catch (cause) {
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `cannot create the folder of ${path}`, {
      keys: ['out'],
      cause,
    });
  }
  let fh: Awaited<ReturnType<typeof open>>;
  try {
    fh = await open(partial, 'w');
  } catch (cause) {
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `cannot write ${partial}`, { keys: ['out'], cause });
  }

  let tensorsDone = 0;
  let nParams = 0;
  try {
    await fh.write(layout.header, 0, layout.header.length, 0);
    const writer = new ChunkWriter(fh, layout.header.length, (bytesWritten) =>
      onProgress?.({ bytesWritten, totalBytes, tensorsDone, tensorCount: tensors.length }),
    );
    const rand = new Uint32Array(PIECE_ELEMS / 2);
    for (let t = 0; t < tensors.length; t++) {
      const tensor = tensors[t]!;
      const weights = weightTables(tensor.std ?? hparams.weightStd);
      const rng = new Xorshift128(seed, pair ? pair.streams[t]! : t);
      const total = tensorElements(tensor.dims);
      const bytesPerPiece =
        (PIECE_ELEMS / GGML_TYPE_TRAITS[tensor.type].blockSize) * GGML_TYPE_TRAITS[tensor.type].typeSize;
      nParams += total;
      let written = 0;
      for (let done = 0; done < total; ) {
        const elems = Math.min(PIECE_ELEMS, total - done);
        await writer.reserve(bytesPerPiece + 4);
        const n = fillPiece(rng, weights, tensor, elems, rand, writer.buffer, writer.pos);
        writer.advance(n);
        written += n;
        done += elems;
      }
      const padding = padTo(written, GGUF_ALIGNMENT) - written;
      await writer.reserve(padding);
      writer.zeros(padding);
      tensorsDone = t + 1;
    }
    await writer.close();
    await fh.close();
    await rename(partial, path);
  } catch (cause) {
    await fh.close().catch(() => undefined);
    await rm(partial, { force: true }).catch(() => undefined);
    if (cause instanceof HydraError) throw cause;
    throw new HydraError('HYDRA_ERR_INTERNAL', `writing ${path} failed: ${(cause as Error).message}`, {
      cause,
    });
  }

  const seconds = (performance.now() - started) / 1000;
  return {
    path,
    bytes: totalBytes,
    nParams,
    tensors: tensors.length,
    arch,
    shape,
    quant,
    seed,
    hparams,
    headerBytes: layout.header.length,
    seconds,
    bytesPerSecond: totalBytes / Math.max(seconds, 1e-9),
  };
}
