import { HydraError } from '@hydra-engine/errors';

/** Every code this package throws; each must be documented in README.md (a test checks). */
export const ERROR_CODES = [
  'HYDRA_ERR_UNKNOWN_KEY',
  'HYDRA_ERR_BAD_VALUE',
  'HYDRA_ERR_T4_FIELD',
  'HYDRA_ERR_UNSUPPORTED_FIELD',
  'HYDRA_ERR_BAD_OPTION',
  'HYDRA_ERR_BAD_EVENT',
  'HYDRA_ERR_INTERNAL',
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

export { HydraError };
