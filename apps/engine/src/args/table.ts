// The flag table of `hydra-engine serve`: llama.cpp's names where they exist, each mapped to a
// tiering registry key or an engine setting (`@name`, settings.ts), with how its value reads.
import { SERVE_LIMIT_KEYS } from '@hydra-engine/native-ggml/rpc-host';
import { LLAMA_FLAGS } from '../llama-flags.js';

export type Kind = 'string' | 'int' | 'number' | 'list' | 'numbers' | 'flag' | 'repeat' | 'file' | 'bias';
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
    names: ['--props'],
    key: '@propsEndpoint',
    kind: 'flag',
    bare: true,
    help: 'serve POST /props (llama-server changes no property through it; a body naming one is refused)',
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
