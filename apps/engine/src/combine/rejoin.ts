// Automatic rejoin of lost COMBINE peers: while the head is degraded it HELLO-probes every lost
// peer with an exponential backoff (bounded in delay and in count); once all of them answer it
// waits for an idle moment (no request running or queued) and asks the runtime to restore the
// COMBINE configuration. A restore that fails (the peer went away again, the load was refused)
// counts as a failed probe and the backoff goes on. The timer is unref'd: it never keeps the
// process alive.
import { HydraError } from '../errors.js';

export interface RejoinOptions {
  peers: readonly string[];
  /** HELLO probe of one peer; rejects when it does not answer. */
  probe: (endpoint: string, timeoutMs: number) => Promise<unknown>;
  /** Restores COMBINE (drained like any T3 change); rejects when it could not. */
  restore: () => Promise<void>;
  /** No request running or queued. */
  idle: () => boolean;
  /** Still degraded by this loss: false stops the rejoin for good. */
  active: () => boolean;
  log?: (line: string) => void;
  /** First delay (default 250 ms); doubled after each failed round up to `maxDelayMs`. */
  initialDelayMs?: number;
  /** Default 10,000 ms. */
  maxDelayMs?: number;
  /** Failed rounds after which probing stops (default 360: about an hour at the largest delay). */
  maxProbes?: number;
  /** Default 1000 ms. */
  probeTimeoutMs?: number;
  /** How often an idle moment is looked for once every peer answered (default 100 ms). */
  idlePollMs?: number;
}

/** The rejoin's state as STATUS shows it. */
export interface RejoinState {
  enabled: boolean;
  probes: number;
  next_probe_ms?: number;
  last_error?: string;
  gave_up?: boolean;
}

function positive(v: number | undefined, dflt: number, name: string): number {
  const n = v ?? dflt;
  if (!Number.isFinite(n) || n <= 0)
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `options.${name} must be a positive number`);
  return n;
}

/** One rejoin attempt series for one peer loss (see the module comment). */
export class PeerRejoin {
  readonly #o: Required<Omit<RejoinOptions, 'log'>> & { log: (line: string) => void };
  readonly #state: RejoinState = { enabled: true, probes: 0 };
  #delay: number;
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;

  constructor(options: RejoinOptions) {
    this.#o = {
      ...options,
      log: options.log ?? (() => undefined),
      initialDelayMs: positive(options.initialDelayMs, 250, 'initialDelayMs'),
      maxDelayMs: positive(options.maxDelayMs, 10_000, 'maxDelayMs'),
      maxProbes: Math.ceil(positive(options.maxProbes, 360, 'maxProbes')),
      probeTimeoutMs: positive(options.probeTimeoutMs, 1000, 'probeTimeoutMs'),
      idlePollMs: positive(options.idlePollMs, 100, 'idlePollMs'),
    };
    if (options.peers.length === 0)
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.peers must name at least one peer');
    this.#delay = this.#o.initialDelayMs;
    this.#schedule(this.#delay);
  }

  get state(): RejoinState {
    return { ...this.#state };
  }

  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
    delete this.#state.next_probe_ms;
  }

  #schedule(ms: number): void {
    if (this.#stopped) return;
    this.#state.next_probe_ms = Math.round(ms);
    this.#timer = setTimeout(() => void this.#round(), ms);
    this.#timer.unref();
  }

  async #round(): Promise<void> {
    if (this.#stopped) return;
    if (!this.#o.active()) return this.stop();
    const o = this.#o;
    const failed = (
      await Promise.all(
        o.peers.map((p) =>
          o.probe(p, o.probeTimeoutMs).then(
            () => undefined,
            (err: Error) => `${p}: ${err.message}`,
          ),
        ),
      )
    ).filter((x) => x !== undefined);
    if (failed.length > 0) {
      this.#failed(failed.join('; '));
      return;
    }
    while (!this.#stopped && o.active() && !o.idle()) await new Promise((r) => setTimeout(r, o.idlePollMs));
    if (this.#stopped || !o.active()) return this.stop();
    o.log(`hydra-engine: lost peer(s) ${o.peers.join(', ')} answer again; restoring COMBINE`);
    try {
      await o.restore();
      this.stop();
    } catch (err) {
      this.#failed(`restore: ${(err as Error).message}`);
    }
  }

  #failed(why: string): void {
    this.#state.probes += 1;
    this.#state.last_error = why;
    if (this.#state.probes >= this.#o.maxProbes) {
      this.#state.gave_up = true;
      this.#o.log(`hydra-engine: rejoin gave up after ${this.#state.probes} probes: ${why}`);
      this.stop();
      return;
    }
    this.#delay = Math.min(this.#delay * 2, this.#o.maxDelayMs);
    this.#schedule(this.#delay);
  }
}
