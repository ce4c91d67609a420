/**
 * The error convention of Hydra engine: every error a package throws on purpose is a
 * {@link HydraError} (or a subclass) with a stable `code`. Callers branch on `code`, never on the
 * message, so messages may improve while codes keep their meaning forever.
 */

const CODE_PATTERN = /^HYDRA_ERR_[A-Z0-9_]+$/;

/** Options accepted by {@link HydraError}. */
export interface HydraErrorOptions {
  /** The underlying error, kept for logs. */
  cause?: unknown;
  /** Offending keys (CONFIGURE), fields, or other names the caller can act on. */
  keys?: readonly string[];
  /** Extra machine-readable facts (limits, sizes) for logs and wire replies. */
  details?: Readonly<Record<string, unknown>>;
}

/**
 * Base class of every deliberate Hydra error. `C` narrows `code` to a package's declared codes
 * (see {@link defineErrors}); a package re-exports the class typed with its own union.
 */
export class HydraError<C extends string = string> extends Error {
  /** Stable, documented identifier such as `HYDRA_ERR_QUEUE_FULL`. */
  readonly code: C;
  /** Offending keys, when the error is about named inputs. */
  readonly keys: readonly string[] | undefined;
  /** Extra machine-readable facts. */
  readonly details: Readonly<Record<string, unknown>> | undefined;

  constructor(code: C, message: string, options: HydraErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    if (!CODE_PATTERN.test(code)) {
      throw new TypeError(`error code must match ${CODE_PATTERN}, got ${JSON.stringify(code)}`);
    }
    this.name = new.target.name;
    this.code = code;
    this.keys = options.keys;
    this.details = options.details;
  }

  /** The wire shape of protocol.md: `{code, message, keys?}`. */
  toJSON(): { code: string; message: string; keys?: string[]; details?: Record<string, unknown> } {
    const out: { code: string; message: string; keys?: string[]; details?: Record<string, unknown> } = {
      code: this.code,
      message: this.message,
    };
    if (this.keys !== undefined) out.keys = [...this.keys];
    if (this.details !== undefined) out.details = { ...this.details };
    return out;
  }
}

/** True when `value` is an error carrying a Hydra code (works across realms and worker threads). */
export function isHydraError(value: unknown): value is { code: string; message: string } {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { code?: unknown }).code === 'string' &&
    CODE_PATTERN.test((value as { code: string }).code)
  );
}

/**
 * Every `HYDRA_ERR_*` code named in a markdown text (a package README). Each package's test checks
 * that the codes it defines are a subset of this set.
 */
export function documentedCodes(markdown: string): Set<string> {
  return new Set(markdown.match(/HYDRA_ERR_[A-Z0-9_]+/g) ?? []);
}

/** The codes of `defined` that `markdown` does not mention; empty when all are documented. */
export function undocumentedCodes(defined: Iterable<string>, markdown: string): string[] {
  const documented = documentedCodes(markdown);
  return [...defined].filter((code) => !documented.has(code));
}

/** One declared error code: the HTTP status an HTTP edge answers it with, and what it means. */
export interface ErrorSpec {
  readonly status: number;
  readonly meaning: string;
}

/**
 * Declares a package's error codes once, each with its HTTP status and meaning (as fastify's
 * `createError(code, message, statusCode)` does). Throws a TypeError for a code outside the
 * convention, a status outside 400..599 or an empty meaning, so a bad table fails at import.
 */
export function defineErrors<const T extends Record<string, ErrorSpec>>(table: T): Readonly<T> {
  for (const [code, spec] of Object.entries(table)) {
    if (!CODE_PATTERN.test(code)) throw new TypeError(`error code must match ${CODE_PATTERN}, got ${code}`);
    if (!Number.isInteger(spec.status) || spec.status < 400 || spec.status > 599) {
      throw new TypeError(`${code}: status must be an integer in 400..599, got ${spec.status}`);
    }
    if (typeof spec.meaning !== 'string' || spec.meaning.trim() === '') {
      throw new TypeError(`${code}: meaning must be a non-empty string`);
    }
    Object.freeze(spec);
  }
  return Object.freeze(table);
}

/**
 * The HTTP status of `code` in `table`; 500 for a code the table does not declare (an undeclared
 * code reaching an HTTP edge is a server bug, not the client's).
 */
export function httpStatusOf(table: Readonly<Record<string, ErrorSpec>>, code: string): number {
  return Object.hasOwn(table, code) ? table[code]!.status : 500;
}

/** The codes of a markdown error table: the rows that start with a backquoted `HYDRA_ERR_*` cell. */
export function tableCodes(markdown: string): Set<string> {
  return new Set([...markdown.matchAll(/^\|\s*`(HYDRA_ERR_[A-Z0-9_]+)`/gm)].map((m) => m[1]!));
}

/**
 * Both directions of a package's error documentation: declared codes its README's error table
 * lacks (`undocumented`), and table rows naming a code it does not declare (`undeclared`).
 */
export function errorTableMismatch(
  declared: Iterable<string>,
  markdown: string,
): { undocumented: string[]; undeclared: string[] } {
  const codes = new Set(declared);
  const table = tableCodes(markdown);
  return {
    undocumented: [...codes].filter((c) => !table.has(c)),
    undeclared: [...table].filter((c) => !codes.has(c)),
  };
}
