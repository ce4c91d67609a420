// llama-server's command line as far as it means something here (common/arg.cpp of the pinned
// tree): more of its names for registry keys, its LLAMA_ARG_* environment variables, its help
// groups, the flags whose behaviour is already this engine's, and the flags of features that do
// not exist yet, which are refused by name (exit 2) rather than accepted and ignored.
import type { FlagSpec } from './args.js';

/** Flags of llama-server that map to registry keys or engine settings (besides args.ts FLAGS). */
export const LLAMA_FLAGS: FlagSpec[] = [
  { names: ['--temperature'], key: 'sampling.temp', kind: 'number', help: 'the same as --temp' },
  { names: ['--predict'], key: 'n_predict', kind: 'int', help: 'the same as -n' },
  {
    names: ['--typical', '--typical-p'],
    key: 'sampling.typ_p',
    kind: 'number',
    help: 'default locally typical sampling p (1 = off)',
  },
  {
    names: ['--top-nsigma', '--top-n-sigma'],
    key: 'sampling.top_n_sigma',
    kind: 'number',
    help: 'default top-n-sigma (-1 = off)',
  },
  {
    names: ['--xtc-probability'],
    key: 'sampling.xtc_probability',
    kind: 'number',
    help: 'default XTC probability',
  },
  {
    names: ['--xtc-threshold'],
    key: 'sampling.xtc_threshold',
    kind: 'number',
    help: 'default XTC threshold',
  },
  {
    names: ['--presence-penalty'],
    key: 'sampling.penalty_present',
    kind: 'number',
    help: 'default presence penalty',
  },
  {
    names: ['--frequency-penalty'],
    key: 'sampling.penalty_freq',
    kind: 'number',
    help: 'default frequency penalty',
  },
  {
    names: ['--dry-multiplier'],
    key: 'sampling.dry_multiplier',
    kind: 'number',
    help: 'default DRY multiplier',
  },
  { names: ['--dry-base'], key: 'sampling.dry_base', kind: 'number', help: 'default DRY base' },
  {
    names: ['--dry-allowed-length'],
    key: 'sampling.dry_allowed_length',
    kind: 'int',
    help: 'default DRY allowed length',
  },
  {
    names: ['--dry-penalty-last-n'],
    key: 'sampling.dry_penalty_last_n',
    kind: 'int',
    help: 'default DRY look-back (-1 = context)',
  },
  {
    names: ['--dry-sequence-breaker'],
    key: 'sampling.dry_sequence_breakers',
    kind: 'repeat',
    help: 'a DRY sequence breaker (repeatable)',
  },
  {
    names: ['--adaptive-target'],
    key: 'sampling.adaptive_target',
    kind: 'number',
    help: 'adaptive-p target',
  },
  { names: ['--adaptive-decay'], key: 'sampling.adaptive_decay', kind: 'number', help: 'adaptive-p decay' },
  {
    names: ['--dynatemp-range'],
    key: 'sampling.dynatemp_range',
    kind: 'number',
    help: 'default dynamic temperature range',
  },
  {
    names: ['--dynatemp-exp'],
    key: 'sampling.dynatemp_exponent',
    kind: 'number',
    help: 'default dynamic temperature exponent',
  },
  { names: ['--mirostat'], key: 'sampling.mirostat', kind: 'int', help: 'default Mirostat (0 off, 1, 2)' },
  { names: ['--mirostat-lr'], key: 'sampling.mirostat_eta', kind: 'number', help: 'Mirostat eta' },
  { names: ['--mirostat-ent'], key: 'sampling.mirostat_tau', kind: 'number', help: 'Mirostat tau' },
  {
    names: ['--ignore-eos'],
    key: 'sampling.ignore_eos',
    kind: 'flag',
    bare: true,
    help: 'ignore end of stream',
  },
  {
    names: ['--samplers'],
    key: 'sampling.samplers',
    kind: 'list',
    split: ';',
    help: 'sampler order, ;-separated names',
  },
  { names: ['--grammar'], key: 'sampling.grammar', kind: 'string', help: 'default GBNF grammar' },
  {
    names: ['--grammar-file'],
    key: 'sampling.grammar',
    kind: 'file',
    help: 'file of the default GBNF grammar',
  },
  {
    names: ['-l', '--logit-bias'],
    key: 'sampling.logit_bias',
    kind: 'bias',
    help: 'TOKEN_ID(+|-)BIAS, e.g. 15043+1 (repeatable)',
  },
  {
    names: ['-nkvo', '--no-kv-offload'],
    key: 'no_kv_offload',
    kind: 'flag',
    bare: true,
    help: 'keep the KV cache on the host',
  },
  {
    names: ['-kvo', '--kv-offload'],
    key: 'no_kv_offload',
    kind: 'flag',
    bare: false,
    help: 'offload the KV cache (default)',
  },
  { names: ['--mmap'], key: 'use_mmap', kind: 'flag', bare: true, help: 'map the model (default)' },
  { names: ['--rope-freq-base'], key: 'rope_freq_base', kind: 'number', help: 'RoPE base frequency' },
  { names: ['--rope-freq-scale'], key: 'rope_freq_scale', kind: 'number', help: 'RoPE frequency scale' },
  { names: ['--rope-scaling'], key: 'rope_scaling_type', kind: 'string', help: 'none|linear|yarn' },
  { names: ['--yarn-orig-ctx'], key: 'yarn_orig_ctx', kind: 'int', help: 'YaRN original context' },
  { names: ['--yarn-ext-factor'], key: 'yarn_ext_factor', kind: 'number', help: 'YaRN extrapolation mix' },
  { names: ['--yarn-attn-factor'], key: 'yarn_attn_factor', kind: 'number', help: 'YaRN attention factor' },
  { names: ['--yarn-beta-slow'], key: 'yarn_beta_slow', kind: 'number', help: 'YaRN beta slow' },
  { names: ['--yarn-beta-fast'], key: 'yarn_beta_fast', kind: 'number', help: 'YaRN beta fast' },
  { names: ['--swa-full'], key: 'swa_full', kind: 'flag', bare: true, help: 'full-size SWA cache' },
  {
    names: ['--cache-prompt'],
    key: '@cachePrompt',
    kind: 'flag',
    bare: true,
    help: 'reuse a slot KV prefix (default; a request may say cache_prompt: false)',
  },
  {
    names: ['--no-cache-prompt'],
    key: '@cachePrompt',
    kind: 'flag',
    bare: false,
    help: 'requests reuse no KV unless they say cache_prompt: true',
  },
  {
    names: ['--chat-template'],
    key: '@chatTemplate',
    kind: 'string',
    help: "chat template: a llama.cpp built-in name (chatml, llama3, ...) or a template llama.cpp's legacy renderer recognizes",
  },
  {
    names: ['--chat-template-file'],
    key: '@chatTemplate',
    kind: 'file',
    help: 'file of the chat template (as --chat-template)',
  },
  // Asking for what this engine always does: accepted, and true.
  {
    names: ['--metrics'],
    key: '@same',
    kind: 'flag',
    bare: true,
    help: '/metrics is always served (to --control-allow-from)',
  },
  {
    names: ['-cb', '--cont-batching'],
    key: '@same',
    kind: 'flag',
    bare: true,
    help: 'continuous batching is always on',
  },
  { names: ['--no-ui', '--no-webui'], key: '@same', kind: 'flag', bare: true, help: 'there is no web UI' },
  {
    names: ['--jinja'],
    key: '@jinja',
    kind: 'flag',
    bare: true,
    help: "chat templates go through llama.cpp's common chat layer: Jinja, tools, reasoning (default)",
  },
  {
    names: ['--no-jinja'],
    key: '@jinja',
    kind: 'flag',
    bare: false,
    help: "chat templates go through llama.cpp's legacy renderer (llama_chat_apply_template; no tools)",
  },
  {
    names: ['--reasoning-format'],
    key: '@reasoningFormat',
    kind: 'string',
    help: 'reasoning_content extraction: none, auto (default), deepseek, deepseek-legacy',
  },
  {
    names: ['--chat-template-kwargs'],
    key: '@chatTemplateKwargs',
    kind: 'string',
    help: 'a JSON object of template variables for every chat, e.g. \'{"enable_thinking":false}\'',
  },
  {
    names: ['--spec-type'],
    key: 'speculative.types',
    kind: 'list',
    help: 'speculative decoding: none or ngram-simple (draft-model and other n-gram types are refused)',
  },
  {
    names: ['--spec-ngram-simple-size-n'],
    key: 'speculative.ngram_size_n',
    kind: 'int',
    help: 'ngram-simple: length of the n-gram looked up in the history (default 12)',
  },
  {
    names: ['--spec-ngram-simple-size-m'],
    key: 'speculative.ngram_size_m',
    kind: 'int',
    help: 'ngram-simple: most tokens guessed after a match (default 48)',
  },
];

/** llama-server flags of features this engine does not have yet: refused by name, with why. */
export const UNSUPPORTED_FLAGS: { names: string[]; env?: string; takesValue: boolean; why: string }[] = [
  {
    names: ['-rea', '--reasoning'],
    env: 'LLAMA_ARG_REASONING',
    takesValue: true,
    why: 'reasoning extraction is not implemented',
  },
  {
    names: ['--reasoning-budget'],
    env: 'LLAMA_ARG_THINK_BUDGET',
    takesValue: true,
    why: 'reasoning budgets are not implemented',
  },
  {
    names: ['--reasoning-effort'],
    env: 'LLAMA_ARG_REASONING_EFFORT',
    takesValue: true,
    why: 'reasoning is not implemented',
  },
  {
    names: ['-md', '--model-draft', '--spec-draft-model'],
    env: 'LLAMA_ARG_SPEC_DRAFT_MODEL',
    takesValue: true,
    why: 'speculative decoding is not implemented',
  },
  {
    names: ['--draft', '--draft-n', '--draft-max'],
    env: 'LLAMA_ARG_DRAFT_MAX',
    takesValue: true,
    why: 'speculative decoding is not implemented',
  },
  {
    names: ['--draft-min', '--draft-n-min'],
    env: 'LLAMA_ARG_DRAFT_MIN',
    takesValue: true,
    why: 'speculative decoding is not implemented',
  },
  {
    names: ['--embedding', '--embeddings'],
    env: 'LLAMA_ARG_EMBEDDINGS',
    takesValue: false,
    why: 'embeddings (/v1/embeddings) are not implemented',
  },
  {
    names: ['--rerank', '--reranking'],
    env: 'LLAMA_ARG_RERANKING',
    takesValue: false,
    why: 'reranking is not implemented',
  },
  { names: ['--pooling'], env: 'LLAMA_ARG_POOLING', takesValue: true, why: 'embeddings are not implemented' },
  {
    names: ['-mm', '--mmproj'],
    env: 'LLAMA_ARG_MMPROJ',
    takesValue: true,
    why: 'multimodal input is not implemented',
  },
  {
    names: ['-mmu', '--mmproj-url'],
    env: 'LLAMA_ARG_MMPROJ_URL',
    takesValue: true,
    why: 'multimodal input is not implemented',
  },
  { names: ['--lora'], takesValue: true, why: 'LoRA adapters are not implemented' },
  { names: ['--lora-scaled'], takesValue: true, why: 'LoRA adapters are not implemented' },
  { names: ['--control-vector'], takesValue: true, why: 'control vectors are not implemented' },
  {
    names: ['--props'],
    env: 'LLAMA_ARG_ENDPOINT_PROPS',
    takesValue: false,
    why: 'POST /props is not implemented',
  },
  { names: ['--tools'], env: 'LLAMA_ARG_TOOLS', takesValue: true, why: 'server tools are not implemented' },
  {
    names: ['-ag', '--agent'],
    env: 'LLAMA_ARG_AGENT',
    takesValue: false,
    why: 'server tools are not implemented',
  },
  { names: ['--ui', '--webui'], env: 'LLAMA_ARG_UI', takesValue: false, why: 'there is no web UI' },
  { names: ['--path'], env: 'LLAMA_ARG_STATIC_PATH', takesValue: true, why: 'static files are not served' },
  {
    names: ['--api-prefix'],
    env: 'LLAMA_ARG_API_PREFIX',
    takesValue: true,
    why: 'route prefixes are not implemented',
  },
  {
    names: ['--ssl-key-file'],
    env: 'LLAMA_ARG_SSL_KEY_FILE',
    takesValue: true,
    why: 'TLS is not implemented (put a proxy in front)',
  },
  {
    names: ['--ssl-cert-file'],
    env: 'LLAMA_ARG_SSL_CERT_FILE',
    takesValue: true,
    why: 'TLS is not implemented (put a proxy in front)',
  },
  {
    names: ['-hf', '-hfr', '--hf-repo'],
    env: 'LLAMA_ARG_HF_REPO',
    takesValue: true,
    why: 'downloads are not implemented; pass -m FILE',
  },
  {
    names: ['-hff', '--hf-file'],
    env: 'LLAMA_ARG_HF_FILE',
    takesValue: true,
    why: 'downloads are not implemented; pass -m FILE',
  },
  {
    names: ['-mu', '--model-url'],
    env: 'LLAMA_ARG_MODEL_URL',
    takesValue: true,
    why: 'downloads are not implemented; pass -m FILE',
  },
  {
    names: ['--cache-reuse'],
    env: 'LLAMA_ARG_CACHE_REUSE',
    takesValue: true,
    why: 'KV shifting reuse is not implemented',
  },
  {
    names: ['--context-shift'],
    env: 'LLAMA_ARG_CONTEXT_SHIFT',
    takesValue: false,
    why: 'context shift is not implemented',
  },
  { names: ['--keep'], takesValue: true, why: 'context shift (n_keep) is not implemented' },
  {
    names: ['-nocb', '--no-cont-batching'],
    takesValue: false,
    why: 'continuous batching cannot be turned off',
  },
  {
    names: ['-to', '--timeout'],
    env: 'LLAMA_ARG_TIMEOUT',
    takesValue: true,
    why: 'use --body-timeout-ms and --keep-alive-timeout-ms',
  },
  {
    names: ['--threads-http'],
    env: 'LLAMA_ARG_THREADS_HTTP',
    takesValue: true,
    why: 'HTTP runs on the event loop',
  },
  { names: ['--sleep-idle-seconds'], takesValue: true, why: 'sleeping on idle is not implemented' },
  {
    names: ['-sps', '--slot-prompt-similarity'],
    takesValue: true,
    why: 'slots are picked empty-first, not by prompt similarity',
  },
  {
    names: ['-cram', '--cache-ram'],
    env: 'LLAMA_ARG_CACHE_RAM',
    takesValue: true,
    why: 'the host prompt cache is not implemented',
  },
  {
    names: ['-ctxcp', '--ctx-checkpoints', '--swa-checkpoints'],
    env: 'LLAMA_ARG_CTX_CHECKPOINTS',
    takesValue: true,
    why: 'context checkpoints are not implemented',
  },
  {
    names: ['-j', '--json-schema'],
    takesValue: true,
    why: 'JSON-schema-to-grammar conversion is not implemented; use --grammar',
  },
  {
    names: ['-jf', '--json-schema-file'],
    takesValue: true,
    why: 'JSON-schema-to-grammar conversion is not implemented; use --grammar-file',
  },
  {
    names: ['--no-prefill-assistant'],
    env: 'LLAMA_ARG_PREFILL_ASSISTANT',
    takesValue: false,
    why: 'a final assistant message is always rendered as the template does',
  },
  {
    names: ['--models-dir'],
    env: 'LLAMA_ARG_MODELS_DIR',
    takesValue: true,
    why: 'router mode is not implemented; use --config models:',
  },
  {
    names: ['--models-preset'],
    env: 'LLAMA_ARG_MODELS_PRESET',
    takesValue: true,
    why: 'router mode is not implemented; use --config models:',
  },
];

/** llama-server's environment variable of each key (read when the flag is not given). */
export const ENV_BY_KEY: Readonly<Record<string, string>> = {
  model: 'LLAMA_ARG_MODEL',
  'speculative.types': 'LLAMA_ARG_SPEC_TYPE',
  host: 'LLAMA_ARG_HOST',
  port: 'LLAMA_ARG_PORT',
  api_key: 'LLAMA_API_KEY',
  '@apiKeyFile': 'LLAMA_ARG_API_KEY_FILE',
  n_ctx: 'LLAMA_ARG_CTX_SIZE',
  n_batch: 'LLAMA_ARG_BATCH',
  n_ubatch: 'LLAMA_ARG_UBATCH',
  kv_unified: 'LLAMA_ARG_KV_UNIFIED',
  n_parallel: 'LLAMA_ARG_N_PARALLEL',
  'cpuparams.n_threads': 'LLAMA_ARG_THREADS',
  flash_attn: 'LLAMA_ARG_FLASH_ATTN',
  cache_type_k: 'LLAMA_ARG_CACHE_TYPE_K',
  cache_type_v: 'LLAMA_ARG_CACHE_TYPE_V',
  n_gpu_layers: 'LLAMA_ARG_N_GPU_LAYERS',
  split_mode: 'LLAMA_ARG_SPLIT_MODE',
  tensor_split: 'LLAMA_ARG_TENSOR_SPLIT',
  main_gpu: 'LLAMA_ARG_MAIN_GPU',
  devices: 'LLAMA_ARG_DEVICE',
  rpc_servers: 'LLAMA_ARG_RPC',
  override_tensors: 'LLAMA_ARG_OVERRIDE_TENSOR',
  n_cpu_moe: 'LLAMA_ARG_N_CPU_MOE',
  use_mlock: 'LLAMA_ARG_MLOCK',
  use_mmap: 'LLAMA_ARG_MMAP',
  // '!': the variable names the opposite setting (LLAMA_ARG_KV_OFFLOAD=1 is no_kv_offload false).
  no_kv_offload: '!LLAMA_ARG_KV_OFFLOAD',
  n_predict: 'LLAMA_ARG_N_PREDICT',
  'sampling.top_k': 'LLAMA_ARG_TOP_K',
  rope_freq_base: 'LLAMA_ARG_ROPE_FREQ_BASE',
  rope_freq_scale: 'LLAMA_ARG_ROPE_FREQ_SCALE',
  rope_scaling_type: 'LLAMA_ARG_ROPE_SCALING_TYPE',
  yarn_orig_ctx: 'LLAMA_ARG_YARN_ORIG_CTX',
  yarn_ext_factor: 'LLAMA_ARG_YARN_EXT_FACTOR',
  yarn_attn_factor: 'LLAMA_ARG_YARN_ATTN_FACTOR',
  yarn_beta_slow: 'LLAMA_ARG_YARN_BETA_SLOW',
  yarn_beta_fast: 'LLAMA_ARG_YARN_BETA_FAST',
  swa_full: 'LLAMA_ARG_SWA_FULL',
  '@aliases': 'LLAMA_ARG_ALIAS',
  '@corsOrigins': 'LLAMA_ARG_CORS_ORIGINS',
  '@corsMethods': 'LLAMA_ARG_CORS_METHODS',
  '@corsHeaders': 'LLAMA_ARG_CORS_HEADERS',
  '@corsCredentials': 'LLAMA_ARG_CORS_CREDENTIALS',
  '@slotsEndpoint': 'LLAMA_ARG_ENDPOINT_SLOTS',
  '@cachePrompt': 'LLAMA_ARG_CACHE_PROMPT',
  '@chatTemplate': 'LLAMA_ARG_CHAT_TEMPLATE',
  '@jinja': 'LLAMA_ARG_JINJA',
  '@reasoningFormat': 'LLAMA_ARG_THINK',
  '@chatTemplateKwargs': 'LLAMA_ARG_CHAT_TEMPLATE_KWARGS',
};

/** Where `--help` lists a flag, in llama-server's groups (then this engine's own). */
export function flagGroup(spec: FlagSpec): 'common' | 'sampling' | 'server' | 'hydra' {
  if (spec.key.startsWith('sampling.') || spec.key === 'seed') return 'sampling';
  if (SERVER_KEYS.has(spec.key)) return 'server';
  if (spec.key.startsWith('@') || spec.key === 'rpc_port' || spec.key === 'control_allow_from')
    return 'hydra';
  return 'common';
}

const SERVER_KEYS = new Set([
  'host',
  'port',
  'api_key',
  'n_parallel',
  '@apiKeyFile',
  '@aliases',
  '@slotSavePath',
  '@slotsEndpoint',
  '@corsOrigins',
  '@corsMethods',
  '@corsHeaders',
  '@corsCredentials',
  '@cachePrompt',
  '@chatTemplate',
  '@jinja',
  '@reasoningFormat',
  '@chatTemplateKwargs',
  '@same',
  '@help',
  '@version',
]);

export const HELP_GROUPS = [
  ['common', '----- common params -----'],
  ['sampling', '----- sampling params -----'],
  ['server', '----- example-specific params -----'],
  ['hydra', '----- hydra-engine params -----'],
] as const;

/** llama.cpp's truthy and falsy words for boolean environment variables (common/arg.cpp). */
export function envBool(value: string): boolean | undefined {
  const v = value.toLowerCase();
  if (['on', 'enabled', 'true', '1'].includes(v)) return true;
  if (['off', 'disabled', 'false', '0'].includes(v)) return false;
  return undefined;
}
