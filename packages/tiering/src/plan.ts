import { HydraError } from './errors.js';
import {
  type FieldSpec,
  type FieldType,
  fieldFor,
  isStructPrefix,
  isT4ByPrefix,
  registryIndex,
  type Tier,
  type Via,
} from './registry.js';

/** A params state or delta in canonical dotted keys. */
export type Params = Record<string, unknown>;

/** The highest tier a plan needs; `none` when nothing changes. */
export type PlanTier = 'none' | 'T1' | 'T2' | 'T3';

/** The rebuild a plan needs, from the cheapest. */
export type Rebuild = 'none' | 'sampler' | 'context' | 'model';

/** One key whose value differs from the applied state. */
export interface Change {
  readonly key: string;
  readonly from: unknown;
  readonly to: unknown;
  readonly tier: Exclude<Tier, 'T4'>;
  readonly via: Via;
}

/** What {@link plan} returns; nothing in it aliases the caller's objects. */
export interface PlanResult {
  tier: PlanTier;
  changes: Change[];
  /** Each key of the delta, canonical and dotted, with the value in force after clamping. */
  paramsApplied: Params;
  rebuild: Rebuild;
  /** Changed keys that need a context rebuild (T2). */
  contextKeys: string[];
  /** Changed keys that need a model reload (T3). */
  modelKeys: string[];
  /** The applied state with every change made. */
  next: Params;
  /** Set when the delta names `state_chunk_size`: the clamped value, for the legacy echo. */
  stateChunkSizeApplied?: number;
  /** True for the legacy single-key `{"state_chunk_size": N}` payload, which always answers T1. */
  legacy: boolean;
}

/** Options of {@link normalize}. */
export interface NormalizeOptions {
  /** Accept start-only (T4) keys: true for the startup layer (YAML, CLI), never for CONFIGURE. */
  allowT4?: boolean;
}

/** Options of {@link plan}. */
export interface PlanOptions {
  /** Values for keys missing from `applied` (the merged lower layers); else registry defaults. */
  defaults?: Params;
}

const CODE_ORDER = [
  'HYDRA_ERR_UNKNOWN_KEY',
  'HYDRA_ERR_T4_FIELD',
  'HYDRA_ERR_UNSUPPORTED_FIELD',
  'HYDRA_ERR_BAD_VALUE',
] as const;
type RejectCode = (typeof CODE_ORDER)[number];

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** Structural equality for the value shapes the registry allows (primitives, arrays, string maps). */
export function sameValue(a: unknown, b: unknown): boolean {
  if (Object.is(a, b) || a === b) return true;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!sameValue(a[i], b[i])) return false;
    return true;
  }
  if (isPlainObject(a) && isPlainObject(b)) {
    const ka = Object.keys(a);
    if (ka.length !== Object.keys(b).length) return false;
    for (const k of ka) if (!Object.hasOwn(b, k) || !sameValue(a[k], b[k])) return false;
    return true;
  }
  return false;
}

/** Checks and copies one value; returns the value in force or a reason string wrapped in an object. */
function check(type: FieldType, value: unknown, clamp: boolean): { ok: unknown } | { bad: string } {
  switch (type.kind) {
    case 'auto':
      if (typeof value === 'string' && value.toLowerCase() === 'auto') return { ok: 'auto' };
      {
        const r = check(type.of, value, clamp);
        return 'bad' in r ? { bad: `expected "auto" or: ${r.bad}` } : r;
      }
    case 'int':
    case 'number': {
      let n = value;
      if (
        typeof n === 'bigint' &&
        n >= BigInt(Number.MIN_SAFE_INTEGER) &&
        n <= BigInt(Number.MAX_SAFE_INTEGER)
      ) {
        n = Number(n);
      }
      if (typeof n !== 'number' || !Number.isFinite(n)) return { bad: `expected a finite ${type.kind}` };
      if (type.kind === 'int' && !Number.isInteger(n)) return { bad: 'expected an integer' };
      if (n < type.min || n > type.max) {
        if (!clamp) return { bad: `out of range ${type.min}..${type.max}` };
        return { ok: Math.min(type.max, Math.max(type.min, n)) };
      }
      // -0 and 0 are the same setting; keep diffs and echoes free of -0.
      return { ok: n === 0 ? 0 : n };
    }
    case 'bool':
      return typeof value === 'boolean' ? { ok: value } : { bad: 'expected a boolean' };
    case 'string':
      if (typeof value !== 'string') return { bad: 'expected a string' };
      if (value.length > type.maxLength) return { bad: `longer than ${type.maxLength} characters` };
      if (type.pattern !== undefined && !type.pattern.test(value))
        return { bad: `does not match ${type.pattern}` };
      return { ok: value };
    case 'enum': {
      const v = typeof value === 'string' ? value.toLowerCase() : value;
      if (typeof v !== 'string' || !type.values.includes(v))
        return { bad: `expected one of ${type.values.join(', ')}` };
      return { ok: v };
    }
    case 'list': {
      if (!Array.isArray(value)) return { bad: 'expected an array' };
      if (value.length > type.maxItems) return { bad: `more than ${type.maxItems} items` };
      const out: unknown[] = [];
      for (let i = 0; i < value.length; i++) {
        const r = check(type.of, value[i], false);
        if ('bad' in r) return { bad: `item ${i}: ${r.bad}` };
        out.push(r.ok);
      }
      return { ok: out };
    }
    case 'map': {
      if (!isPlainObject(value)) return { bad: 'expected an object' };
      const keys = Object.keys(value);
      if (keys.length > type.maxEntries) return { bad: `more than ${type.maxEntries} entries` };
      const out: Record<string, unknown> = {};
      for (const k of keys) {
        const r = check(type.of, value[k], false);
        if ('bad' in r) return { bad: `entry ${JSON.stringify(k)}: ${r.bad}` };
        Object.defineProperty(out, k, { value: r.ok, enumerable: true, writable: true, configurable: true });
      }
      return { ok: out };
    }
  }
}

/** Checks a field's value beyond its type: things a type cannot say (a regex that compiles, token ids). */
function extraCheck(spec: FieldSpec, value: unknown): string | undefined {
  if (spec.key === 'override_tensors') {
    for (const item of value as string[]) {
      const pattern = item.slice(0, item.lastIndexOf('='));
      try {
        new RegExp(pattern);
      } catch {
        return `invalid tensor name regex ${JSON.stringify(pattern)}`;
      }
    }
  } else if (spec.key === 'rpc_servers') {
    for (const item of value as string[]) {
      const port = Number(item.slice(item.lastIndexOf(':') + 1));
      if (port > 65_535) return `port out of range in ${JSON.stringify(item)}`;
    }
  } else if (spec.key === 'sampling.logit_bias') {
    for (const k of Object.keys(value as object)) {
      if (!/^(0|[1-9][0-9]{0,9})$/.test(k)) return `logit_bias key ${JSON.stringify(k)} is not a token id`;
    }
  }
  return undefined;
}

/**
 * Validates a whole delta and rewrites it into canonical dotted keys, with values copied, coerced
 * (`flash_attn: true` -> `"on"`, `seed: -1` -> 4294967295, enum case) and clamped. Nested and dotted
 * forms, and registry aliases, give the same result. Every offending key is collected before one
 * HydraError is thrown; `error.keys` lists them as the caller spelled them.
 *
 * @throws HydraError `HYDRA_ERR_UNKNOWN_KEY`, `HYDRA_ERR_T4_FIELD`, `HYDRA_ERR_UNSUPPORTED_FIELD` or
 *   `HYDRA_ERR_BAD_VALUE` (the first of these that applies, in this order).
 */
export function normalize(delta: unknown, options: NormalizeOptions = {}): Params {
  if (!isPlainObject(delta)) {
    throw new HydraError('HYDRA_ERR_BAD_VALUE', 'a params delta must be an object', { keys: [] });
  }
  const allowT4 = options.allowT4 === true;
  const out: Params = {};
  const offenders = new Map<string, { code: RejectCode; reason: string }>();
  const reject = (key: string, code: RejectCode, reason: string) => {
    if (!offenders.has(key)) offenders.set(key, { code, reason });
  };

  const walk = (obj: Record<string, unknown>, prefix: string): void => {
    for (const k of Object.keys(obj)) {
      const full = prefix === '' ? k : `${prefix}.${k}`;
      const value = obj[k];
      const spec = fieldFor(full);
      if (isPlainObject(value) && isStructPrefix(full) && spec?.type.kind !== 'map') {
        walk(value, full);
        continue;
      }
      if (spec === undefined) {
        if (isT4ByPrefix(full)) reject(full, 'HYDRA_ERR_T4_FIELD', 'start-only setting');
        else reject(full, 'HYDRA_ERR_UNKNOWN_KEY', 'not a common_params field this engine knows');
        continue;
      }
      if (spec.tier === 'T4' && !allowT4) {
        reject(full, 'HYDRA_ERR_T4_FIELD', 'start-only setting; change it by restarting the engine');
        continue;
      }
      if (spec.unsupported !== undefined) {
        reject(full, 'HYDRA_ERR_UNSUPPORTED_FIELD', spec.unsupported);
        continue;
      }
      const r = check(spec.type, spec.coerce === undefined ? value : spec.coerce(value), spec.clamp);
      if ('bad' in r) {
        reject(full, 'HYDRA_ERR_BAD_VALUE', r.bad);
        continue;
      }
      const extra = extraCheck(spec, r.ok);
      if (extra !== undefined) {
        reject(full, 'HYDRA_ERR_BAD_VALUE', extra);
        continue;
      }
      if (Object.hasOwn(out, spec.key) && !sameValue(out[spec.key], r.ok)) {
        reject(full, 'HYDRA_ERR_BAD_VALUE', `conflicts with another spelling of ${spec.key}`);
        continue;
      }
      out[spec.key] = r.ok;
    }
  };
  walk(delta, '');

  if (offenders.size > 0) {
    const codes = new Set([...offenders.values()].map((o) => o.code));
    const code = CODE_ORDER.find((c) => codes.has(c))!;
    const keys = [...offenders.keys()];
    const reasons: Record<string, string> = {};
    const byCode: Record<string, string[]> = {};
    for (const [key, o] of offenders) {
      Object.defineProperty(reasons, key, { value: o.reason, enumerable: true });
      const list = byCode[o.code] ?? [];
      list.push(key);
      byCode[o.code] = list;
    }
    const summary = keys.map((k) => `${k} (${offenders.get(k)!.reason})`).join('; ');
    throw new HydraError(code, `rejected params: ${summary}`, { keys, details: { reasons, byCode } });
  }
  // Registry order, so the nested, dotted and aliased spellings of a delta give identical results.
  const sorted: Params = {};
  for (const key of Object.keys(out).sort((a, b) => registryIndex(a) - registryIndex(b)))
    sorted[key] = out[key];
  return sorted;
}

/** Copies a registry value; primitives are returned as they are. */
export function copy<T>(value: T): T {
  if (typeof value !== 'object' || value === null) return value;
  // Registry values are JSON-shaped (arrays, string maps, primitives): a hand copy is several
  // times cheaper than structuredClone, and plans copy the whole applied state.
  if (Array.isArray(value)) return value.map(copy) as T;
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(value)) {
    Object.defineProperty(out, k, {
      value: copy((value as Record<string, unknown>)[k]),
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return out as T;
}

const TIER_RANK: Record<PlanTier, number> = { none: 0, T1: 1, T2: 2, T3: 3 };

/**
 * Plans a CONFIGURE delta against the applied state: validates it whole (see {@link normalize}; T4
 * keys are rejected), diffs it and says which rebuild it needs. Pure: `applied` is not modified and
 * the result shares no objects with the inputs.
 */
export function plan(applied: Readonly<Params>, delta: unknown, options: PlanOptions = {}): PlanResult {
  const normalized = normalize(delta);
  const base = options.defaults;
  const changes: Change[] = [];
  const contextKeys: string[] = [];
  const modelKeys: string[] = [];
  let tier: PlanTier = 'none';
  let samplerChanged = false;

  for (const [key, to] of Object.entries(normalized)) {
    const spec = fieldFor(key)!;
    const from = Object.hasOwn(applied, key)
      ? applied[key]
      : base !== undefined && Object.hasOwn(base, key)
        ? base[key]
        : spec.default;
    if (sameValue(from, to)) continue;
    const t = spec.tier as Exclude<Tier, 'T4'>;
    changes.push({ key, from: copy(from), to: copy(to), tier: t, via: spec.via });
    if (TIER_RANK[t] > TIER_RANK[tier]) tier = t;
    if (t === 'T2') contextKeys.push(key);
    else if (t === 'T3') modelKeys.push(key);
    else if (spec.via === 'sampler') samplerChanged = true;
  }

  const next: Params = {};
  for (const key of Object.keys(applied)) next[key] = copy(applied[key]);
  for (const c of changes) next[c.key] = copy(c.to);

  const keys = Object.keys(normalized);
  const legacy = keys.length === 1 && keys[0] === 'state_chunk_size';
  const result: PlanResult = {
    // protocol.md's legacy form: a lone state_chunk_size always answers T1, which its older clients check.
    tier: legacy ? 'T1' : tier,
    changes,
    paramsApplied: normalized,
    rebuild: tier === 'T3' ? 'model' : tier === 'T2' ? 'context' : samplerChanged ? 'sampler' : 'none',
    contextKeys,
    modelKeys,
    next,
    legacy,
  };
  if (Object.hasOwn(normalized, 'state_chunk_size')) {
    result.stateChunkSizeApplied = normalized.state_chunk_size as number;
  }
  return result;
}
