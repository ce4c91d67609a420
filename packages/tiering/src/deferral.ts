import { HydraError } from './errors.js';
import { type Change, copy, type Params, type PlanResult, plan, type Rebuild, sameValue } from './plan.js';
import { defaults, fieldFor } from './registry.js';

/** The env variable the engine reads the drain timeout from (this package never reads env). */
export const DRAIN_TIMEOUT_ENV = 'HYDRA_COORD_PROFILE_SWITCH_DRAIN_TIMEOUT';
/** Drain timeout used when the variable is unset or empty: 30 s. */
export const DEFAULT_DRAIN_TIMEOUT_MS = 30_000;
const MAX_DRAIN_TIMEOUT_MS = 24 * 60 * 60 * 1000;

/**
 * Parses the value of `HYDRA_COORD_PROFILE_SWITCH_DRAIN_TIMEOUT` into milliseconds. A bare number is
 * SECONDS (as llama.cpp's own timeouts are); a unit suffix `ms`, `s` or `m` says otherwise:
 * `"30"` = `"30s"` = 30000, `"1500ms"` = 1500, `"2m"` = 120000. `undefined` or blank gives
 * {@link DEFAULT_DRAIN_TIMEOUT_MS}; `"0"` means "end running requests at once". At most 24 h.
 *
 * @throws HydraError `HYDRA_ERR_BAD_VALUE` (keys: the variable name) for anything else.
 */
export function parseDrainTimeout(raw: string | undefined): number {
  if (raw === undefined || raw.trim() === '') return DEFAULT_DRAIN_TIMEOUT_MS;
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$/i.exec(raw);
  const unit = (m?.[2] ?? 's').toLowerCase();
  const ms =
    m === null ? Number.NaN : Math.round(Number(m[1]) * (unit === 'ms' ? 1 : unit === 's' ? 1000 : 60_000));
  if (!Number.isFinite(ms) || ms > MAX_DRAIN_TIMEOUT_MS) {
    throw new HydraError(
      'HYDRA_ERR_BAD_VALUE',
      `${DRAIN_TIMEOUT_ENV} must be a duration such as "30", "30s", "1500ms" or "2m" (at most 24 h), got ${JSON.stringify(raw)}`,
      { keys: [DRAIN_TIMEOUT_ENV] },
    );
  }
  return ms;
}

/** Options of {@link DeferralPolicy}. */
export interface DeferralPolicyOptions {
  /** How long deferred T2/T3 changes wait for busy slots before running requests must end (ms). */
  drainTimeoutMs: number;
  /** The state in force at start; registry defaults when omitted. */
  applied?: Params;
  /** The configuration epoch in force at start (default 0). */
  epoch?: number;
}

/** What the engine must do after an event. */
export interface Decision {
  /** Changes to carry out now, in order (T1 and, when every slot is free, T2/T3); may be empty. */
  apply: Change[];
  /** The rebuild that `apply` needs. */
  rebuild: Rebuild;
  /**
   * True once, on the event where the drain timeout expires with slots still busy: the engine must
   * end its running requests with an error; the deferred changes come out on the event that frees
   * the last slot.
   */
  endRunning: boolean;
  /** Keys still waiting for every slot to be free. */
  deferredKeys: string[];
  /** The configuration epoch after this event. */
  epoch: number;
}

const REBUILD_RANK: Record<Rebuild, number> = { none: 0, sampler: 1, context: 2, model: 3 };

function rebuildOf(changes: readonly Change[]): Rebuild {
  let r: Rebuild = 'none';
  for (const c of changes) {
    const need: Rebuild =
      c.tier === 'T3' ? 'model' : c.tier === 'T2' ? 'context' : c.via === 'sampler' ? 'sampler' : 'none';
    if (REBUILD_RANK[need] > REBUILD_RANK[r]) r = need;
  }
  return r;
}

/**
 * The deferral policy as an event-driven state machine with an injected clock: it owns no timers.
 * The engine feeds it plans ({@link submit}), slot events and clock ticks, each with the current
 * monotonic time in ms, and carries out the {@link Decision} each call returns.
 *
 * T1 changes apply at once. T2/T3 changes apply at once when no slot is busy; otherwise they wait
 * until every slot is free. A later delta merges into the waiting one (last value per key wins; a
 * key set back to its applied value drops out). The drain deadline starts with the first deferred
 * change and is not extended by merges. Every event that applies changes bumps the epoch once.
 */
export class DeferralPolicy {
  readonly #timeoutMs: number;
  readonly #applied: Params;
  readonly #pending = new Map<string, Change>();
  #busy = 0;
  #epoch: number;
  #now = Number.NEGATIVE_INFINITY;
  #deadline: number | null = null;
  #expired = false;

  constructor(options: DeferralPolicyOptions) {
    const { drainTimeoutMs, epoch = 0 } = options ?? ({} as DeferralPolicyOptions);
    if (typeof drainTimeoutMs !== 'number' || !Number.isFinite(drainTimeoutMs) || drainTimeoutMs < 0) {
      throw new HydraError('HYDRA_ERR_BAD_OPTION', 'options.drainTimeoutMs must be a finite number >= 0');
    }
    if (!Number.isSafeInteger(epoch) || epoch < 0) {
      throw new HydraError('HYDRA_ERR_BAD_OPTION', 'options.epoch must be a non-negative integer');
    }
    this.#timeoutMs = drainTimeoutMs;
    this.#epoch = epoch;
    this.#applied = options.applied === undefined ? defaults() : { ...defaults(), ...copy(options.applied) };
  }

  /** The state in force now (a copy). */
  get applied(): Params {
    return copy(this.#applied);
  }

  /** The state once every waiting change is applied: plan new deltas against this. */
  get target(): Params {
    const out = copy(this.#applied);
    for (const c of this.#pending.values()) out[c.key] = copy(c.to);
    return out;
  }

  /** The waiting T2/T3 changes (`from` is the applied value). */
  get pending(): Change[] {
    return [...this.#pending.values()].map((c) => copy(c));
  }

  get deferredKeys(): string[] {
    return [...this.#pending.keys()];
  }

  get epoch(): number {
    return this.#epoch;
  }

  get busySlots(): number {
    return this.#busy;
  }

  /** When waiting changes force the drain (ms on the injected clock); `null` when nothing waits. */
  get deadlineMs(): number | null {
    return this.#deadline;
  }

  /** True after the drain timeout expired while changes still wait: admit no new requests. */
  get draining(): boolean {
    return this.#expired && this.#pending.size > 0;
  }

  /** Plans `delta` against {@link target} and submits it; the plan's errors propagate unchanged. */
  configure(delta: unknown, nowMs: number): { plan: PlanResult; decision: Decision } {
    this.#advance(nowMs);
    const result = plan(this.target, delta);
    return { plan: result, decision: this.submit(result, nowMs) };
  }

  /** Takes the changes of a plan (made against {@link target} or {@link applied}). */
  submit(result: Pick<PlanResult, 'changes'>, nowMs: number): Decision {
    this.#advance(nowMs);
    if (!Array.isArray(result?.changes)) {
      throw new HydraError('HYDRA_ERR_BAD_EVENT', 'submit() needs a plan result with changes');
    }
    const now: Change[] = [];
    for (const c of result.changes) {
      const spec = fieldFor(c.key);
      if (spec === undefined || spec.key !== c.key || spec.tier === 'T4' || spec.tier !== c.tier) {
        throw new HydraError(
          'HYDRA_ERR_BAD_EVENT',
          `submit() got a change that is not from plan(): ${c.key}`,
          {
            keys: [c.key],
          },
        );
      }
    }
    for (const c of result.changes) {
      const from = copy(this.#applied[c.key]);
      if (c.tier === 'T1') {
        if (!sameValue(from, c.to)) now.push({ ...c, from, to: copy(c.to) });
        continue;
      }
      this.#pending.delete(c.key);
      if (!sameValue(from, c.to)) this.#pending.set(c.key, { ...c, from, to: copy(c.to) });
    }
    return this.#settle(now);
  }

  /** A slot started a request. */
  slotBusy(nowMs: number): Decision {
    this.#advance(nowMs);
    this.#busy++;
    return this.#settle([]);
  }

  /** A slot finished (or ended) its request. */
  slotFree(nowMs: number): Decision {
    this.#advance(nowMs);
    if (this.#busy === 0) throw new HydraError('HYDRA_ERR_BAD_EVENT', 'slotFree() with no busy slot');
    this.#busy--;
    return this.#settle([]);
  }

  /** Sets the busy slot count outright (for engines that count slots themselves). */
  setBusySlots(count: number, nowMs: number): Decision {
    if (!Number.isSafeInteger(count) || count < 0) {
      throw new HydraError('HYDRA_ERR_BAD_EVENT', 'setBusySlots() needs a non-negative integer');
    }
    this.#advance(nowMs);
    this.#busy = count;
    return this.#settle([]);
  }

  /** The clock moved on; reports the drain timeout's expiry. */
  tick(nowMs: number): Decision {
    this.#advance(nowMs);
    return this.#settle([]);
  }

  #advance(nowMs: number): void {
    if (typeof nowMs !== 'number' || !Number.isFinite(nowMs) || nowMs < this.#now) {
      throw new HydraError(
        'HYDRA_ERR_BAD_EVENT',
        `the clock must be finite and never go back (got ${nowMs})`,
      );
    }
    this.#now = nowMs;
  }

  #settle(now: Change[]): Decision {
    if (this.#busy === 0 && this.#pending.size > 0) {
      now.push(...this.#pending.values());
      this.#pending.clear();
    }
    let endRunning = false;
    if (this.#pending.size === 0) {
      this.#deadline = null;
      this.#expired = false;
    } else {
      this.#deadline ??= this.#now + this.#timeoutMs;
      if (!this.#expired && this.#now >= this.#deadline) {
        this.#expired = true;
        endRunning = true;
      }
    }
    for (const c of now) this.#applied[c.key] = copy(c.to);
    if (now.length > 0) this.#epoch++;
    return {
      apply: now,
      rebuild: rebuildOf(now),
      endRunning,
      deferredKeys: [...this.#pending.keys()],
      epoch: this.#epoch,
    };
  }
}
