import { HydraError } from '@hydra-engine/errors';

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

/**
 * Parses `argv` (`--flag value` or `--flag=value`) over `defaults`. `switches` are flags without a
 * value that set their key to true. Returns `'help'` for `--help`/`-h`. Unknown flags, stray
 * arguments and missing values are refused.
 */
export function parseFlags<O extends object>(
  argv: readonly string[],
  defaults: O,
  table: FlagTable<O>,
  switches: Readonly<Record<string, keyof O>> = {},
): O | 'help' {
  const o = { ...defaults };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    const eq = arg.indexOf('=');
    const flag = arg.startsWith('--') && eq > 0 ? arg.slice(0, eq) : arg;
    const inline = flag === arg ? undefined : arg.slice(eq + 1);
    if (flag === '--help' || flag === '-h') return 'help';
    if (Object.hasOwn(switches, flag)) {
      if (inline !== undefined) throw badFlag(flag, 'takes no value');
      (o as Record<keyof O, unknown>)[switches[flag] as keyof O] = true;
      continue;
    }
    if (!flag.startsWith('--')) throw badFlag(flag, 'unexpected argument');
    const entry = Object.hasOwn(table, flag) ? table[flag] : undefined;
    if (!entry) throw badFlag(flag, 'unknown flag');
    const v: FlagValue = {
      flag,
      value: () => {
        const next = inline ?? argv[++i];
        if (next === undefined) throw badFlag(flag, 'needs a value');
        return next;
      },
    };
    const [key, read] = entry;
    o[key] = read(v);
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
