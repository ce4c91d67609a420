import { HydraError as BaseError, type HydraErrorOptions } from '@hydra-engine/errors';

/** Every code this package throws; each must be documented in README.md (a test checks). */
export const ERROR_CODES = [
  'HYDRA_ERR_NATIVE_MISSING',
  'HYDRA_ERR_LOAD_FAILED',
  'HYDRA_ERR_LOAD_CANCELLED',
  'HYDRA_ERR_BAD_ARGUMENT',
  'HYDRA_ERR_BAD_OVERRIDE',
  'HYDRA_ERR_DISPOSED',
  'HYDRA_ERR_CONTEXT_FAILED',
  'HYDRA_ERR_DECODE_FAILED',
  'HYDRA_ERR_STATE_FAILED',
  'HYDRA_ERR_PEER_UNREACHABLE',
  'HYDRA_ERR_NO_DEVICE',
  'HYDRA_ERR_SERVE_FAILED',
  'HYDRA_ERR_INTERNAL',
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

/** {@link BaseError} with `code` typed as this package's {@link ErrorCode}s: an undeclared one does not compile. */
export const HydraError = BaseError as new (
  code: ErrorCode,
  message: string,
  options?: HydraErrorOptions,
) => BaseError<ErrorCode>;
export type HydraError = BaseError<ErrorCode>;
