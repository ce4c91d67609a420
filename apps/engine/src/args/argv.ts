// The engine's commands (`serve`, `plan`, `bench-client`) read their words with native-ggml's
// scanner, the one synth-model uses too; this module gives it the engine's errors.
import { type ArgvHit, type ArgvShape, scanArgv as scanWith } from '@hydra-engine/native-ggml/argv';
import { HydraError } from '../errors.js';

export type { ArgvHit, ArgvShape };

/** HYDRA_ERR_BAD_ARGUMENT naming the flag (the CLI exits 2 on it). */
export function badArgument(flag: string, message: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_ARGUMENT', message, { keys: [flag] });
}

/**
 * Reads `argv` one flag at a time, in order, so a caller's errors come in the order of the words.
 * `--name=value` for long names; otherwise the value is the next word unless it looks like a flag
 * (a negative number is a value). `find` names the spec of a flag (undefined: `unknown` builds the
 * error); `shape` says how it takes its value. A misplaced or missing value is
 * HYDRA_ERR_BAD_ARGUMENT naming the flag.
 */
export function scanArgv<F>(
  argv: readonly string[],
  find: (name: string) => F | undefined,
  shape: (flag: F) => ArgvShape,
  unknown: (name: string, arg: string) => HydraError,
): Generator<ArgvHit<F>> {
  return scanWith(argv, find, shape, { unknown, bad: badArgument });
}
