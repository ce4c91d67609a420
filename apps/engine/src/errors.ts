import { HydraError } from '@hydra-engine/errors';

/** Every code this package throws or answers; each must be documented in README.md (a test checks). */
export const ERROR_CODES = [
  'HYDRA_ERR_INTERNAL',
  'HYDRA_ERR_BAD_ARGUMENT',
  'HYDRA_ERR_CONFIG_INVALID',
  'HYDRA_ERR_NO_MODEL',
  'HYDRA_ERR_LOADING',
  'HYDRA_ERR_DRAINING',
  'HYDRA_ERR_LOAD_FAILED',
  'HYDRA_ERR_BAD_JSON',
  'HYDRA_ERR_BAD_REQUEST',
  'HYDRA_ERR_BAD_VALUE',
  'HYDRA_ERR_BODY_TOO_LARGE',
  'HYDRA_ERR_REQUEST_TIMEOUT',
  'HYDRA_ERR_QUEUE_FULL',
  'HYDRA_ERR_PROMPT_TOO_LONG',
  'HYDRA_ERR_UNAUTHORIZED',
  'HYDRA_ERR_NOT_FOUND',
  'HYDRA_ERR_METHOD_NOT_ALLOWED',
  'HYDRA_ERR_CANCELLED',
  'HYDRA_ERR_DECODE_FAILED',
  'HYDRA_ERR_PEER_UNREACHABLE',
  // COMBINE (src/combine).
  'HYDRA_ERR_PEER_LOST',
  // Control plane (src/control).
  'HYDRA_ERR_UNKNOWN_KEY',
  'HYDRA_ERR_T4_FIELD',
  'HYDRA_ERR_UNSUPPORTED_FIELD',
  'HYDRA_ERR_UNKNOWN_MODEL',
  'HYDRA_ERR_DRAIN_TIMEOUT',
  'HYDRA_ERR_SLOT_BUSY',
  'HYDRA_ERR_STATE_INVALID',
  'HYDRA_ERR_STATE_FAILED',
  'HYDRA_ERR_NOT_MOE',
  'HYDRA_ERR_NO_PEER',
  'HYDRA_ERR_QUANT_PARITY',
  'HYDRA_ERR_RETIRED',
  'HYDRA_ERR_FORBIDDEN',
  // HTTP and control-plane limits (src/http.ts, src/control).
  'HYDRA_ERR_PROMPT_TOO_LARGE',
  'HYDRA_ERR_TOO_MANY_MESSAGES',
  'HYDRA_ERR_TOO_MANY_CONNECTIONS',
  'HYDRA_ERR_STATE_EXPIRED',
  'HYDRA_ERR_STATE_UPLOADS_FULL',
  // Bounds and GGUF checks before allocation (src/placement.ts; the GGUF codes come from the resolver).
  'HYDRA_ERR_INSUFFICIENT_MEMORY',
  // A configuration whose weights, KV and compute do not fit its devices (the resolver's planFit).
  'HYDRA_ERR_WONT_FIT',
  'HYDRA_ERR_CONTEXT_FAILED',
  'HYDRA_ERR_GGUF_INVALID',
  'HYDRA_ERR_GGUF_UNSUPPORTED',
  'HYDRA_ERR_MODEL_METADATA',
  // llama-server's routes (src/routes): a feature the server was not started with (501), no idle slot.
  'HYDRA_ERR_NOT_SUPPORTED',
  'HYDRA_ERR_NO_SLOT',
  // SIGTERM: refused while running requests finish (503, Retry-After); the ones still running at
  // --shutdown-timeout end with it.
  'HYDRA_ERR_SHUTTING_DOWN',
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

export { HydraError };
