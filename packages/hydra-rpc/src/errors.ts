import { HydraError } from '@hydra-engine/errors';

/** Every code this package throws or puts on the wire; each must be documented in README.md (a test checks). */
export const ERROR_CODES = [
  'HYDRA_ERR_FRAME_TOO_LARGE',
  'HYDRA_ERR_BAD_PAYLOAD',
  'HYDRA_ERR_UNKNOWN_OPCODE',
  'HYDRA_ERR_BAD_VALUE',
  'HYDRA_ERR_RETIRED',
  'HYDRA_ERR_NO_HANDLER',
  'HYDRA_ERR_INTERNAL',
  'HYDRA_ERR_BAD_OPTION',
  'HYDRA_ERR_TIMEOUT',
  'HYDRA_ERR_CONNECTION_CLOSED',
  'HYDRA_ERR_BAD_RESPONSE',
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

export { HydraError };

export function badOption(name: string, rule: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_OPTION', `options.${name} ${rule}`, { keys: [name] });
}
