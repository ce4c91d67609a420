// The engine's own settings (not llama.cpp `common_params` fields): their defaults, their flag and
// YAML names, and the rules a value must meet; flags, LLAMA_ARG_* variables and `hydra:` share them.
import { readFileSync } from 'node:fs';
import { SERVE_LIMIT_KEYS } from '@hydra-engine/native-ggml/rpc-host';
import { HydraError } from '../errors.js';

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
  /** `--props`: `POST /props` (llama-server's; no property is settable, see routes/llama.ts). */
  propsEndpoint: boolean;
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

/** The settings an engine has when no flag, variable or `hydra:` key sets them. */
export function defaultSettings(): ServeSettings {
  return {
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
    propsEndpoint: false,
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
  '@propsEndpoint': 'propsEndpoint',
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
  'propsEndpoint',
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
 * Sets one engine setting from a flag (`@`-key, HYDRA_ERR_BAD_ARGUMENT) or a `hydra:` key of the
 * `--config` file (HYDRA_ERR_CONFIG_INVALID), after its rule; `where` starts the error message.
 */
export function applySetting(settings: ServeSettings, key: string, value: unknown, where: string): void {
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
}
