import { HydraError as BaseError, type HydraErrorOptions } from '@hydra-engine/errors';

/** Every code this package throws; each must be documented in README.md (a test checks). */
export const ERROR_CODES = [
  'HYDRA_ERR_INTERNAL',
  'HYDRA_ERR_BAD_VALUE',
  'HYDRA_ERR_GGUF_INVALID',
  'HYDRA_ERR_GGUF_UNSUPPORTED',
  'HYDRA_ERR_MODEL_METADATA',
  'HYDRA_ERR_REGISTRY_INVALID',
  'HYDRA_ERR_UNKNOWN_MODEL',
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

/** {@link BaseError} with `code` typed as this package's {@link ErrorCode}s: an undeclared one does not compile. */
export const HydraError = BaseError as new (
  code: ErrorCode,
  message: string,
  options?: HydraErrorOptions,
) => BaseError<ErrorCode>;
export type HydraError = BaseError<ErrorCode>;

/** Throws a HydraError; the return type lets callers write `return fail(...)` in expressions. */
export function fail(code: ErrorCode, message: string, options?: HydraErrorOptions): never {
  throw new HydraError(code, message, options);
}
