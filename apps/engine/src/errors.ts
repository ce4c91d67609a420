import {
  HydraError as BaseError,
  defineErrors,
  type HydraErrorOptions,
  httpStatusOf,
} from '@hydra-engine/errors';

/**
 * Every code this package throws or answers, declared once with the HTTP status the OpenAI routes
 * and the `/control` routes answer it with and its meaning. README.md's error table lists the same
 * codes (a test checks both ways). Codes the engine passes on from the resolver (GGUF checks) and
 * tiering (CONFIGURE validation) are declared here too, since the engine answers them.
 */
export const ERRORS = defineErrors({
  HYDRA_ERR_INTERNAL: { status: 500, meaning: 'an unexpected failure' },
  HYDRA_ERR_BAD_ARGUMENT: { status: 400, meaning: 'a bad CLI flag or value (keys names the flag)' },
  HYDRA_ERR_CONFIG_INVALID: { status: 400, meaning: 'the --config file cannot be read or is invalid' },
  HYDRA_ERR_NO_MODEL: { status: 503, meaning: 'no model is loaded' },
  HYDRA_ERR_LOADING: { status: 503, meaning: 'the model is still loading' },
  HYDRA_ERR_DRAINING: { status: 503, meaning: 'the engine is shutting down or rebuilding' },
  HYDRA_ERR_LOAD_FAILED: { status: 500, meaning: 'the model could not be loaded; /health says error' },
  HYDRA_ERR_BAD_JSON: { status: 400, meaning: 'the body is not JSON' },
  HYDRA_ERR_BAD_REQUEST: { status: 400, meaning: 'a field is missing or of the wrong shape (keys names it)' },
  HYDRA_ERR_BAD_VALUE: {
    status: 400,
    meaning: 'a T1 setting is out of range or of the wrong type (keys names the request field)',
  },
  HYDRA_ERR_BODY_TOO_LARGE: { status: 413, meaning: 'the body is over --max-body-bytes' },
  HYDRA_ERR_REQUEST_TIMEOUT: { status: 408, meaning: 'the body did not arrive within --body-timeout-ms' },
  HYDRA_ERR_QUEUE_FULL: { status: 429, meaning: 'every slot is busy and the queue is full' },
  HYDRA_ERR_PROMPT_TOO_LONG: { status: 400, meaning: 'the prompt does not fit a slot (n_ctx / n_parallel)' },
  HYDRA_ERR_UNAUTHORIZED: { status: 401, meaning: '--api-key is set and the request lacks it' },
  HYDRA_ERR_NOT_FOUND: { status: 404, meaning: 'no such route' },
  HYDRA_ERR_METHOD_NOT_ALLOWED: { status: 405, meaning: 'wrong method for the route' },
  HYDRA_ERR_CANCELLED: { status: 500, meaning: 'reserved: a request ended because its client left' },
  HYDRA_ERR_DECODE_FAILED: { status: 500, meaning: 'the native decode step failed; the requests in it end' },
  HYDRA_ERR_PEER_UNREACHABLE: { status: 502, meaning: 'an --rpc peer did not answer the ggml-RPC HELLO' },
  HYDRA_ERR_PEER_LOST: {
    status: 502,
    meaning: 'a running request ended because a ggml-RPC peer of its model was lost; the engine reloads SOLO',
  },
  HYDRA_ERR_UNKNOWN_KEY: { status: 400, meaning: 'a CONFIGURE key the registry lacks (keys lists them)' },
  HYDRA_ERR_T4_FIELD: { status: 400, meaning: 'a start-only key in CONFIGURE (port, host, rpc_port, ...)' },
  HYDRA_ERR_UNSUPPORTED_FIELD: { status: 400, meaning: 'a known llama.cpp field this engine cannot honor' },
  HYDRA_ERR_UNKNOWN_MODEL: {
    status: 400,
    meaning: 'model is neither a registry alias nor a readable file; nothing changed',
  },
  HYDRA_ERR_DRAIN_TIMEOUT: {
    status: 503,
    meaning: 'a running request ended because a deferred T2/T3 change reached the drain timeout',
  },
  HYDRA_ERR_SLOT_BUSY: { status: 409, meaning: 'STATE_GET/STATE_PUT on a slot that is running a request' },
  HYDRA_ERR_STATE_INVALID: {
    status: 400,
    meaning:
      "STATE_PUT bytes are not a slot state of this engine's format, model, slot size or -np (llama.cpp refused them)",
  },
  HYDRA_ERR_STATE_FAILED: { status: 500, meaning: 'llama.cpp could not read or restore the sequence state' },
  HYDRA_ERR_NOT_MOE: { status: 409, meaning: 'SET_EXPERT_MODE on a dense model' },
  HYDRA_ERR_NO_PEER: { status: 409, meaning: 'SET_EXPERT_MODE with no rpc_servers peer configured' },
  HYDRA_ERR_QUANT_PARITY: {
    status: 409,
    meaning: 'SWAP_QUANT to a model of another shape (keys: the facts that differ)',
  },
  HYDRA_ERR_RETIRED: {
    status: 400,
    meaning: 'PIPELINE_ATTACH: use CONFIGURE with rpc_servers and tensor_split',
  },
  HYDRA_ERR_FORBIDDEN: {
    status: 403,
    meaning: 'a /control or /metrics request from outside --control-allow-from',
  },
  HYDRA_ERR_PROMPT_TOO_LARGE: {
    status: 413,
    meaning: "the prompt (or the chat messages' text) is over --max-prompt-bytes",
  },
  HYDRA_ERR_TOO_MANY_MESSAGES: {
    status: 400,
    meaning: 'a chat request has more messages than --max-messages',
  },
  HYDRA_ERR_TOO_MANY_CONNECTIONS: {
    status: 503,
    meaning: 'the connection is over --http-max-connections or its source over the per-source cap',
  },
  HYDRA_ERR_STATE_EXPIRED: {
    status: 400,
    meaning:
      'a STATE_PUT/STATE_GET chunk after the transfer idled past --state-timeout-ms (start again at offset 0)',
  },
  HYDRA_ERR_STATE_UPLOADS_FULL: {
    status: 400,
    meaning:
      "a STATE_PUT at offset 0 whose total with the unfinished uploads' is over --max-state-upload-bytes",
  },
  HYDRA_ERR_INSUFFICIENT_MEMORY: {
    status: 400,
    meaning:
      'a context (KV cache, recurrent state, compute and batch buffers for n_ctx, n_batch, n_ubatch, n_parallel, cache types) does not fit the free memory of the devices it goes to, checked before anything is allocated; details names the device and the bytes; nothing changed',
  },
  HYDRA_ERR_WONT_FIT: {
    status: 400,
    meaning:
      'CONFIGURE of a model, split or offload change (T3) whose predicted weights, KV, recurrent state and compute per device (against free memory plus what the model in force frees, under --device-memory-cap, keeping --fit-target) do not fit, refused before anything is unloaded (force_fit: true loads anyway); or tensor_split/n_gpu_layers auto with no choice that fits. details is the fit object of PLAN (per device figures)',
  },
  HYDRA_ERR_CONTEXT_FAILED: {
    status: 400,
    meaning:
      'llama.cpp refused to build the context a T2 change asked for (e.g. a quantized V cache without flash attention); the previous context is built again and serves',
  },
  HYDRA_ERR_GGUF_INVALID: {
    status: 400,
    meaning:
      'the model file is malformed: truncated, absurd dimensions, tensor data past the end of the file; refused before llama.cpp sees it, the model in force stays',
  },
  HYDRA_ERR_GGUF_UNSUPPORTED: {
    status: 400,
    meaning: 'a GGUF version, byte order or tensor type the pinned ggml does not know',
  },
  HYDRA_ERR_MODEL_METADATA: {
    status: 400,
    meaning:
      'hyperparameters the pinned llama.cpp asserts on (block_count 0 or above 512, expert counts, rope scaling type: keys names the metadata key), which would abort the process',
  },
  // native-ggml's load refusals of what a CONFIGURE named, answered as they come.
  HYDRA_ERR_BAD_OVERRIDE: {
    status: 400,
    meaning:
      'an override_tensors item is not <regex>=<buffer type>, its regex does not compile, or the buffer type is unknown',
  },
  HYDRA_ERR_NO_DEVICE: { status: 400, meaning: 'a devices entry names no device of this host or its peers' },
  HYDRA_ERR_DRAFT_INCOMPATIBLE: {
    status: 400,
    meaning:
      "speculative.model's vocabulary does not match the target's (llama.cpp's check), or the draft is recurrent",
  },
  HYDRA_ERR_LOAD_CANCELLED: {
    status: 503,
    meaning: 'a model load was cancelled before it finished (a newer load or shutdown)',
  },
  HYDRA_ERR_NOT_SUPPORTED: {
    status: 501,
    meaning:
      'a llama-server feature this server was not started with (slot actions without --slot-save-path, GET /slots with --no-slots, POST /props without --props) or the model lacks (/infill, suffix: no FIM tokens)',
  },
  HYDRA_ERR_NO_SLOT: { status: 503, meaning: 'GET /slots?fail_on_no_slot=1 while every slot is busy' },
  HYDRA_ERR_SHUTTING_DOWN: {
    status: 503,
    meaning:
      'after SIGTERM/SIGINT: a new request (with Retry-After), or a running one still going at --shutdown-timeout (an SSE error event, then [DONE])',
  },
});

/** A code declared in {@link ERRORS}. */
export type ErrorCode = keyof typeof ERRORS;

/** The declared codes, in table order. */
export const ERROR_CODES = Object.keys(ERRORS) as ErrorCode[];

/** The HTTP status of `code`: the declared one, 500 for a code the engine does not declare. */
export function httpStatus(code: string): number {
  return httpStatusOf(ERRORS, code);
}

/** {@link BaseError} with `code` typed as the engine's declared codes: an undeclared one does not compile. */
export const HydraError = BaseError as new (
  code: ErrorCode,
  message: string,
  options?: HydraErrorOptions,
) => BaseError<ErrorCode>;
export type HydraError = BaseError<ErrorCode>;
