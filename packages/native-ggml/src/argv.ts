// The one command-line scanner of the repository's CLIs: the engine's commands (`serve`, `plan`,
// `bench-client`, through apps/engine's args/argv.ts) and `synth-model`. It lives here, below the
// engine, because synth-model is native-ggml's and cannot import the engine; it imports nothing,
// so loading it loads no addon. Each caller builds its own errors.

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

/** The errors {@link scanArgv} throws, built by its caller. */
export interface ArgvErrors {
  /** A word `find` does not know (`name`: the word before any `=`). */
  unknown(name: string, arg: string): Error;
  /** A flag given a value it takes none of, or none where it needs one. */
  bad(name: string, message: string): Error;
}

// A word that starts with a dash is the next flag, unless it is a negative number (-ngl -1).
function looksLikeValue(word: string | undefined): word is string {
  return word !== undefined && (!word.startsWith('-') || /^-\d/.test(word));
}

/**
 * Reads `argv` one flag at a time, in order, so a caller's errors come in the order of the words.
 * `--name=value` for long names; otherwise the value is the next word unless it looks like a flag.
 * `find` names the spec of a flag (undefined: `errors.unknown` builds the error); `shape` says how
 * it takes its value.
 */
export function* scanArgv<F>(
  argv: readonly string[],
  find: (name: string) => F | undefined,
  shape: (flag: F) => ArgvShape,
  errors: ArgvErrors,
): Generator<ArgvHit<F>> {
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.startsWith('--') ? arg.indexOf('=') : -1;
    const name = eq > 0 ? arg.slice(0, eq) : arg;
    const flag = find(name);
    if (flag === undefined) throw errors.unknown(name, arg);
    const { takes, values } = shape(flag);
    let raw: string | undefined;
    if (takes === 'none') {
      if (eq > 0) throw errors.bad(name, `${name} takes no value`);
    } else if (eq > 0) raw = arg.slice(eq + 1);
    else {
      const next = argv[i + 1];
      const fits = looksLikeValue(next) && (takes === 'value' || !values || values.includes(next));
      if (fits) {
        raw = next;
        i++;
      } else if (takes === 'value') throw errors.bad(name, `${name} needs a value`);
    }
    yield { flag, name, raw };
  }
}
