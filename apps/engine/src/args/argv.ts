// The one command-line scanner of the engine's commands (`serve`, `plan`, `bench-client`):
// llama.cpp's conventions, so every command reads its words the same way.
import { HydraError } from '../errors.js';

/** How a flag takes its value. */
export interface ArgvShape {
  /** `none`: a switch; `value`: needs one; `optional`: takes one if the next word is one for it. */
  takes: 'none' | 'value' | 'optional';
  /** For `optional`: the only words it takes from the next argument (any value-like word if unset). */
  values?: readonly string[];
}

/** One flag as given: the spec it matched, the name used and its raw value (none for a bare flag). */
export interface ArgvHit<F> {
  flag: F;
  name: string;
  raw: string | undefined;
}

/** HYDRA_ERR_BAD_ARGUMENT naming the flag (the CLI exits 2 on it). */
export function badArgument(flag: string, message: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_ARGUMENT', message, { keys: [flag] });
}

// A word that starts with a dash is the next flag, unless it is a negative number (-ngl -1).
function looksLikeValue(word: string | undefined): word is string {
  return word !== undefined && (!word.startsWith('-') || /^-\d/.test(word));
}

/**
 * Reads `argv` one flag at a time, in order, so a caller's errors come in the order of the words.
 * `--name=value` for long names; otherwise the value is the next word unless it looks like a flag.
 * `find` names the spec of a flag (undefined: `unknown` builds the error); `shape` says how it
 * takes its value.
 */
export function* scanArgv<F>(
  argv: readonly string[],
  find: (name: string) => F | undefined,
  shape: (flag: F) => ArgvShape,
  unknown: (name: string, arg: string) => HydraError,
): Generator<ArgvHit<F>> {
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.startsWith('--') ? arg.indexOf('=') : -1;
    const name = eq > 0 ? arg.slice(0, eq) : arg;
    const flag = find(name);
    if (flag === undefined) throw unknown(name, arg);
    const { takes, values } = shape(flag);
    let raw: string | undefined;
    if (takes === 'none') {
      if (eq > 0) throw badArgument(name, `${name} takes no value`);
    } else if (eq > 0) raw = arg.slice(eq + 1);
    else {
      const next = argv[i + 1];
      const fits = looksLikeValue(next) && (takes === 'value' || !values || values.includes(next));
      if (fits) {
        raw = next;
        i++;
      } else if (takes === 'value') throw badArgument(name, `${name} needs a value`);
    }
    yield { flag, name, raw };
  }
}
