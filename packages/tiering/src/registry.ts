/**
 * The common_params field registry: every field a CONFIGURE may name (docs/protocol.md), with the
 * rebuild tier its change costs, keyed by its canonical wire name.
 */

/** Rebuild tiers from the cheapest; T4 is start-only and rejected at run time. */
export type Tier = 'T1' | 'T2' | 'T3' | 'T4';

/** How a field reaches llama.cpp: sampler re-init, context params, model params, or engine setting. */
export type Via = 'sampler' | 'context' | 'model' | 'engine';

/** The value type of a field, with its bounds or enumeration. */
export type FieldType =
  | { readonly kind: 'int'; readonly min: number; readonly max: number }
  | { readonly kind: 'number'; readonly min: number; readonly max: number }
  | { readonly kind: 'bool' }
  | { readonly kind: 'string'; readonly maxLength: number; readonly pattern?: RegExp }
  | { readonly kind: 'enum'; readonly values: readonly string[] }
  | { readonly kind: 'list'; readonly of: FieldType; readonly maxItems: number }
  | { readonly kind: 'map'; readonly of: FieldType; readonly maxEntries: number }
  /** The string `"auto"` (the engine's planner chooses) or a value of `of`. */
  | { readonly kind: 'auto'; readonly of: FieldType };

/** One registry entry. */
export interface FieldSpec {
  /** Canonical key: snake_case, dotted for sub-structs (`sampling.temp`). */
  readonly key: string;
  readonly tier: Tier;
  readonly via: Via;
  readonly type: FieldType;
  /** Layer 1 value: llama.cpp's built-in default (or the engine's, for engine settings). */
  readonly default: unknown;
  /** Other names accepted on the wire and rewritten to `key` (upstream struct paths, CLI spellings). */
  readonly aliases: readonly string[];
  /** Out-of-range numbers are clamped into bounds instead of rejected. */
  readonly clamp: boolean;
  /** Why this engine cannot honor the field; `undefined` when it can. */
  readonly unsupported: string | undefined;
  /** Optional rewrite applied before type checks (booleans for `flash_attn`, `-1` seed). */
  readonly coerce: ((value: unknown) => unknown) | undefined;
}

const INT32_MAX = 2_147_483_647;
const KIB = 1024;
const MIB = 1024 * KIB;

const int = (min: number, max: number = INT32_MAX): FieldType => ({ kind: 'int', min, max });
const num = (min: number, max: number): FieldType => ({ kind: 'number', min, max });
const bool: FieldType = { kind: 'bool' };
const str = (maxLength = 65_536, pattern?: RegExp): FieldType =>
  pattern === undefined ? { kind: 'string', maxLength } : { kind: 'string', maxLength, pattern };
const oneOf = (...values: string[]): FieldType => ({ kind: 'enum', values });
const list = (of: FieldType, maxItems = 1024): FieldType => ({ kind: 'list', of, maxItems });
const map = (of: FieldType, maxEntries = 1024): FieldType => ({ kind: 'map', of, maxEntries });
const orAuto = (of: FieldType): FieldType => ({ kind: 'auto', of });

interface Extra {
  aliases?: string[];
  clamp?: boolean;
  unsupported?: string;
  coerce?: (value: unknown) => unknown;
}

const specs: FieldSpec[] = [];
function field(key: string, tier: Tier, via: Via, type: FieldType, def: unknown, extra: Extra = {}): void {
  specs.push({
    key,
    tier,
    via,
    type,
    default: def,
    aliases: extra.aliases ?? [],
    clamp: extra.clamp ?? false,
    unsupported: extra.unsupported,
    coerce: extra.coerce,
  });
}

const CLI_ONLY =
  'a llama.cpp CLI/example setting; the engine serves requests over HTTP and has no use for it';
const NO_CALLBACK = 'a native callback pointer; it cannot cross the wire';
const NO_MULTIMODAL = 'multimodal (mtmd) input is not built into this engine';
const NO_ADAPTERS = 'LoRA adapters and control vectors are not exposed by the native binding';
const NO_SPECULATIVE =
  'speculative decoding implements the n-gram types and draft_simple (a draft model, greedy chains) only';
const NOT_SERVED = 'a llama-server setting this engine does not implement';
const NO_TIMINGS = 'the engine reports no llama.cpp perf or per-token timings';
// The native build runs ggml's CPU backend on OpenMP (GGML_OPENMP), whose threadpool has no
// polling workers and applies a priority to libgomp's process-wide threads, never undoing it.
const NO_POLL =
  'ggml reads poll only in its pthread threadpool; this build computes on OpenMP threads, which never poll';
const NO_PRIORITY =
  "ggml applies it to libgomp's process-wide OpenMP threads and never restores it, so it would outlive the context";

// ---------------------------------------------------------------- T1: sampler (common_params_sampling)
const S = (name: string, type: FieldType, def: unknown, extra?: Extra) =>
  field(`sampling.${name}`, 'T1', 'sampler', type, def, extra);
S('n_prev', int(1, 1 << 20), 64, {
  unsupported: 'the CLI history ring of common_sampler; the engine keeps no such buffer',
});
// The default for requests that do not say (apps/engine's request-params: logprobs, n_probs).
S('n_probs', int(0, 1 << 20), 0);
S('min_keep', int(0, 1 << 20), 0);
S('top_k', int(-1, 1 << 24), 40);
S('top_p', num(0, 1), 0.95);
S('min_p', num(0, 1), 0.05);
S('xtc_probability', num(0, 1), 0);
S('xtc_threshold', num(0, 1), 0.1);
S('typ_p', num(0, 1), 1);
S('temp', num(0, 100), 0.8);
S('dynatemp_range', num(0, 100), 0);
S('dynatemp_exponent', num(0, 100), 1);
S('penalty_last_n', int(-1, 1 << 24), 64);
S('penalty_repeat', num(0, 100), 1);
S('penalty_freq', num(-100, 100), 0);
S('penalty_present', num(-100, 100), 0);
S('dry_multiplier', num(0, 100), 0);
S('dry_base', num(0, 100), 1.75);
S('dry_allowed_length', int(0, 1 << 24), 2);
S('dry_penalty_last_n', int(-1, 1 << 24), 64);
S('dry_sequence_breakers', list(str(256), 256), ['\n', ':', '"', '*']);
S('adaptive_target', num(-1, 1), -1);
S('adaptive_decay', num(0, 0.99), 0.9);
S('mirostat', int(0, 2), 0);
S('mirostat_tau', num(0, 100), 5);
S('mirostat_eta', num(0, 10), 0.1);
S('top_n_sigma', num(-1, 100), -1);
S('ignore_eos', bool, false);
S('no_perf', bool, false, { unsupported: NO_TIMINGS });
S('timing_per_token', bool, false, { unsupported: NO_TIMINGS });
S(
  'samplers',
  list(
    oneOf(
      'penalties',
      'dry',
      'top_n_sigma',
      'top_k',
      'typ_p',
      'top_p',
      'min_p',
      'xtc',
      'temperature',
      'infill',
      'adaptive_p',
    ),
    32,
  ),
  ['penalties', 'dry', 'top_n_sigma', 'top_k', 'typ_p', 'top_p', 'min_p', 'xtc', 'temperature'],
);
S('grammar', str(1 << 20), '');
S('grammar_lazy', bool, false, {
  unsupported: 'a lazy grammar needs trigger words or patterns, and the registry has no field for them',
});
// Keys are token ids in decimal; JSON maps cannot have integer keys.
S('logit_bias', map(num(-1e9, 1e9), 1 << 16), {});
S('reasoning_budget_tokens', int(-1), -1, { unsupported: 'reasoning budgets are not implemented' });
S('reasoning_budget_message', str(), '', { unsupported: 'reasoning budgets are not implemented' });
S('backend_sampling', bool, false, {
  unsupported: 'the engine chooses on-device sampling itself (on when the output layer sits on a GPU)',
});
// LLAMA_DEFAULT_SEED means "random"; coordinators commonly send -1 for that.
field('seed', 'T1', 'sampler', int(0, 0xffff_ffff), 0xffff_ffff, {
  aliases: ['sampling.seed'],
  coerce: (v) => (v === -1 ? 0xffff_ffff : v),
});

// ---------------------------------------------------------------- T1: per-request / engine settings
const E = (key: string, type: FieldType, def: unknown, extra?: Extra) =>
  field(key, 'T1', 'engine', type, def, extra);
E('n_predict', int(-2), -1);
// The Hydra state transfer chunk (STATE_GET/PUT); the legacy CONFIGURE payload sets it alone.
E('state_chunk_size', int(64 * KIB, 64 * MIB), 1 * MIB, { clamp: true });
// COMBINE failover (apps/engine combine/failover.ts): what a head reloads after a peer loss, whether
// it probes the lost peers and restores COMBINE, and per-device caps (NAME=MiB) its fit decisions use.
E('failover_policy', oneOf('auto', 'solo', 'offload', 'none'), 'auto');
E('peer_rejoin', bool, true);
E('device_memory_cap', list(str(300, /^[^=\s]+=[1-9][0-9]{0,8}$/), 128), []);
// Context shift (llama-server's --context-shift / --keep): tokens of the prompt kept (-1: all).
E('n_keep', int(-1), 0);
E('antiprompt', list(str(4096), 256), [], { unsupported: NOT_SERVED });
E('cache_prompt', bool, true, { unsupported: NOT_SERVED });
E('cache_idle_slots', bool, true, { unsupported: NOT_SERVED });
E('n_cache_reuse', int(0), 0, { unsupported: NOT_SERVED });
// Prompt checkpoints of a recurrent or hybrid model (core/checkpoints.ts), read at each admission.
E('n_ctx_checkpoints', int(0, 1 << 16), 32);
E('checkpoint_min_step', int(0), 8192);
E('cache_ram_mib', int(-1), 8192, { unsupported: NOT_SERVED });
E('slot_prompt_similarity', num(0, 1), 0.1, { unsupported: NOT_SERVED });
E('cont_batching', bool, true, { unsupported: NOT_SERVED });
E('ctx_shift', bool, false);
E('input_prefix', str(), '', { unsupported: NOT_SERVED });
E('input_suffix', str(), '', { unsupported: NOT_SERVED });
E('input_prefix_bos', bool, false, { unsupported: NOT_SERVED });
E('prompt', str(1 << 24), '', { unsupported: NOT_SERVED });
E('system_prompt', str(1 << 24), '', { unsupported: NOT_SERVED });
E('api_keys', list(str(1024), 256), [], { unsupported: NOT_SERVED });
E('chat_template', str(1 << 20), '', { unsupported: NOT_SERVED });
E('use_jinja', bool, true, { unsupported: NOT_SERVED });
E('enable_chat_template', bool, true, { unsupported: NOT_SERVED });
E('force_pure_content_parser', bool, false, { unsupported: NOT_SERVED });
E('default_template_kwargs', map(str(), 256), {}, { unsupported: NOT_SERVED });
E('reasoning_format', oneOf('none', 'auto', 'deepseek-legacy', 'deepseek'), 'deepseek', {
  unsupported: NOT_SERVED,
});
E('enable_reasoning', int(-1, 1), -1, { unsupported: NOT_SERVED });
E('prefill_assistant', bool, true, { unsupported: NOT_SERVED });
// Serves /embedding(s), /v1/embeddings (and /v1/rerank with pooling_type rank). No rebuild: an
// embedding batch turns the context's embeddings on for itself, as llama-server does per batch.
E('embedding', bool, false);
// The normalization of a request that names no embd_normalize.
E('embd_normalize', int(-1, 1 << 16), 2);
E('embd_out', oneOf('', 'array', 'json', 'json+'), '', { unsupported: NOT_SERVED });
E('embd_sep', str(256), '\n', { unsupported: NOT_SERVED });
E('cls_sep', str(256), '\t', { unsupported: NOT_SERVED });
E('timeout_read', int(0), 3600, { unsupported: NOT_SERVED });
E('timeout_write', int(0), 3600, { unsupported: NOT_SERVED });
E('sse_ping_interval', int(0), 30, { unsupported: NOT_SERVED });
E('sleep_idle_seconds', int(-1), -1, { unsupported: NOT_SERVED });
// Named in the T1 list but not something this engine can honor: rejected, never ignored.
E('n_chunks', int(-1), -1, { unsupported: CLI_ONLY });
E('n_print', int(-1), -1, { unsupported: CLI_ONLY });
E('single_turn', bool, false, { unsupported: CLI_ONLY });
E('prompt_file', str(4096), '', { unsupported: CLI_ONLY });
E('path_prompt_cache', str(4096), '', { unsupported: CLI_ONLY, aliases: ['prompt_cache'] });
E('prompt_cache_all', bool, false, { unsupported: CLI_ONLY });
E('prompt_cache_ro', bool, false, { unsupported: CLI_ONLY });
E('logits_file', str(4096), '', { unsupported: CLI_ONLY });
E('logits_output_dir', str(4096), 'data', { unsupported: CLI_ONLY });
E('save_logits', bool, false, { unsupported: CLI_ONLY });
E('tensor_filter', list(str(4096)), [], { unsupported: CLI_ONLY });
E('out_file', str(4096), '', { unsupported: CLI_ONLY });
// "server TTY-related flags" of the T1 list.
for (const [key, def] of [
  ['use_color', false],
  ['simple_io', false],
  ['multiline_input', false],
  ['interactive', false],
  ['interactive_first', false],
  ['display_prompt', true],
  ['verbose_prompt', false],
  ['escape', true],
  ['show_timings', true],
] as const) {
  E(key, bool, def, { unsupported: CLI_ONLY });
}
E('image', list(str(4096)), [], { unsupported: NO_MULTIMODAL });
E('image_min_tokens', int(-1), -1, { unsupported: NO_MULTIMODAL });
E('image_max_tokens', int(-1), -1, { unsupported: NO_MULTIMODAL });
E('load_progress_callback', str(0), '', { unsupported: NO_CALLBACK });
E('load_progress_callback_user_data', str(0), '', { unsupported: NO_CALLBACK });

// ---------------------------------------------------------------- T2: context
const C = (key: string, type: FieldType, def: unknown, extra?: Extra) =>
  field(key, 'T2', 'context', type, def, extra);
const KV_TYPES = ['f32', 'f16', 'bf16', 'q8_0', 'q4_0', 'q4_1', 'iq4_nl', 'q5_0', 'q5_1'];
C('n_ctx', int(0), 0);
C('n_batch', int(1), 2048);
C('n_ubatch', int(1), 512);
C('n_parallel', int(1, 4096), 1);
C('n_sequences', int(1, 4096), 1, {
  unsupported: 'not a context parameter of the pinned llama.cpp; use n_parallel',
});
C('n_outputs_max', int(0), 0, {
  unsupported:
    'the pinned llama.cpp aborts the process (GGML_ASSERT in output_reserve) on a decode with more outputs than this cap, and logprobs, embeddings and speculative checks ask for more',
});
C('grp_attn_n', int(1), 1, { unsupported: 'self-extend (group attention) is not implemented' });
C('grp_attn_w', int(1), 512, { unsupported: 'self-extend (group attention) is not implemented' });
C('rope_freq_base', num(0, 1e12), 0);
C('rope_freq_scale', num(0, 1e6), 0);
// 'longrope' is left out: the native binding has no mapping for it.
C('rope_scaling_type', oneOf('unspecified', 'none', 'linear', 'yarn'), 'unspecified', {
  aliases: ['rope_scaling'],
});
C('yarn_ext_factor', num(-1, 1e6), -1);
C('yarn_attn_factor', num(-1, 1e6), -1);
C('yarn_beta_fast', num(-1, 1e6), -1);
C('yarn_beta_slow', num(-1, 1e6), -1);
C('yarn_orig_ctx', int(0), 0);
C('pooling_type', oneOf('unspecified', 'none', 'mean', 'cls', 'last', 'rank'), 'unspecified', {
  aliases: ['pooling'],
});
C('attention_type', oneOf('unspecified', 'causal', 'non_causal'), 'unspecified', {
  aliases: ['attention'],
});
C('flash_attn', oneOf('on', 'off', 'auto'), 'auto', {
  aliases: ['flash_attn_type'],
  coerce: (v) => (v === true ? 'on' : v === false ? 'off' : v),
});
C('cache_type_k', oneOf(...KV_TYPES), 'f16');
C('cache_type_v', oneOf(...KV_TYPES), 'f16');
C('kv_unified', bool, false);
C('swa_full', bool, false);
C('no_perf', bool, false, { unsupported: NO_TIMINGS });
C('no_kv_offload', bool, false);
C('no_op_offload', bool, false);
C('no_extra_bufts', bool, false);
C('no_host', bool, false);
C('numa', oneOf('disabled', 'distribute', 'isolate', 'numactl', 'mirror'), 'disabled', {
  unsupported:
    'llama_numa_init is process-wide and takes effect once (ggml ignores a second call), so a setting a CONFIGURE may change cannot reach it',
});
for (const group of ['cpuparams', 'cpuparams_batch']) {
  const alias = group === 'cpuparams' ? 'n_threads' : 'n_threads_batch';
  C(`${group}.n_threads`, int(-1, 4096), -1, { aliases: [alias] });
  // Hex, lowest bit CPU 0 (--cpu-mask); the batch group's mask and strictness default to these.
  C(`${group}.cpumask`, str(1024, /^(0x)?[0-9a-fA-F]*$/), '');
  C(`${group}.priority`, oneOf('normal', 'medium', 'high', 'realtime'), 'normal', {
    unsupported: NO_PRIORITY,
  });
  C(`${group}.strict_cpu`, bool, false);
  C(`${group}.poll`, int(0, 100), 50, { unsupported: NO_POLL });
}
C('cb_eval', str(0), '', { unsupported: NO_CALLBACK });
C('cb_eval_user_data', str(0), '', { unsupported: NO_CALLBACK });
// Self-speculative (lookup n-gram) settings live with the context; a draft model is T3.
C(
  'speculative.types',
  // llama.cpp's types but the draft-model heads (draft_eagle3, draft_mtp: refused, oneOf names what is admitted).
  list(
    oneOf('none', 'ngram_simple', 'ngram_map_k', 'ngram_map_k4v', 'ngram_mod', 'ngram_cache', 'draft_simple'),
    16,
  ),
  ['none'],
  // llama-server's --spec-type spells them with hyphens (ngram-simple).
  {
    aliases: ['speculative.type'],
    coerce: (v) => (Array.isArray(v) ? v.map((t) => (typeof t === 'string' ? t.replace(/-/g, '_') : t)) : v),
  },
);
// The draft model's guesses per step (draft_simple): at most n_max, dropped when fewer than n_min,
// stopped at a guess less likely than p_min among the draft's top 10.
C('speculative.n_max', int(0, 1024), 3, { aliases: ['speculative.draft.n_max'] });
C('speculative.n_min', int(0, 1024), 0, { aliases: ['speculative.draft.n_min'] });
C('speculative.p_split', num(0, 1), 0.1, {
  unsupported: NO_SPECULATIVE,
  aliases: ['speculative.draft.p_split'],
});
C('speculative.p_min', num(0, 1), 0, { aliases: ['speculative.draft.p_min'] });
C('speculative.ngram_size_n', int(1, 1024), 12);
C('speculative.ngram_size_m', int(1, 1024), 48);
C('speculative.ngram_min_hits', int(1, 65_535), 1, { unsupported: NO_SPECULATIVE });
// ngram_map_k / ngram_map_k4v (common_params_speculative's ngram_map_k, ngram_map_k4v): key length,
// guess length and the key's occurrences before it guesses.
for (const t of ['ngram_map_k', 'ngram_map_k4v']) {
  C(`speculative.${t}.size_n`, int(1, 1024), 12);
  C(`speculative.${t}.size_m`, int(1, 1024), 48);
  C(`speculative.${t}.min_hits`, int(1, 1024), 1);
}
// ngram_mod: hashed n-gram length, most and fewest tokens guessed.
C('speculative.ngram_mod.n_match', int(1, 1024), 24);
C('speculative.ngram_mod.n_max', int(0, 1024), 64);
C('speculative.ngram_mod.n_min', int(0, 1024), 48);
C('speculative.lookup_cache_static', str(4096), '', { unsupported: NO_SPECULATIVE });
C('speculative.lookup_cache_dynamic', str(4096), '', { unsupported: NO_SPECULATIVE });

// ---------------------------------------------------------------- T3: model
const M = (key: string, type: FieldType, def: unknown, extra?: Extra) =>
  field(key, 'T3', 'model', type, def, extra);
const HOST_PORT = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([1-9][0-9]{0,4})$/;
M('model', str(4096), '', { aliases: ['model.path'] });
M('n_gpu_layers', orAuto(int(-2)), -1, { aliases: ['ngl'] });
M('main_gpu', int(0, 127), 0);
M('tensor_split', orAuto(list(num(0, 1e9), 128)), []);
// The pinned llama.cpp also has 'tensor'; the native binding loads none/layer/row only.
M('split_mode', oneOf('none', 'layer', 'row'), 'layer');
M('devices', list(str(256), 128), []);
M('use_mmap', bool, true);
M('use_direct_io', bool, false);
M('use_mlock', bool, false);
M('check_tensors', bool, false);
M('no_alloc', bool, false, { unsupported: 'a metadata-only load cannot serve requests' });
// "KEY=TYPE:VALUE" as in --override-kv.
M('kv_overrides', list(str(4096, /^[^=]+=(int|float|bool|str):.*$/s), 1024), []);
// "<regex>=<buffer type>" as in --override-tensor; the regex is checked when validated.
M('override_tensors', list(str(4096, /^.+=[^=]+$/s), 1024), [], {
  aliases: ['tensor_buft_overrides', 'override_tensor'],
});
M('rpc_servers', list(str(300, HOST_PORT), 64), []);
M('n_cpu_moe', int(0), 0);
// The draft model (speculative.types draft_simple, implied by a model alone) and where it loads.
M('speculative.model', str(4096), '', {
  aliases: ['speculative.draft.model', 'speculative.draft.mparams.path'],
});
M('speculative.n_gpu_layers', int(-2), -1, { aliases: ['speculative.draft.n_gpu_layers'] });
M('speculative.devices', list(str(256), 128), [], { aliases: ['speculative.draft.devices'] });
M('mmproj', str(4096), '', { unsupported: NO_MULTIMODAL, aliases: ['mmproj.path'] });
M('lora_init_without_apply', bool, false, { unsupported: NO_ADAPTERS });
M('lora_adapters', list(str(4096)), [], { unsupported: NO_ADAPTERS });
M('control_vectors', list(str(4096)), [], { unsupported: NO_ADAPTERS });
for (const part of ['url', 'hf_repo', 'hf_file', 'docker_repo']) {
  M(`model.${part}`, str(4096), '', {
    unsupported: 'the engine never downloads weights; send a local GGUF path',
  });
}

// ---------------------------------------------------------------- T4: start-only
const T4 = (key: string, type: FieldType, def: unknown, extra?: Extra) =>
  field(key, 'T4', 'engine', type, def, extra);
T4('port', int(0, 65_535), 8080);
T4('rpc_port', int(0, 65_535), 50_052, { aliases: ['rpc_server_port'] });
T4('host', str(256), '127.0.0.1');
T4('hostname', str(256), '127.0.0.1');
T4('n_threads_http', int(-1, 4096), -1);
T4('control_allow_from', list(str(256), 256), ['127.0.0.1/8', '::1/128']);
T4('api_key', str(1024), '');
T4('ssl_file_key', str(4096), '');
T4('ssl_file_cert', str(4096), '');
T4('log_file', str(4096), '');
T4('log_json', bool, false);
T4('log_colors', oneOf('on', 'off', 'auto'), 'auto');
T4('log_verbosity', int(0, 10), 3, { aliases: ['verbosity'] });
T4('log_prefix', bool, false);
T4('log_timestamps', bool, false);
T4('log_disable', bool, false);
T4('reuse_port', bool, false);
T4('public_path', str(4096), '');
T4('api_prefix', str(4096), '');
T4('cuda_visible_devices', str(1024), '');

/**
 * Start-only key prefixes: every `log_*` and `ssl_*` key is T4 even when the registry does not name
 * it, so a new upstream log flag is refused as T4 rather than as an unknown key.
 */
export const T4_PREFIXES: readonly string[] = ['log_', 'ssl_'];

/** Every field, in registry order. */
export const FIELDS: readonly FieldSpec[] = Object.freeze(specs.map((s) => Object.freeze(s)));

const byKey = new Map<string, FieldSpec>();
const byAlias = new Map<string, FieldSpec>();
for (const spec of FIELDS) {
  if (byKey.has(spec.key)) throw new Error(`duplicate registry key ${spec.key}`);
  byKey.set(spec.key, spec);
}
for (const spec of FIELDS) {
  for (const alias of spec.aliases) {
    if (byKey.has(alias) || byAlias.has(alias)) throw new Error(`alias ${alias} collides`);
    byAlias.set(alias, spec);
  }
}

/** Dotted prefixes that name a sub-struct (`sampling`, `speculative`, `speculative.draft`, `model`). */
const structPrefixes = new Set<string>();
for (const name of [...byKey.keys(), ...byAlias.keys()]) {
  const parts = name.split('.');
  for (let i = 1; i < parts.length; i++) structPrefixes.add(parts.slice(0, i).join('.'));
}

const order = new Map<string, number>(FIELDS.map((f, i) => [f.key, i]));

/** Position of a canonical key in {@link FIELDS}: plans list keys in this order whatever the request's. */
export function registryIndex(key: string): number {
  return order.get(key) ?? Number.MAX_SAFE_INTEGER;
}

/** The entry of a canonical key or alias; `undefined` when the registry does not know it. */
export function fieldFor(key: string): FieldSpec | undefined {
  return byKey.get(key) ?? byAlias.get(key);
}

/** True when `key` is a sub-struct name under which nested objects are flattened. */
export function isStructPrefix(key: string): boolean {
  return structPrefixes.has(key);
}

/** True when an unregistered key is start-only by prefix. */
export function isT4ByPrefix(key: string): boolean {
  return !key.includes('.') && T4_PREFIXES.some((p) => key.startsWith(p));
}

/** True for fields CONFIGURE can set: known, not start-only, supported. */
export function isRuntimeField(spec: FieldSpec): boolean {
  return spec.tier !== 'T4' && spec.unsupported === undefined;
}

/** Layer 1: every runtime field (see {@link isRuntimeField}) with its built-in default. */
export function defaults(): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const spec of FIELDS) if (isRuntimeField(spec)) out[spec.key] = structuredClone(spec.default);
  return out;
}
