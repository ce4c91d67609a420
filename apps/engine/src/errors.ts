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
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

export { HydraError };
