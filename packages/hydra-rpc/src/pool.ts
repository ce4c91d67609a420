import { Piscina } from 'piscina';
import type { Logger } from './logger.js';

/** The worker module that serves one ggml-RPC session per task (an embedder's file). */
export interface RpcWorkerSpec {
  /** Absolute path or `file:` URL of a module whose default export serves `{fd}` and returns stats. */
  filename: string | URL;
  /** Passed to every worker thread as piscina's `workerData`. */
  workerData?: unknown;
}

/** What one served ggml-RPC session reports when it ends (missing fields count as 0). */
export interface RpcSessionStats {
  bytesIn: number;
  bytesOut: number;
  commands: number;
  setTensorBytes: number;
}

/** Counters of the ggml-RPC pool. */
export interface RpcPoolStats extends RpcSessionStats {
  /** Sessions running on a worker now. */
  active: number;
  /** Admitted sessions waiting for a worker. */
  queued: number;
  /** Connections turned away because pool and queue were full (or the port was closing). */
  refused: number;
  /** Sessions that ended normally. */
  served: number;
  /** Sessions whose worker task threw. */
  failed: number;
}

/** One admitted session: started when a worker is free, or aborted if the pool closes first. */
export interface RpcJob {
  /** Describes the session in log lines. */
  readonly label: string;
  /** Called when a worker is free; returns the task for the worker (e.g. `{fd}`). */
  start(): Record<string, unknown>;
  /** Called instead of start() when the pool closes while the job is queued. */
  abort(): void;
  /** Called when the running task ended (served or failed). */
  ended?(): void;
}

interface PoolConfig {
  worker: RpcWorkerSpec;
  size: number;
  queueSize: number;
  logger: Logger;
}

const STAT_KEYS = ['bytesIn', 'bytesOut', 'commands', 'setTensorBytes'] as const;

/**
 * A bounded pool of ggml-RPC sessions over piscina. Admission is decided here, not by piscina's
 * own queue, so that a refused connection is refused before its fd is detached and an active
 * session is never dropped to make room.
 */
export class RpcPool {
  readonly #config: PoolConfig;
  readonly #piscina: Piscina;
  readonly #queue: RpcJob[] = [];
  readonly #running = new Set<Promise<void>>();
  readonly #totals: RpcSessionStats = { bytesIn: 0, bytesOut: 0, commands: 0, setTensorBytes: 0 };
  #active = 0;
  #refused = 0;
  #served = 0;
  #failed = 0;
  #closing = false;

  constructor(config: PoolConfig) {
    this.#config = config;
    const filename = config.worker.filename;
    this.#piscina = new Piscina({
      filename: filename instanceof URL ? filename.href : filename,
      workerData: config.worker.workerData,
      minThreads: config.size,
      maxThreads: config.size,
      concurrentTasksPerWorker: 1,
      idleTimeout: Number.POSITIVE_INFINITY,
    });
    // A worker that dies between tasks must not take the process down; its task's promise rejects.
    this.#piscina.on('error', (err: unknown) =>
      config.logger.error('hydra-rpc: ggml-RPC worker error', { err }),
    );
  }

  /** True when one more session would be admitted now. */
  get hasRoom(): boolean {
    return !this.#closing && this.#active + this.#queue.length < this.#config.size + this.#config.queueSize;
  }

  /**
   * Starts `job` on a free worker or queues it. Returns false, counts and logs a refusal when pool
   * and queue are full; the caller then closes the connection.
   */
  admit(job: RpcJob): boolean {
    if (!this.hasRoom) {
      this.refuse(job.label, this.#closing ? 'port is closing' : 'pool and queue are full');
      return false;
    }
    this.#queue.push(job);
    this.#pump();
    return true;
  }

  /** Counts and logs a refusal decided by the caller. */
  refuse(label: string, reason: string): void {
    this.#refused++;
    this.#config.logger.warn(`hydra-rpc: refused ggml-RPC connection from ${label}: ${reason}`, {
      active: this.#active,
      queued: this.#queue.length,
      poolSize: this.#config.size,
      queueSize: this.#config.queueSize,
    });
  }

  stats(): RpcPoolStats {
    return {
      active: this.#active,
      queued: this.#queue.length,
      refused: this.#refused,
      served: this.#served,
      failed: this.#failed,
      ...this.#totals,
    };
  }

  #pump(): void {
    while (this.#active < this.#config.size && this.#queue.length > 0) {
      const job = this.#queue.shift()!;
      let task: Record<string, unknown>;
      try {
        task = job.start();
      } catch (err) {
        this.#failed++;
        this.#config.logger.error(`hydra-rpc: could not start ggml-RPC session for ${job.label}`, { err });
        continue;
      }
      this.#active++;
      const run = this.#piscina
        .run(task)
        .then(
          (result: unknown) => {
            this.#served++;
            this.#add(result);
          },
          (err: unknown) => {
            this.#failed++;
            this.#config.logger.error(`hydra-rpc: ggml-RPC session for ${job.label} failed`, { err });
          },
        )
        .finally(() => {
          this.#active--;
          this.#running.delete(run);
          job.ended?.();
          this.#pump();
        });
      this.#running.add(run);
    }
  }

  #add(result: unknown): void {
    if (typeof result !== 'object' || result === null) return;
    for (const key of STAT_KEYS) {
      const value = (result as Record<string, unknown>)[key];
      if (typeof value === 'number' && Number.isFinite(value)) this.#totals[key] += value;
    }
  }

  /**
   * Stops admitting, aborts queued jobs, waits for running sessions up to `timeoutMs`, then calls
   * `onTimeout` (which should cut the remaining connections) and tears the workers down.
   */
  async close(timeoutMs: number, onTimeout?: () => void): Promise<void> {
    this.#closing = true;
    for (const job of this.#queue.splice(0)) job.abort();
    if (this.#running.size > 0) {
      let timer: NodeJS.Timeout | undefined;
      const timedOut = await Promise.race([
        Promise.allSettled([...this.#running]).then(() => false),
        new Promise<boolean>((resolve) => {
          timer = setTimeout(() => resolve(true), timeoutMs);
        }),
      ]);
      clearTimeout(timer);
      if (timedOut) {
        this.#config.logger.warn('hydra-rpc: ggml-RPC sessions still running at shutdown timeout', {
          active: this.#active,
        });
        onTimeout?.();
        // Give cut sessions a moment to return; a thread stuck in native code cannot be awaited forever.
        await Promise.race([Promise.allSettled([...this.#running]), delay(1000)]);
      }
    }
    await Promise.race([this.#piscina.destroy().catch(() => undefined), delay(2000)]);
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}
