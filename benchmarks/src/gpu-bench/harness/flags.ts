import { HydraError } from '@hydra-engine/errors';
import { scanArgv } from '@hydra-engine/native-ggml/argv';

/** What a flag's reader gets: its name and its value (the next argument or the text after `=`). */
export interface FlagValue {
  readonly flag: string;
  value(): string;
}

/** Flag -> [option key, reader]; a reader throws {@link badFlag} for a value it refuses. */
export type FlagTable<O> = Readonly<
  Record<string, { [K in keyof O]-?: readonly [K, (v: FlagValue) => O[K]] }[keyof O]>
>;

/** A refused command line: HYDRA_ERR_BAD_ARGUMENT whose `keys` name the flag. */
export function badFlag(flag: string, message: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_ARGUMENT', `${flag}: ${message}`, { keys: [flag] });
}

type Spec<O> =
  | { kind: 'help' }
  | { kind: 'switch'; key: keyof O }
  | { kind: 'value'; entry: FlagTable<O>[string] };

/**
 * Parses `argv` (`--flag value` or `--flag=value`) over `defaults` with the repository's one argv
 * scanner (native-ggml's `scanArgv`, as the engine's and synth-model's CLIs do). `switches` are flags
 * without a value that set their key to true. Returns `'help'` for `--help`/`-h`. Unknown flags,
 * stray arguments and missing values are refused.
 */
export function parseFlags<O extends object>(
  argv: readonly string[],
  defaults: O,
  table: FlagTable<O>,
  switches: Readonly<Record<string, keyof O>> = {},
): O | 'help' {
  const o = { ...defaults };
  const find = (name: string): Spec<O> | undefined => {
    if (name === '--help' || name === '-h') return { kind: 'help' };
    if (Object.hasOwn(switches, name)) return { kind: 'switch', key: switches[name] as keyof O };
    if (name.startsWith('--') && Object.hasOwn(table, name)) return { kind: 'value', entry: table[name]! };
    return undefined;
  };
  const hits = scanArgv(argv, find, (spec) => ({ takes: spec.kind === 'value' ? 'value' : 'none' }), {
    unknown: (name) => badFlag(name, name.startsWith('--') ? 'unknown flag' : 'unexpected argument'),
    bad: (name, message) =>
      badFlag(name, message.startsWith(`${name} `) ? message.slice(name.length + 1) : message),
  });
  for (const { flag: spec, name, raw } of hits) {
    if (spec.kind === 'help') return 'help';
    if (spec.kind === 'switch') {
      (o as Record<keyof O, unknown>)[spec.key] = true;
      continue;
    }
    const [key, read] = spec.entry;
    o[key] = read({ flag: name, value: () => raw as string });
  }
  return o;
}

/** Readers shared by the benchmarks' flag tables. */
export const read = {
  string: (v: FlagValue): string => v.value(),
  list: (v: FlagValue): string[] =>
    v
      .value()
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean),
  /** An integer >= `min`. */
  int:
    (min = 0) =>
    (v: FlagValue): number => {
      const n = Number(v.value());
      if (!Number.isInteger(n) || n < min) throw badFlag(v.flag, `must be an integer >= ${min}`);
      return n;
    },
  /** A comma-separated list of integers >= `min`. */
  ints:
    (min = 1) =>
    (v: FlagValue): number[] =>
      v
        .value()
        .split(',')
        .map((s) => {
          const n = Number(s.trim());
          if (!Number.isInteger(n) || n < min) throw badFlag(v.flag, `must be a list of integers >= ${min}`);
          return n;
        }),
  positiveNumber: (v: FlagValue): number => {
    const n = Number(v.value());
    if (!Number.isFinite(n) || n <= 0) throw badFlag(v.flag, 'must be a positive number');
    return n;
  },
  /** Names from `allowed`, comma-separated. */
  oneOf:
    <T extends string>(allowed: readonly T[]) =>
    (v: FlagValue): T[] => {
      const list = read.list(v);
      for (const n of list)
        if (!allowed.includes(n as T)) throw badFlag(v.flag, `unknown ${n} (one of ${allowed.join(',')})`);
      return list as T[];
    },
};
