import type { Skipped } from '../../schema.js';
import { ProcessGroup } from './processes.js';

/** Where a run's results go: rebuilt from the run's state and written after every part. */
export interface ResultSink<F> {
  /** Writes the whole result; returns the file written, if any. */
  write(state: {
    figures: readonly F[];
    skipped: readonly Skipped[];
    notes: Record<string, unknown>;
  }): string | undefined;
}

export interface HarnessOptions<F> {
  /** Parts that would not fit in what is left of this many seconds skip themselves. */
  budgetS: number;
  sink: ResultSink<F>;
  /** The progress line prefix from the seconds since the start (`[  12s] `). */
  prefix?: (elapsedS: number) => string;
  /** A figure's progress line. */
  describe: (figure: F) => string;
  /** The flags that run one part alone, for skip messages (default `--only NAME`). */
  rerunHint?: (partName: string) => string;
}

/** One measured part of a benchmark: skipped when fewer than `estimateS` seconds are left. */
export interface Part<C> {
  name: string;
  estimateS: number;
  run(ctx: C): Promise<void>;
}

const firstLines = (err: unknown) =>
  (err instanceof Error ? err.message : String(err)).split('\n').slice(0, 6).join(' | ');

/**
 * The state of one benchmark run: its figures, skipped entries and notes, the time budget, the
 * processes it started and the progress log (stderr). Every part of a run shares one Harness; no
 * state lives at module level.
 */
export class Harness<F> {
  readonly notes: Record<string, unknown>;
  readonly processes = new ProcessGroup();
  readonly budgetS: number;
  readonly #figures: F[] = [];
  readonly #skipped: Skipped[] = [];
  readonly #options: HarnessOptions<F>;
  readonly #t0 = Date.now();
  #resultPath: string | undefined;

  constructor(options: HarnessOptions<F>, notes: Record<string, unknown> = {}) {
    if (!Number.isFinite(options.budgetS) || options.budgetS < 0)
      throw new RangeError('options.budgetS must be a non-negative number');
    this.#options = options;
    this.budgetS = options.budgetS;
    this.notes = notes;
  }

  get figures(): readonly F[] {
    return this.#figures;
  }

  get skipped(): readonly Skipped[] {
    return this.#skipped;
  }

  /** The file the last save wrote. */
  get resultPath(): string | undefined {
    return this.#resultPath;
  }

  elapsedS(): number {
    return (Date.now() - this.#t0) / 1000;
  }

  remainingS(): number {
    return this.budgetS - this.elapsedS();
  }

  log(message: string): void {
    const prefix = this.#options.prefix ?? ((s) => `[${s.toFixed(0).padStart(4)}s] `);
    console.error(`${prefix(this.elapsedS())}${message}`);
  }

  add(figure: F): F {
    this.#figures.push(figure);
    this.log(this.#options.describe(figure));
    return figure;
  }

  skip(name: string, reason: string): void {
    this.log(`skip ${name}: ${reason}`);
    this.#skipped.push({ name, reason });
  }

  save(): void {
    this.#resultPath =
      this.#options.sink.write({ figures: this.#figures, skipped: this.#skipped, notes: this.notes }) ??
      this.#resultPath;
  }

  /** False (and a skipped entry) when fewer than `estimateS` seconds are left. */
  within(estimateS: number, name: string): boolean {
    if (this.remainingS() < estimateS) {
      this.skip(name, `time budget: ${this.remainingS().toFixed(0)} s left`);
      return false;
    }
    return true;
  }

  /**
   * Runs `part` when it fits in the budget, else records it as skipped with a note to run it
   * alone. A failure is recorded as skipped with its first lines; either way the part's processes
   * are killed and the result is saved.
   */
  async runPart<C>(part: Part<C>, ctx: C): Promise<void> {
    if (this.remainingS() < part.estimateS) {
      this.skip(
        part.name,
        `time budget: ${this.remainingS().toFixed(0)} s left of --budget-s ${this.budgetS}, part needs about ${part.estimateS} s; run it in its own call (${this.#options.rerunHint?.(part.name) ?? `--only ${part.name}`})`,
      );
      this.save();
      return;
    }
    this.log(`== ${part.name}`);
    try {
      await part.run(ctx);
    } catch (err) {
      this.skip(part.name, `failed: ${firstLines(err)}`);
    } finally {
      this.processes.killAll();
      this.save();
    }
  }

  /** Records `name` as failed with the error's first lines (for a sub-step that must not end its part). */
  failed(name: string, err: unknown): void {
    this.skip(name, `failed: ${firstLines(err)}`);
  }

  /**
   * Ends the process at `budgetS` + `graceS` whatever runs: the results so far are saved,
   * `onFire` prints what it wants, and `exit(3)` ends it (native-port passes native-ggml's
   * `exitNow`: process.exit() under a decode still on its worker thread can crash in static
   * destructors).
   */
  startWatchdog(
    graceS: number,
    onFire: () => void = () => {},
    exit: (code: number) => void = process.exit,
  ): void {
    const timer = setTimeout(
      () => {
        this.skip('run', `stopped by the watchdog at --budget-s ${this.budgetS}`);
        this.processes.killAll();
        this.save();
        onFire();
        exit(3);
      },
      (this.budgetS + graceS) * 1000,
    );
    timer.unref();
  }
}
