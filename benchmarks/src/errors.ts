/** Every error code this package throws; the README documents each one (a test checks it). */
export const ERROR_CODES = [
  'HYDRA_ERR_BAD_ARGUMENT',
  'HYDRA_ERR_BAD_RESULT',
  'HYDRA_ERR_BENCH_FAILED',
] as const;

/** A code from {@link ERROR_CODES}. */
export type ErrorCode = (typeof ERROR_CODES)[number];
