import { readFileSync } from 'node:fs';
import { SERVE_LIMIT_KEYS } from '@hydra-engine/native-ggml/rpc-host';
import { ModelRegistry } from '@hydra-engine/resolver';
import { ConfigLayers, normalize, type Params } from '@hydra-engine/tiering';
import { parse as parseYaml } from 'yaml';
import { HydraError } from './errors.js';
import {
  ENV_BY_KEY,
  envBool,
  flagGroup,
  HELP_GROUPS,
  LLAMA_FLAGS,
  UNSUPPORTED_FLAGS,
} from './llama-flags.js';

/** Engine settings that are not llama.cpp `common_params` fields. */
export interface ServeSettings {
  /** Requests waiting for a slot before 429. */
  maxQueue: number;
  /** Stay up in state `error` when the start-up load fails (for a coordinator); default exit 1. */
  keepUpOnLoadFailure: boolean;
  /** Seconds running requests get to finish after SIGTERM/SIGINT before they are ended. */
  shutdownTimeoutS: number;
  /** Log lines as JSON (`json`), as text (`text`), or JSON unless stderr is a TTY (`auto`). */
  logFormat: 'auto' | 'json' | 'text';
  logLevel: 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal' | 'silent';
  /** A file that gets every log line (JSON) besides stderr. */
  logFile: string | undefined;
  /** Largest accepted request body. */
  maxBodyBytes: number;
  /** A request body must arrive within this time (408 otherwise). */
  bodyTimeoutMs: number;
  /** Show load progress: `auto` (bar on a TTY, lines otherwise), `bar`, `lines`, `off`. */
  progress: 'auto' | 'bar' | 'lines' | 'off';
  /** GGUF files whose tensors the merged port serves to ggml-RPC heads from disk (COMBINE). */
  rpcWeights: string[];
  /** CONFIGURE `rpc_weights` is taken (a head names the GGUF it loads); `--no-configure-rpc-weights` refuses it. */
  configureRpcWeights: boolean;
  // Peer watchdog (combine/watchdog.ts PeerWatchdogOptions).
  /** No decode progress for this long while a step is in flight is a peer loss. */
  peerStallMs: number;
  /** Period of the watchdog's checks and HELLO probes; a probe unanswered within the timeout misses. */
  peerProbeIntervalMs: number;
  peerProbeTimeoutMs: number;
  /** Misses in a row of one peer that are a peer loss. */
  peerProbeFailures: number;
  // Merged port (--rpc-port) caps and timeouts (hydra-rpc HydraPortOptions).
  /** ggml-RPC sessions served at once (one host process each), and connections waiting for one. */
  rpcPoolSize: number;
  rpcQueueSize: number;
  /** A waiting ggml-RPC connection is closed after this. */
  rpcQueueTimeoutMs: number;
  /** ggml-RPC sessions one source address runs at once; its further ones wait (0: the pool size - 1, at least 1). */
  rpcMaxPerSource: number;
  /** Open merged-port connections in all, and from one source address. */
  portMaxConnections: number;
  portMaxConnectionsPerSource: number;
  /** Hydra sessions in all, from one source address, and how long one may stay idle. */
  hydraMaxSessions: number;
  hydraMaxSessionsPerSource: number;
  hydraIdleTimeoutMs: number;
  /** Per-session limits of every ggml-RPC session (native-ggml serveRpcFd's `limits`); unset keep their defaults. */
  rpcLimits: Record<string, number>;
  /** MiB each device keeps free beyond a plan (`--fit-target`); 0 by default. */
  fitTargetMib: number;
  /** The device `auto` splits favour (`--fit-prefer`); the local one by default. */
  fitPrefer: string | undefined;
  // HTTP and control-plane hardening (http.ts HttpOptions, control/controller.ts ControllerOptions).
  /** Keys read from `--api-key-file` (one a line, `#` comments), accepted besides `--api-key`'s. */
  apiKeysFromFile: string[];
  /** Open HTTP connections in all, and from one source address. */
  httpMaxConnections: number;
  httpMaxConnectionsPerSource: number;
  /** Idle keep-alive connections close after this; headers must arrive within headersTimeoutMs. */
  keepAliveTimeoutMs: number;
  headersTimeoutMs: number;
  /** Prompt bytes and chat messages per request (0: sized from a slot's n_ctx). */
  maxPromptBytes: number;
  maxMessages: number;
  /** An unfinished STATE_PUT (or unread STATE_GET snapshot) is dropped after this idle time. */
  stateTimeoutMs: number;
  /** Bytes all unfinished STATE_PUT uploads may declare together. */
  maxStateUploadBytes: number;
  // llama-server's server settings (http.ts HttpOptions, routes/).
  /** `--alias a,b`: the model's names (the first one in answers). */
  aliases: string[];
  /** `--slot-save-path`: the folder of slot save/restore files (unset: slot actions answer 501). */
  slotSavePath: string | undefined;
  /** `--slots` / `--no-slots`: `GET /slots`. */
  slotsEndpoint: boolean;
  /** `--cors-origins`, `--cors-methods`, `--cors-headers`, `--cors-credentials`. */
  corsOrigins: string;
  corsMethods: string;
  corsHeaders: string;
  corsCredentials: boolean;
  /** `--cache-prompt` (default) / `--no-cache-prompt`: a request's `cache_prompt` when it sends none. */
  cachePrompt: boolean;
  /** `--chat-template` / `--chat-template-file`: the template instead of the model's. */
  chatTemplate: string | undefined;
  /** `--jinja` (default) / `--no-jinja`: llama.cpp's common chat layer, or its legacy renderer. */
  jinja: boolean;
  /** `--reasoning-format`: none, auto (default), deepseek, deepseek-legacy. */
  reasoningFormat: string;
  /** `--chat-template-kwargs`: a JSON object of template variables (text as given). */
  chatTemplateKwargs: string | undefined;
}

export interface ServeArgs {
  layers: ConfigLayers;
  registry: ModelRegistry | undefined;
  settings: ServeSettings;
  help: boolean;
  version: boolean;
  /** Startup keys taken from the registry entry of the `-m` alias, as `key -> registry:ALIAS`. */
  defaultsApplied: Record<string, string>;
}

type Kind = 'string' | 'int' | 'number' | 'list' | 'numbers' | 'flag' | 'repeat' | 'file' | 'bias';
/** One flag: its names, the registry key (or `@setting`) it sets, how its value reads. */
export interface FlagSpec {
  names: string[];
  key: string;
  kind: Kind;
  help: string;
  /** Value of a flag given without one (`-fa`). */
  bare?: unknown;
  values?: string[];
  /** List separator (default `,`). */
  split?: string;
}

/** llama.cpp's flag names where they exist, mapped to common_params keys (tiering registry). */
export const FLAGS: FlagSpec[] = [
  {
    names: ['-m', '--model'],
    key: 'model',
    kind: 'string',
    help: 'GGUF path or registry alias (optional: boot empty)',
  },
  { names: ['--host'], key: 'host', kind: 'string', help: 'HTTP bind address (default 127.0.0.1)' },
  { names: ['--port'], key: 'port', kind: 'int', help: 'HTTP port (default 8080; 0 = any)' },
  {
    names: ['--rpc-port'],
    key: 'rpc_port',
    kind: 'int',
    help: 'merged ggml-RPC + Hydra port (default 0 = off)',
  },
  {
    names: ['--control-allow-from'],
    key: 'control_allow_from',
    kind: 'list',
    help: 'CIDR list allowed on --rpc-port (default loopback)',
  },
  {
    names: ['--api-key'],
    key: 'api_key',
    kind: 'string',
    help: 'require "Authorization: Bearer KEY" on the API',
  },
  {
    names: ['-c', '--ctx-size'],
    key: 'n_ctx',
    kind: 'int',
    help: 'context size, all slots together (0 = from the model)',
  },
  { names: ['-b', '--batch-size'], key: 'n_batch', kind: 'int', help: 'logical batch size' },
  { names: ['-ub', '--ubatch-size'], key: 'n_ubatch', kind: 'int', help: 'physical batch size' },
  {
    names: ['-kvu', '--kv-unified'],
    key: 'kv_unified',
    kind: 'flag',
    bare: true,
    help: 'one KV buffer shared by all slots',
  },
  {
    names: ['-np', '--parallel'],
    key: 'n_parallel',
    kind: 'int',
    help: 'slots (sequences decoded together)',
  },
  { names: ['-t', '--threads'], key: 'cpuparams.n_threads', kind: 'int', help: 'CPU threads for generation' },
  {
    names: ['-tb', '--threads-batch'],
    key: 'cpuparams_batch.n_threads',
    kind: 'int',
    help: 'CPU threads for prompts',
  },
  {
    names: ['-fa', '--flash-attn'],
    key: 'flash_attn',
    kind: 'string',
    bare: 'on',
    values: ['on', 'off', 'auto'],
    help: 'flash attention on|off|auto',
  },
  { names: ['-ctk', '--cache-type-k'], key: 'cache_type_k', kind: 'string', help: 'KV cache type for K' },
  { names: ['-ctv', '--cache-type-v'], key: 'cache_type_v', kind: 'string', help: 'KV cache type for V' },
  {
    names: ['-ngl', '--n-gpu-layers', '--gpu-layers'],
    key: 'n_gpu_layers',
    kind: 'int',
    help: 'layers to offload (counting the output layer)',
  },
  { names: ['-sm', '--split-mode'], key: 'split_mode', kind: 'string', help: 'none|layer|row' },
  {
    names: ['-ts', '--tensor-split'],
    key: 'tensor_split',
    kind: 'numbers',
    help: 'split proportions, e.g. 3,1',
  },
  { names: ['-mg', '--main-gpu'], key: 'main_gpu', kind: 'int', help: 'main device index' },
  {
    names: ['-dev', '--device'],
    key: 'devices',
    kind: 'list',
    help: 'devices to offload to, e.g. CUDA0,RPC0',
  },
  { names: ['--rpc'], key: 'rpc_servers', kind: 'list', help: 'ggml-RPC peers host:port,...' },
  {
    names: ['-ot', '--override-tensor'],
    key: 'override_tensors',
    kind: 'repeat',
    help: '<regex>=<buffer type>,... (repeatable)',
  },
  {
    names: ['--n-cpu-moe', '-ncmoe'],
    key: 'n_cpu_moe',
    kind: 'int',
    help: 'keep the experts of the first N layers on the CPU',
  },
  { names: ['--override-kv'], key: 'kv_overrides', kind: 'repeat', help: 'KEY=TYPE:VALUE (repeatable)' },
  { names: ['--mlock'], key: 'use_mlock', kind: 'flag', bare: true, help: 'lock the model in RAM' },
  {
    names: ['--no-mmap'],
    key: 'use_mmap',
    kind: 'flag',
    bare: false,
    help: 'read the model instead of mapping it',
  },
  { names: ['-s', '--seed'], key: 'seed', kind: 'int', help: 'default sampling seed (-1 = random)' },
  {
    names: ['-n', '--n-predict'],
    key: 'n_predict',
    kind: 'int',
    help: 'default max tokens (-1 = until the context is full)',
  },
  { names: ['--temp'], key: 'sampling.temp', kind: 'number', help: 'default temperature' },
  { names: ['--top-k'], key: 'sampling.top_k', kind: 'int', help: 'default top-k' },
  { names: ['--top-p'], key: 'sampling.top_p', kind: 'number', help: 'default top-p' },
  { names: ['--min-p'], key: 'sampling.min_p', kind: 'number', help: 'default min-p' },
  {
    names: ['--repeat-penalty'],
    key: 'sampling.penalty_repeat',
    kind: 'number',
    help: 'default repeat penalty',
  },
  {
    names: ['--repeat-last-n'],
    key: 'sampling.penalty_last_n',
    kind: 'int',
    help: 'tokens the repeat penalty looks back',
  },
  {
    names: ['--config'],
    key: '@config',
    kind: 'string',
    help: 'YAML file: startup defaults (common_params keys), models:, hydra:',
  },
  {
    names: ['--max-queue'],
    key: '@maxQueue',
    kind: 'int',
    help: 'requests waiting for a slot before 429 (default 64)',
  },
  {
    names: ['--max-body-bytes'],
    key: '@maxBodyBytes',
    kind: 'int',
    help: 'largest request body (default 8 MiB)',
  },
  {
    names: ['--body-timeout-ms'],
    key: '@bodyTimeoutMs',
    kind: 'int',
    help: 'time allowed to send a request body (default 10000)',
  },
  // HTTP and control-plane hardening (settings; see ServeSettings).
  {
    names: ['--api-key-file'],
    key: '@apiKeyFile',
    kind: 'string',
    help: 'file of API keys, one a line (# comments), accepted besides --api-key',
  },
  {
    names: ['--http-max-connections'],
    key: '@httpMaxConnections',
    kind: 'int',
    help: 'open HTTP connections before 503 (default 1024)',
  },
  {
    names: ['--http-max-connections-per-source'],
    key: '@httpMaxConnectionsPerSource',
    kind: 'int',
    help: 'open HTTP connections from one address (default 256)',
  },
  {
    names: ['--keep-alive-timeout-ms'],
    key: '@keepAliveTimeoutMs',
    kind: 'int',
    help: 'idle keep-alive HTTP connections close after this (default 5000)',
  },
  {
    names: ['--headers-timeout-ms'],
    key: '@headersTimeoutMs',
    kind: 'int',
    help: 'request headers must arrive within this, idle new connections included (default 10000)',
  },
  {
    names: ['--max-prompt-bytes'],
    key: '@maxPromptBytes',
    kind: 'int',
    help: 'largest prompt or chat text in bytes (default 0: max(1 MiB, 64 x slot n_ctx))',
  },
  {
    names: ['--max-messages'],
    key: '@maxMessages',
    kind: 'int',
    help: 'most chat messages per request (default 0: max(256, slot n_ctx / 2))',
  },
  {
    names: ['--state-timeout-ms'],
    key: '@stateTimeoutMs',
    kind: 'int',
    help: 'an unfinished STATE_PUT/STATE_GET transfer is dropped after this idle time (default 60000)',
  },
  {
    names: ['--max-state-upload-bytes'],
    key: '@maxStateUploadBytes',
    kind: 'int',
    help: 'bytes all unfinished STATE_PUT uploads may declare together (default 1 GiB)',
  },
  {
    names: ['--progress'],
    key: '@progress',
    kind: 'string',
    values: ['auto', 'bar', 'lines', 'off'],
    help: 'load progress: auto|bar|lines|off',
  },
  {
    names: ['--rpc-weights'],
    key: '@rpcWeights',
    kind: 'repeat',
    help: 'GGUF a head may load through --rpc-port: its tensors are read here, not sent (repeatable)',
  },
  {
    names: ['--no-configure-rpc-weights'],
    key: '@configureRpcWeights',
    kind: 'flag',
    bare: false,
    help: 'refuse CONFIGURE rpc_weights (a head naming the GGUF it loads, to index before it does)',
  },
  // Merged port caps and timeouts (settings; see ServeSettings).
  {
    names: ['--rpc-pool-size'],
    key: '@rpcPoolSize',
    kind: 'int',
    help: 'ggml-RPC sessions served at once, one host process each (default 4)',
  },
  {
    names: ['--rpc-queue-size'],
    key: '@rpcQueueSize',
    kind: 'int',
    help: 'ggml-RPC connections waiting for a host (default 64)',
  },
  {
    names: ['--rpc-queue-timeout-ms'],
    key: '@rpcQueueTimeoutMs',
    kind: 'int',
    help: 'a waiting ggml-RPC connection is closed after this (default 30000)',
  },
  {
    names: ['--rpc-max-per-source'],
    key: '@rpcMaxPerSource',
    kind: 'int',
    help: 'ggml-RPC sessions one address runs at once, the rest wait (default 0: pool size - 1)',
  },
  {
    names: ['--rpc-port-max-connections'],
    key: '@portMaxConnections',
    kind: 'int',
    help: 'open --rpc-port connections, both protocols (default 1024)',
  },
  {
    names: ['--rpc-port-max-connections-per-source'],
    key: '@portMaxConnectionsPerSource',
    kind: 'int',
    help: 'open --rpc-port connections from one address (default 128)',
  },
  {
    names: ['--hydra-max-sessions'],
    key: '@hydraMaxSessions',
    kind: 'int',
    help: 'Hydra control sessions on --rpc-port (default 512)',
  },
  {
    names: ['--hydra-max-sessions-per-source'],
    key: '@hydraMaxSessionsPerSource',
    kind: 'int',
    help: 'Hydra control sessions from one address (default 64)',
  },
  {
    names: ['--hydra-idle-timeout-ms'],
    key: '@hydraIdleTimeoutMs',
    kind: 'int',
    help: 'a Hydra session that sends no frame for this long is closed (default 300000)',
  },
  {
    names: ['--fit-target', '-fitt'],
    key: '@fitTargetMib',
    kind: 'int',
    help: 'MiB every device keeps free beyond the planned weights, KV and compute (default 0)',
  },
  {
    names: ['--fit-prefer'],
    key: '@fitPrefer',
    kind: 'string',
    help: 'the device tensor_split/n_gpu_layers auto give the most layers (default the local one)',
  },
  {
    names: ['--device-memory-cap'],
    key: 'device_memory_cap',
    kind: 'repeat',
    help: 'NAME=MiB: plan at most this much on a device (CPU: host memory; repeatable)',
  },
  {
    names: ['--rpc-limit'],
    key: '@rpcLimits',
    kind: 'repeat',
    help: `NAME=N: a ggml-RPC session limit (repeatable; ${SERVE_LIMIT_KEYS.join(', ')})`,
  },
  // COMBINE failover (registry keys; combine/failover.ts, combine/rejoin.ts).
  {
    names: ['--failover-policy'],
    key: 'failover_policy',
    kind: 'string',
    values: ['auto', 'solo', 'offload', 'none'],
    help: 'after a peer loss: auto (solo when it fits the local device, else offload), solo, offload, none',
  },
  {
    names: ['--no-peer-rejoin'],
    key: 'peer_rejoin',
    kind: 'flag',
    bare: false,
    help: 'do not probe a lost peer and restore COMBINE when it answers again',
  },
  // Peer watchdog (settings; see ServeSettings).
  {
    names: ['--peer-stall-ms'],
    key: '@peerStallMs',
    kind: 'int',
    help: 'no decode progress this long with a step in flight is a peer loss (default 15000)',
  },
  {
    names: ['--peer-probe-interval-ms'],
    key: '@peerProbeIntervalMs',
    kind: 'int',
    help: 'peer watchdog check and HELLO probe period (default 1000)',
  },
  {
    names: ['--peer-probe-timeout-ms'],
    key: '@peerProbeTimeoutMs',
    kind: 'int',
    help: 'HELLO probe timeout (default 1000)',
  },
  {
    names: ['--peer-probe-failures'],
    key: '@peerProbeFailures',
    kind: 'int',
    help: 'failed HELLO probes in a row that are a peer loss (default 2)',
  },
  // llama-server's server settings (see ServeSettings).
  {
    names: ['-a', '--alias'],
    key: '@aliases',
    kind: 'list',
    help: 'model names in answers and /v1/models (comma-separated; default: the file name)',
  },
  {
    names: ['--slot-save-path'],
    key: '@slotSavePath',
    kind: 'string',
    help: 'folder of /slots/{id}?action=save|restore files (default: slot actions off)',
  },
  { names: ['--slots'], key: '@slotsEndpoint', kind: 'flag', bare: true, help: 'serve GET /slots (default)' },
  {
    names: ['--no-slots'],
    key: '@slotsEndpoint',
    kind: 'flag',
    bare: false,
    help: 'do not serve GET /slots',
  },
  {
    names: ['--cors-origins'],
    key: '@corsOrigins',
    kind: 'string',
    help: "allowed CORS origins (default *; 'localhost': reflect a localhost Origin only)",
  },
  {
    names: ['--cors-methods'],
    key: '@corsMethods',
    kind: 'string',
    help: 'CORS allowed methods (default GET, POST, DELETE, OPTIONS)',
  },
  {
    names: ['--cors-headers'],
    key: '@corsHeaders',
    kind: 'string',
    help: 'CORS allowed headers (default *)',
  },
  {
    names: ['--cors-credentials'],
    key: '@corsCredentials',
    kind: 'flag',
    bare: true,
    help: 'allow credentials (default; with * the Origin is echoed)',
  },
  {
    names: ['--no-cors-credentials'],
    key: '@corsCredentials',
    kind: 'flag',
    bare: false,
    help: 'do not allow credentials',
  },
  // Operation: load failures, shutdown and logs (settings; see ServeSettings).
  {
    names: ['--keep-up-on-load-failure'],
    key: '@keepUpOnLoadFailure',
    kind: 'flag',
    bare: true,
    help: 'stay up (state error, /health 503) when the start-up load fails; default: print the cause, exit 1',
  },
  {
    names: ['--shutdown-timeout'],
    key: '@shutdownTimeoutS',
    kind: 'int',
    help: 'seconds running requests get to finish after SIGTERM (default 10)',
  },
  {
    names: ['--log-format'],
    key: '@logFormat',
    kind: 'string',
    help: 'log lines: json|text|auto (default auto: text on a TTY, else JSON)',
  },
  {
    names: ['--log-level'],
    key: '@logLevel',
    kind: 'string',
    help: 'trace|debug|info|warn|error|fatal|silent (default info)',
  },
  {
    names: ['--log-file'],
    key: '@logFile',
    kind: 'string',
    help: 'also write every log line (JSON) to this file',
  },
  ...LLAMA_FLAGS,
  { names: ['-h', '--help'], key: '@help', kind: 'flag', bare: true, help: 'this help' },
  { names: ['--version'], key: '@version', kind: 'flag', bare: true, help: 'print the version' },
];

/** Help text for `hydra-engine [serve]`. */
export function usage(): string {
  const envOf = (f: FlagSpec) => ENV_BY_KEY[f.key]?.replace(/^!/, '');
  const rows = HELP_GROUPS.flatMap(([group, title]) => [
    '',
    title,
    ...FLAGS.filter((f) => flagGroup(f) === group).map((f) => {
      const env = f.bare === false ? undefined : envOf(f);
      return `  ${f.names.join(', ').padEnd(34)} ${f.help}${env ? ` (env: ${env})` : ''}`;
    }),
  ]);
  const refused = UNSUPPORTED_FLAGS.map((f) => f.names.join(', ')).join(' | ');
  return [
    'usage: hydra-engine [serve] [flags]',
    '       hydra-engine synth-model --out FILE [--arch ..] [--shape ..] [--quant ..] [--seed N]',
    '       hydra-engine plan --model FILE --device NAME=FREE_MIB ... [--ctx N] [--cache-type-k T] [--json]',
    '       hydra-engine bench-client --url URL [--requests N] [--concurrency N] [--max-tokens N]',
    '       hydra-engine demo',
    '',
    'flags (llama-server names; also --flag=value; LLAMA_ARG_* variables apply when a flag is not given):',
    ...rows,
    '',
    `not supported yet (exit 2): ${refused}`,
  ].join('\n');
}

function bad(flag: string, message: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_ARGUMENT', message, { keys: [flag] });
}

function convert(spec: FlagSpec, flag: string, raw: string): unknown {
  switch (spec.kind) {
    case 'int': {
      // llama-server's words: -ngl auto|all, -np auto. -ngl auto: the planner picks the most
      // layers that fit (placement.ts resolveAuto), as upstream's --fit does for it.
      if (spec.key === 'n_gpu_layers' && (raw === 'auto' || raw === 'all'))
        return raw === 'auto' ? 'auto' : -2;
      if (spec.key === 'n_parallel' && raw === 'auto') return -1;
      if (!/^-?\d+$/.test(raw)) throw bad(flag, `${flag} needs an integer, got ${JSON.stringify(raw)}`);
      return Number(raw);
    }
    case 'number': {
      const n = Number(raw);
      if (raw.trim() === '' || !Number.isFinite(n))
        throw bad(flag, `${flag} needs a number, got ${JSON.stringify(raw)}`);
      return n;
    }
    case 'numbers':
      // -ts auto: the planner's split (placement.ts resolveAuto).
      if (spec.key === 'tensor_split' && raw === 'auto') return 'auto';
      return raw.split(/[,/]/).map((s) => convert({ ...spec, kind: 'number' }, flag, s));
    case 'list':
    case 'repeat':
      return raw.split(spec.split ?? ',').filter((s) => s.length > 0);
    case 'file':
      try {
        return readFileSync(raw, 'utf8');
      } catch (err) {
        throw bad(flag, `${flag}: cannot read ${raw}: ${(err as Error).message}`);
      }
    case 'bias': {
      // llama-server's TOKEN_ID(+|-)BIAS.
      const m = /^(\d+)([+-](?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)$/.exec(raw);
      if (!m) throw bad(flag, `${flag} needs TOKEN_ID+BIAS or TOKEN_ID-BIAS, got ${JSON.stringify(raw)}`);
      return { [m[1]!]: Number(m[2]) };
    }
    default:
      if (spec.values && !spec.values.includes(raw)) {
        throw bad(flag, `${flag} must be one of ${spec.values.join(', ')}, got ${JSON.stringify(raw)}`);
      }
      return raw;
  }
}

/** Parses flags into raw values keyed by field key (`@`-keys are engine settings). */
export function parseFlags(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>> = {},
): Map<string, unknown> {
  const out = new Map<string, unknown>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.startsWith('--') ? arg.indexOf('=') : -1;
    const name = eq > 0 ? arg.slice(0, eq) : arg;
    const spec = FLAGS.find((f) => f.names.includes(name));
    const refused = spec ? undefined : UNSUPPORTED_FLAGS.find((f) => f.names.includes(name));
    if (refused) throw bad(name, `${name} is not supported yet: ${refused.why}`);
    if (!spec)
      throw bad(
        name,
        arg.startsWith('-') ? `unknown flag ${name}` : `unexpected argument ${JSON.stringify(arg)}`,
      );
    let value: unknown;
    if (spec.kind === 'flag') {
      if (eq > 0) throw bad(name, `${name} takes no value`);
      value = spec.bare;
    } else {
      let raw: string | undefined;
      if (eq > 0) raw = arg.slice(eq + 1);
      else {
        const next = argv[i + 1];
        const looksLikeValue = next !== undefined && (!next.startsWith('-') || /^-\d/.test(next));
        if (spec.bare !== undefined && (!looksLikeValue || (spec.values && !spec.values.includes(next!))))
          raw = undefined;
        else if (looksLikeValue) {
          raw = next;
          i++;
        }
      }
      if (raw === undefined) {
        if (spec.bare === undefined) throw bad(name, `${name} needs a value`);
        value = spec.bare;
      } else value = convert(spec, name, raw);
    }
    if (spec.key === '@same') continue;
    if (spec.kind === 'repeat') {
      out.set(spec.key, [...((out.get(spec.key) as string[]) ?? []), ...(value as string[])]);
    } else if (spec.kind === 'bias') {
      out.set(spec.key, { ...((out.get(spec.key) as object) ?? {}), ...(value as object) });
    } else {
      if (out.has(spec.key)) throw bad(name, `${name} given twice`);
      out.set(spec.key, value);
    }
  }
  readEnv(out, env);
  return out;
}

// llama-server's LLAMA_ARG_* variables: a flag on the command line wins; a variable of a feature
// that does not exist yet is refused as its flag is (a falsy one asks for what already runs).
function readEnv(out: Map<string, unknown>, env: Readonly<Record<string, string | undefined>>): void {
  for (const f of UNSUPPORTED_FLAGS) {
    const raw = f.env !== undefined ? env[f.env] : undefined;
    if (raw === undefined || raw === '' || (!f.takesValue && envBool(raw) === false)) continue;
    throw bad(f.env!, `${f.env} (${f.names.at(-1)}) is not supported yet: ${f.why}`);
  }
  for (const [key, named] of Object.entries(ENV_BY_KEY)) {
    const inverted = named.startsWith('!');
    const name = inverted ? named.slice(1) : named;
    const raw = env[name];
    if (raw === undefined || out.has(key)) continue;
    const spec = FLAGS.find((f) => f.key === key && f.bare !== false) ?? FLAGS.find((f) => f.key === key)!;
    if (spec.kind === 'flag') {
      const on = envBool(raw);
      if (on === undefined)
        throw bad(name, `${name} must be true|false|1|0|on|off|enabled|disabled, got ${JSON.stringify(raw)}`);
      out.set(key, inverted ? !on : on);
    } else out.set(key, convert(spec, name, raw));
  }
}

function configError(file: string, message: string, cause?: unknown): HydraError {
  return new HydraError('HYDRA_ERR_CONFIG_INVALID', `${file}: ${message}`, { keys: [file], cause });
}

/** Reads the `--config` YAML: common_params keys (nested or dotted), `models:` and `hydra:`. */
export function readConfigFile(file: string): {
  params: Params;
  registry: ModelRegistry | undefined;
  hydra: Record<string, unknown>;
} {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw configError(file, `cannot read: ${(err as Error).message}`, err);
  }
  let doc: unknown;
  try {
    doc = parseYaml(text) ?? {};
  } catch (err) {
    throw configError(file, (err as Error).message, err);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc))
    throw configError(file, 'the top level must be a map');
  const { models, hydra, ...rest } = doc as Record<string, unknown>;
  let registry: ModelRegistry | undefined;
  if (models !== undefined) {
    try {
      registry = ModelRegistry.parse(text, file);
    } catch (err) {
      throw configError(file, (err as Error).message, err);
    }
  }
  if (hydra !== undefined && (typeof hydra !== 'object' || hydra === null || Array.isArray(hydra))) {
    throw configError(file, 'hydra: must be a map');
  }
  let params: Params;
  try {
    params = normalize(rest, { allowT4: true });
  } catch (err) {
    const e = err as HydraError;
    throw new HydraError('HYDRA_ERR_CONFIG_INVALID', `${file}: ${e.message}`, {
      keys: e.keys ?? [],
      cause: err,
    });
  }
  return { params, registry, hydra: (hydra as Record<string, unknown>) ?? {} };
}

const SETTING_KEYS: Record<string, keyof ServeSettings> = {
  '@keepUpOnLoadFailure': 'keepUpOnLoadFailure',
  keep_up_on_load_failure: 'keepUpOnLoadFailure',
  '@shutdownTimeoutS': 'shutdownTimeoutS',
  shutdown_timeout: 'shutdownTimeoutS',
  '@logFormat': 'logFormat',
  log_format: 'logFormat',
  '@logLevel': 'logLevel',
  log_level: 'logLevel',
  '@logFile': 'logFile',
  log_file: 'logFile',
  '@maxQueue': 'maxQueue',
  '@maxBodyBytes': 'maxBodyBytes',
  '@bodyTimeoutMs': 'bodyTimeoutMs',
  '@progress': 'progress',
  max_queue: 'maxQueue',
  max_body_bytes: 'maxBodyBytes',
  body_timeout_ms: 'bodyTimeoutMs',
  progress: 'progress',
  '@rpcWeights': 'rpcWeights',
  rpc_weights: 'rpcWeights',
  '@configureRpcWeights': 'configureRpcWeights',
  configure_rpc_weights: 'configureRpcWeights',
  '@peerStallMs': 'peerStallMs',
  peer_stall_ms: 'peerStallMs',
  '@peerProbeIntervalMs': 'peerProbeIntervalMs',
  peer_probe_interval_ms: 'peerProbeIntervalMs',
  '@peerProbeTimeoutMs': 'peerProbeTimeoutMs',
  peer_probe_timeout_ms: 'peerProbeTimeoutMs',
  '@peerProbeFailures': 'peerProbeFailures',
  peer_probe_failures: 'peerProbeFailures',
  '@apiKeyFile': 'apiKeysFromFile',
  api_key_file: 'apiKeysFromFile',
  '@httpMaxConnections': 'httpMaxConnections',
  http_max_connections: 'httpMaxConnections',
  '@httpMaxConnectionsPerSource': 'httpMaxConnectionsPerSource',
  http_max_connections_per_source: 'httpMaxConnectionsPerSource',
  '@keepAliveTimeoutMs': 'keepAliveTimeoutMs',
  keep_alive_timeout_ms: 'keepAliveTimeoutMs',
  '@headersTimeoutMs': 'headersTimeoutMs',
  headers_timeout_ms: 'headersTimeoutMs',
  '@maxPromptBytes': 'maxPromptBytes',
  max_prompt_bytes: 'maxPromptBytes',
  '@maxMessages': 'maxMessages',
  max_messages: 'maxMessages',
  '@stateTimeoutMs': 'stateTimeoutMs',
  state_timeout_ms: 'stateTimeoutMs',
  '@maxStateUploadBytes': 'maxStateUploadBytes',
  max_state_upload_bytes: 'maxStateUploadBytes',
  '@rpcPoolSize': 'rpcPoolSize',
  rpc_pool_size: 'rpcPoolSize',
  '@rpcQueueSize': 'rpcQueueSize',
  rpc_queue_size: 'rpcQueueSize',
  '@rpcQueueTimeoutMs': 'rpcQueueTimeoutMs',
  rpc_queue_timeout_ms: 'rpcQueueTimeoutMs',
  '@rpcMaxPerSource': 'rpcMaxPerSource',
  rpc_max_per_source: 'rpcMaxPerSource',
  '@portMaxConnections': 'portMaxConnections',
  rpc_port_max_connections: 'portMaxConnections',
  '@portMaxConnectionsPerSource': 'portMaxConnectionsPerSource',
  rpc_port_max_connections_per_source: 'portMaxConnectionsPerSource',
  '@hydraMaxSessions': 'hydraMaxSessions',
  hydra_max_sessions: 'hydraMaxSessions',
  '@hydraMaxSessionsPerSource': 'hydraMaxSessionsPerSource',
  hydra_max_sessions_per_source: 'hydraMaxSessionsPerSource',
  '@hydraIdleTimeoutMs': 'hydraIdleTimeoutMs',
  hydra_idle_timeout_ms: 'hydraIdleTimeoutMs',
  '@aliases': 'aliases',
  alias: 'aliases',
  '@slotSavePath': 'slotSavePath',
  slot_save_path: 'slotSavePath',
  '@slotsEndpoint': 'slotsEndpoint',
  slots: 'slotsEndpoint',
  '@corsOrigins': 'corsOrigins',
  cors_origins: 'corsOrigins',
  '@corsMethods': 'corsMethods',
  cors_methods: 'corsMethods',
  '@corsHeaders': 'corsHeaders',
  cors_headers: 'corsHeaders',
  '@corsCredentials': 'corsCredentials',
  cors_credentials: 'corsCredentials',
  '@cachePrompt': 'cachePrompt',
  cache_prompt: 'cachePrompt',
  '@chatTemplate': 'chatTemplate',
  chat_template: 'chatTemplate',
  '@jinja': 'jinja',
  jinja: 'jinja',
  '@reasoningFormat': 'reasoningFormat',
  reasoning_format: 'reasoningFormat',
  '@chatTemplateKwargs': 'chatTemplateKwargs',
  chat_template_kwargs: 'chatTemplateKwargs',
  '@rpcLimits': 'rpcLimits',
  '@fitTargetMib': 'fitTargetMib',
  fit_target: 'fitTargetMib',
  '@fitPrefer': 'fitPrefer',
  fit_prefer: 'fitPrefer',
  rpc_limits: 'rpcLimits',
};

/**
 * `--rpc-limit NAME=N` (repeatable) or YAML `rpc_limits: {NAME: N}`: known names only, positive
 * integers (idleTimeoutMs may be 0), refused here at start rather than by every session.
 */
function parseRpcLimits(value: unknown, where: string, key: string): Record<string, number> {
  const code = key.startsWith('@') ? 'HYDRA_ERR_BAD_ARGUMENT' : 'HYDRA_ERR_CONFIG_INVALID';
  const entries: [string, unknown][] = [];
  if (Array.isArray(value)) {
    for (const item of value) {
      const m = typeof item === 'string' ? /^([A-Za-z]+)=(.*)$/.exec(item) : null;
      if (!m)
        throw new HydraError(code, `${where}: --rpc-limit takes NAME=N, got ${JSON.stringify(item)}`, {
          keys: [key],
        });
      entries.push([m[1]!, /^\d+$/.test(m[2]!) ? Number(m[2]) : m[2]]);
    }
  } else if (typeof value === 'object' && value !== null) {
    entries.push(...Object.entries(value));
  } else {
    throw new HydraError(code, `${where}: rpc_limits must be a map of limit names to integers`, {
      keys: [key],
    });
  }
  const out: Record<string, number> = {};
  for (const [name, n] of entries) {
    if (!(SERVE_LIMIT_KEYS as readonly string[]).includes(name)) {
      throw new HydraError(
        code,
        `${where}: unknown ggml-RPC session limit ${name} (known: ${SERVE_LIMIT_KEYS.join(', ')})`,
        {
          keys: [key],
        },
      );
    }
    // the rule of serveRpcFd's own option check: 0 means "never" for idleTimeoutMs only
    const least = name === 'idleTimeoutMs' ? 0 : 1;
    if (!Number.isSafeInteger(n) || (n as number) < least) {
      throw new HydraError(
        code,
        `${where}: ggml-RPC session limit ${name} must be a ${least === 0 ? 'non-negative' : 'positive'} integer`,
        { keys: [key] },
      );
    }
    out[name] = n as number;
  }
  return out;
}

/** Settings that are strings or booleans (aliases is a list; most others are integers). */
const STRING_SETTINGS = new Set<keyof ServeSettings>([
  'fitPrefer',
  'chatTemplate',
  'slotSavePath',
  'corsOrigins',
  'corsMethods',
  'corsHeaders',
]);
const BOOL_SETTINGS = new Set<keyof ServeSettings>([
  'configureRpcWeights',
  'slotsEndpoint',
  'corsCredentials',
  'cachePrompt',
  'jinja',
]);

/** Settings that take one of a few words. */
const OPERATION_CHOICES: Partial<Record<keyof ServeSettings, readonly string[]>> = {
  logFormat: ['auto', 'json', 'text'],
  logLevel: ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'],
  reasoningFormat: ['none', 'auto', 'deepseek', 'deepseek-legacy'],
};

/** Settings for which 0 is valid (a queue of none, or "derive the default"). */
const ZERO_OK = new Set<keyof ServeSettings>([
  'fitTargetMib',
  'maxQueue',
  'maxPromptBytes',
  'maxMessages',
  'rpcQueueSize',
  'rpcMaxPerSource',
]);

/** Reads an `--api-key-file` as llama-server does: one key a line, blank and `#` lines skipped. */
function readApiKeyFile(file: unknown, where: string, key: string): string[] {
  const code = key.startsWith('@') ? 'HYDRA_ERR_BAD_ARGUMENT' : 'HYDRA_ERR_CONFIG_INVALID';
  if (typeof file !== 'string' || file === '')
    throw new HydraError(code, `${where}: api_key_file must be a file path`, { keys: [key] });
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new HydraError(code, `${where}: cannot read the API key file ${file}: ${(err as Error).message}`, {
      keys: [key],
      cause: err,
    });
  }
  const keys = text
    .split('\n')
    .map((l) => l.replace(/\r$/, ''))
    .filter((l) => l !== '' && !l.startsWith('#'));
  if (keys.length === 0)
    throw new HydraError(code, `${where}: the API key file ${file} holds no key`, { keys: [key] });
  return keys;
}

/**
 * Parses `hydra-engine serve` flags and the `--config` file into the startup configuration layer
 * (CLI flags win over the file) and the engine's own settings. Every error is a HydraError with
 * `HYDRA_ERR_BAD_ARGUMENT` or `HYDRA_ERR_CONFIG_INVALID` (the CLI exits 2 on both).
 */
export function parseServeArgs(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>> = process.env,
): ServeArgs {
  const flags = parseFlags(argv, env);
  const settings: ServeSettings = {
    maxQueue: 64,
    keepUpOnLoadFailure: false,
    shutdownTimeoutS: 10,
    logFormat: 'auto',
    logLevel: 'info',
    logFile: undefined,
    maxBodyBytes: 8 << 20,
    bodyTimeoutMs: 10_000,
    progress: 'auto',
    rpcWeights: [],
    configureRpcWeights: true,
    peerStallMs: 15_000,
    peerProbeIntervalMs: 1000,
    peerProbeTimeoutMs: 1000,
    peerProbeFailures: 2,
    apiKeysFromFile: [],
    httpMaxConnections: 1024,
    httpMaxConnectionsPerSource: 256,
    keepAliveTimeoutMs: 5000,
    headersTimeoutMs: 10_000,
    maxPromptBytes: 0,
    maxMessages: 0,
    stateTimeoutMs: 60_000,
    maxStateUploadBytes: 1 << 30,
    rpcPoolSize: 4,
    rpcQueueSize: 64,
    rpcQueueTimeoutMs: 30_000,
    rpcMaxPerSource: 0,
    portMaxConnections: 1024,
    portMaxConnectionsPerSource: 128,
    hydraMaxSessions: 512,
    hydraMaxSessionsPerSource: 64,
    hydraIdleTimeoutMs: 300_000,
    aliases: [],
    slotSavePath: undefined,
    slotsEndpoint: true,
    corsOrigins: '*',
    corsMethods: 'GET, POST, DELETE, OPTIONS',
    corsHeaders: '*',
    corsCredentials: true,
    cachePrompt: true,
    chatTemplate: undefined,
    jinja: true,
    reasoningFormat: 'auto',
    chatTemplateKwargs: undefined,
    rpcLimits: {},
    fitTargetMib: 0,
    fitPrefer: undefined,
  };
  const file = flags.get('@config') as string | undefined;
  let fromFile: Params = {};
  let registry: ModelRegistry | undefined;
  const applySetting = (key: string, value: unknown, where: string) => {
    const name = SETTING_KEYS[key];
    if (!name)
      throw new HydraError('HYDRA_ERR_CONFIG_INVALID', `${where}: unknown setting ${key}`, { keys: [key] });
    const choices = OPERATION_CHOICES[name];
    if (choices || name === 'keepUpOnLoadFailure' || name === 'logFile') {
      const code = key.startsWith('@') ? 'HYDRA_ERR_BAD_ARGUMENT' : 'HYDRA_ERR_CONFIG_INVALID';
      const ok = choices
        ? choices.includes(value as string)
        : name === 'logFile'
          ? typeof value === 'string' && value.length > 0
          : typeof value === 'boolean';
      if (!ok) {
        const want = choices ? choices.join('|') : name === 'logFile' ? 'a file path' : 'true or false';
        throw new HydraError(code, `${where}: ${key.replace('@', '')} must be ${want}`, { keys: [key] });
      }
      settings[name] = value as never;
      return;
    }
    if (name === 'progress') {
      if (!['auto', 'bar', 'lines', 'off'].includes(value as string)) {
        throw new HydraError('HYDRA_ERR_CONFIG_INVALID', `${where}: progress must be auto|bar|lines|off`, {
          keys: [key],
        });
      }
      settings.progress = value as ServeSettings['progress'];
      return;
    }
    if (name === 'rpcWeights') {
      const files = Array.isArray(value) ? value : [value];
      if (!files.every((f) => typeof f === 'string' && f.length > 0)) {
        throw new HydraError('HYDRA_ERR_CONFIG_INVALID', `${where}: rpc_weights must be file paths`, {
          keys: [key],
        });
      }
      settings.rpcWeights.push(...(files as string[]));
      return;
    }
    if (name === 'rpcLimits') {
      Object.assign(settings.rpcLimits, parseRpcLimits(value, where, key));
      return;
    }
    if (name === 'apiKeysFromFile') {
      settings.apiKeysFromFile.push(...readApiKeyFile(value, where, key));
      return;
    }
    const code = key.startsWith('@') ? 'HYDRA_ERR_BAD_ARGUMENT' : 'HYDRA_ERR_CONFIG_INVALID';
    const shown = key.replace('@', '');
    if (name === 'aliases') {
      const list = typeof value === 'string' ? value.split(',').filter((a) => a.length > 0) : value;
      if (
        !Array.isArray(list) ||
        list.length === 0 ||
        !list.every((a) => typeof a === 'string' && a.length > 0)
      )
        throw new HydraError(code, `${where}: ${shown} must be non-empty names`, { keys: [key] });
      settings.aliases = list as string[];
      return;
    }
    if (name === 'chatTemplateKwargs') {
      // A YAML map is taken as is; a flag or variable gives JSON text.
      let kwargs: unknown = value;
      if (typeof value === 'string') {
        try {
          kwargs = JSON.parse(value);
        } catch {
          kwargs = undefined;
        }
      }
      if (typeof kwargs !== 'object' || kwargs === null || Array.isArray(kwargs))
        throw new HydraError(code, `${where}: ${shown} must be a JSON object`, { keys: [key] });
      settings.chatTemplateKwargs = JSON.stringify(kwargs);
      return;
    }
    if (STRING_SETTINGS.has(name)) {
      if (typeof value !== 'string' || value.length === 0)
        throw new HydraError(code, `${where}: ${shown} must be a non-empty string`, { keys: [key] });
      settings[name] = value as never;
      return;
    }
    if (BOOL_SETTINGS.has(name)) {
      if (typeof value !== 'boolean')
        throw new HydraError(code, `${where}: ${shown} must be true or false`, { keys: [key] });
      settings[name] = value as never;
      return;
    }
    const min = ZERO_OK.has(name) ? 0 : 1;
    if (!Number.isInteger(value) || (value as number) < min) {
      const code = key.startsWith('@') ? 'HYDRA_ERR_BAD_ARGUMENT' : 'HYDRA_ERR_CONFIG_INVALID';
      throw new HydraError(code, `${where}: ${key.replace('@', '')} must be an integer >= ${min}`, {
        keys: [key],
      });
    }
    settings[name] = value as never;
  };
  if (file !== undefined) {
    const cfg = readConfigFile(file);
    fromFile = cfg.params;
    registry = cfg.registry;
    for (const [k, v] of Object.entries(cfg.hydra)) applySetting(k, v, `${file}: hydra`);
  }
  const fromCli: Record<string, unknown> = {};
  for (const [k, v] of flags) {
    if (k === '@config' || k === '@help' || k === '@version') continue;
    if (k.startsWith('@')) applySetting(k, v, 'flags');
    else fromCli[k] = v;
  }
  // llama-server's -np auto: 4 slots over one unified KV buffer.
  if (fromCli.n_parallel === -1) {
    fromCli.n_parallel = 4;
    fromCli.kv_unified ??= true;
  }
  let cli: Params;
  try {
    cli = normalize(fromCli, { allowT4: true });
  } catch (err) {
    const e = err as HydraError;
    const keys = (e.keys ?? []).map((k) => FLAGS.find((f) => f.key === k)?.names.at(-1) ?? k);
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `bad flag value: ${e.message}`, { keys, cause: err });
  }
  // The merged port is off unless asked for (the registry's default is llama.cpp's 50052).
  const startup: Params = { rpc_port: 0, ...fromFile, ...cli };
  // A model chosen by alias brings its registry defaults: above the file's own keys, below flags.
  const entry = registry && typeof startup.model === 'string' ? registry.get(startup.model) : undefined;
  const defaultsApplied: Record<string, string> = {};
  for (const [key, value] of Object.entries(entry?.defaults ?? {})) {
    if (value === undefined || key in cli) continue;
    startup[key] = Array.isArray(value) ? [...value] : value;
    defaultsApplied[key] = `registry:${entry!.alias}`;
  }
  return {
    layers: new ConfigLayers(startup),
    registry,
    defaultsApplied,
    settings,
    help: flags.has('@help'),
    version: flags.has('@version'),
  };
}
