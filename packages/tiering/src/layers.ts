import { type Change, copy, normalize, type Params, type PlanResult, plan } from './plan.js';
import { FIELDS, fieldFor, isRuntimeField, type Tier, type Via } from './registry.js';

/** Where a value in force came from. */
export type Source = 'default' | 'startup' | 'configure';

/** One row of {@link ConfigLayers.explain}. */
export interface ExplainRow {
  key: string;
  value: unknown;
  source: Source;
  tier: Tier;
  via: Via;
  /** The value of each layer that has one. */
  layers: { default: unknown; startup?: unknown; configure?: unknown };
}

/**
 * The three configuration layers: built-in defaults < startup config (YAML `--config` merged with
 * CLI flags by the engine) < CONFIGURE. Keeps the source of every value for STATUS and `explain`.
 * The startup layer may hold start-only (T4) settings; CONFIGURE never can.
 */
export class ConfigLayers {
  readonly #startup: Params;
  readonly #configure: Params = {};

  /**
   * @param startup the startup layer, nested or dotted; validated whole like a CONFIGURE delta
   *   except that T4 keys are allowed.
   * @throws HydraError as {@link normalize}.
   */
  constructor(startup: unknown = {}) {
    this.#startup = normalize(startup, { allowT4: true });
  }

  /** Every runtime field (T1-T3, supported) with the value in force. */
  effective(): Params {
    const out: Params = {};
    for (const spec of FIELDS) {
      if (isRuntimeField(spec)) out[spec.key] = copy(this.#valueOf(spec.key));
    }
    return out;
  }

  /** Start-only (T4) settings: defaults overlaid with the startup layer. */
  startOnly(): Params {
    const out: Params = {};
    for (const spec of FIELDS) {
      if (spec.tier === 'T4') out[spec.key] = copy(this.#valueOf(spec.key));
    }
    return out;
  }

  /** The value in force for a key (canonical or alias); `undefined` when the registry lacks it. */
  get(key: string): unknown {
    const spec = fieldFor(key);
    return spec === undefined ? undefined : copy(this.#valueOf(spec.key));
  }

  /** The layer a key's value comes from; `undefined` when the registry lacks the key. */
  sourceOf(key: string): Source | undefined {
    const spec = fieldFor(key);
    if (spec === undefined) return undefined;
    if (Object.hasOwn(this.#configure, spec.key)) return 'configure';
    if (Object.hasOwn(this.#startup, spec.key)) return 'startup';
    return 'default';
  }

  /** Values set above the defaults, canonical keys, for STATUS. */
  overrides(): Params {
    const out: Params = {};
    for (const spec of FIELDS) {
      if (this.sourceOf(spec.key) !== 'default') out[spec.key] = copy(this.#valueOf(spec.key));
    }
    return out;
  }

  /** Records changes that were applied (all of a plan's, or what a DeferralPolicy decision applied). */
  record(changes: readonly Change[]): void {
    for (const c of changes) {
      const spec = fieldFor(c.key);
      if (spec !== undefined && spec.tier !== 'T4') this.#configure[spec.key] = copy(c.to);
    }
  }

  /** Plans `delta` against the effective state and records it at once (no deferral). */
  configure(delta: unknown): PlanResult {
    const result = plan(this.effective(), delta);
    this.record(result.changes);
    return result;
  }

  /**
   * One row per field with its value, source and per-layer values.
   * @param options.overriddenOnly list only fields whose value does not come from the defaults.
   */
  explain(options: { overriddenOnly?: boolean } = {}): ExplainRow[] {
    const rows: ExplainRow[] = [];
    for (const spec of FIELDS) {
      if (spec.unsupported !== undefined) continue;
      const source = this.sourceOf(spec.key)!;
      if (options.overriddenOnly === true && source === 'default') continue;
      const layers: ExplainRow['layers'] = { default: copy(spec.default) };
      if (Object.hasOwn(this.#startup, spec.key)) layers.startup = copy(this.#startup[spec.key]);
      if (Object.hasOwn(this.#configure, spec.key)) layers.configure = copy(this.#configure[spec.key]);
      rows.push({
        key: spec.key,
        value: copy(this.#valueOf(spec.key)),
        source,
        tier: spec.tier,
        via: spec.via,
        layers,
      });
    }
    return rows;
  }

  #valueOf(key: string): unknown {
    if (Object.hasOwn(this.#configure, key)) return this.#configure[key];
    if (Object.hasOwn(this.#startup, key)) return this.#startup[key];
    return fieldFor(key)!.default;
  }
}
