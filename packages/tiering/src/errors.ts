import { HydraError as BaseError, type HydraErrorOptions } from '@hydra-engine/errors';

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

/** {@link BaseError} with `code` typed as this package's {@link ErrorCode}s: an undeclared one does not compile. */
export const HydraError = BaseError as new (
  code: ErrorCode,
  message: string,
  options?: HydraErrorOptions,
) => BaseError<ErrorCode>;
export type HydraError = BaseError<ErrorCode>;
