import { type ChildProcess, spawn } from 'node:child_process';
import type { Logger } from './logger.js';

/**
 * The child process that serves ggml-RPC sessions, one at a time (an embedder's program that speaks
 * the host protocol of README.md, "Host processes"; native-ggml's `rpc-host` is one).
 */
export interface RpcHostSpec {
  /** Executable to spawn; default `process.execPath`. */
  command?: string;
  /** Its arguments, e.g. `[hostModulePath]` with node, or `['rpc-host']` for a single executable. */
  args: readonly string[];
  /** Environment of the child; default this process's. */
  env?: NodeJS.ProcessEnv;
}

/** What one served ggml-RPC session reports when it ends (missing fields count as 0). */
export interface RpcSessionStats {
  bytesIn: number;
  bytesOut: number;
  commands: number;
  setTensorBytes: number;
  setTensorHashHits: number;
}

/** Counters of the ggml-RPC pool. Session counters include the live figures of running sessions. */
export interface RpcPoolStats extends RpcSessionStats {
  /** Sessions running in a host process now. */
  active: number;
  /** Admitted sessions waiting for a host. */
  queued: number;
  /** Connections turned away (pool and queue full, per-source cap, or the port closing). */
  refused: number;
  /** Of `refused`: turned away because their source address held `maxPerSource` running sessions and its share of the queue. */
  refusedBySource: number;
  /** Queued connections closed because no host was free within `queueTimeoutMs`. */
  queueTimeouts: number;
  /** Sessions that ended normally (the client left, or the host ended the session on bad input). */
  served: number;
  /** Sessions whose host reported an error (e.g. no backend for the served devices). */
  failed: number;
  /** Sessions ended because their host process died (signal, abort, exit); the host is replaced. */
  crashed: number;
  /** Host processes alive now (serving, idle or starting). */
  hosts: number;
  /** Host processes started since the pool was created. */
  hostsSpawned: number;
  /** Sessions by how they ended, as hosts report it (native-ggml: `client`, `refused`, `timeout`, `server`). */
  ended: Record<string, number>;
  /** Messages the hosts refused (a session's summary field `refusals`, summed). */
  refusals: number;
}

/** One admitted session: started when a host is free, or aborted if it times out or the pool closes first. */
export interface RpcJob {
  /** Describes the session in log lines. */
  readonly label: string;
  /** The source address, for the per-source cap. */
  readonly source: string;
  /**
   * Called when a host is free. Returns the task fields for the host and the OS handle of the
   * connection (Node's `socket._handle`), which is passed to the host over IPC.
   */
  start(): { task: Record<string, unknown>; handle: object };
  /** Called once the handle was sent (or could not be): the caller closes its copy. */
  sent(): void;
  /** Called instead of a session when the job leaves the queue unserved (timeout, pool closing, start() threw). */
  abort(): void;
  /** Called when the session ended (served, failed or crashed). */
  ended?(): void;
}

export interface PoolConfig {
  host: RpcHostSpec;
  size: number;
  queueSize: number;
  /**
   * Sessions one source address may run at once; its further connections wait in the queue (at
   * most half of it, rounded up), so another address still finds a host.
   */
  maxPerSource: number;
  /** A queued connection waiting longer than this is closed. */
  queueTimeoutMs: number;
  /** An idle host beyond the one kept warm exits after this; default 10 000 ms. */
  idleLingerMs?: number;
  /** A busy pool starts its next warm host this long after a session took the last one; default 250 ms. */
  warmDelayMs?: number;
  logger: Logger;
}

type HostMessage =
  | { t: 'ready' }
  | { t: 'progress'; id: number; stats: Partial<RpcSessionStats> }
  | { t: 'done'; id: number; result: Record<string, unknown> }
  | { t: 'failed'; id: number; error: { code?: string; message: string } }
  | { t: 'setup-failed'; data: unknown; error: { code?: string; message: string } };

interface Running {
  id: number;
  job: RpcJob;
  live: Partial<RpcSessionStats>;
  /** When it was handed to its host. */
  startedAt: number;
  /** How long it waited in the queue for a host. */
  waitedMs: number;
  /** Its host had not reported ready (still starting) when it was handed over. */
  coldHost: boolean;
}

interface Host {
  child: ChildProcess;
  pid: number | undefined;
  ready: boolean;
  running: Running | undefined;
  exited: Promise<void>;
  /** Set when the pool itself stopped the host (retired or shut down): its exit is no crash. */
  stopping: boolean;
  /** Runs out when this host has been idle `idleLingerMs` while another idle host exists. */
  idleTimer: NodeJS.Timeout | undefined;
}

interface Queued {
  job: RpcJob;
  timer: NodeJS.Timeout;
  at: number;
}

const STAT_KEYS = ['bytesIn', 'bytesOut', 'commands', 'setTensorBytes', 'setTensorHashHits'] as const;
const MAX_LOG_LINE = 4096;

/**
 * A bounded pool of ggml-RPC sessions, each served in a child process that receives the
 * connection's fd: a crash inside ggml (an assert in a compute thread, a CUDA fault) ends that
 * session only. Admission is decided here, so a refused connection is refused before anything is
 * handed over and an active session is never dropped to make room. Hosts are spawned on demand,
 * with at most one kept idle (warm) so a session rarely waits for a process start; each device
 * backend a host creates costs memory (a CUDA context per process), so idle hosts beyond one exit.
 */
export class RpcPool {
  readonly #config: PoolConfig;
  readonly #queue: Queued[] = [];
  readonly #hosts = new Set<Host>();
  readonly #setup: unknown[] = [];
  readonly #perSource = new Map<string, number>();
  readonly #runningBy = new Map<string, number>();
  readonly #totals: RpcSessionStats = {
    bytesIn: 0,
    bytesOut: 0,
    commands: 0,
    setTensorBytes: 0,
    setTensorHashHits: 0,
  };
  readonly #sessionEnded = new Set<() => void>();
  #nextId = 1;
  #active = 0;
  #refused = 0;
  #refusedBySource = 0;
  #queueTimeouts = 0;
  #served = 0;
  #failed = 0;
  #crashed = 0;
  #spawned = 0;
  #refusals = 0;
  readonly #ended: Record<string, number> = {};
  #closing = false;
  #warmTimer: NodeJS.Timeout | undefined;
  #lastRefusalLog = 0;
  #refusalsNotLogged = 0;

  constructor(config: PoolConfig) {
    this.#config = config;
  }

  /** Starts the warm host, so the first session does not wait for a process start. */
  warm(): void {
    this.#keepWarm();
  }

  /**
   * Sends `data` to every host, now and to each one spawned later, before any session it serves
   * (e.g. files to index for SET_TENSOR_HASH). A host that cannot apply it logs and reports it.
   */
  broadcast(data: unknown): void {
    this.#setup.push(data);
    for (const host of this.#hosts) this.#send(host, { t: 'setup', data });
  }

  /** True when one more session would be admitted now (ignoring the per-source cap). */
  get hasRoom(): boolean {
    return !this.#closing && this.#active + this.#queue.length < this.#config.size + this.#config.queueSize;
  }

  /**
   * Starts `job` on a free host or queues it. Returns false, counts and logs a refusal when pool and
   * queue are full or its source holds its share already; the caller then closes the connection.
   */
  admit(job: RpcJob): boolean {
    if (!this.hasRoom) {
      this.refuse(job.label, this.#closing ? 'port is closing' : 'pool and queue are full');
      return false;
    }
    const held = this.#perSource.get(job.source) ?? 0;
    const share = this.#config.maxPerSource + Math.ceil(this.#config.queueSize / 2);
    if (held >= share) {
      this.#refusedBySource++;
      this.refuse(
        job.label,
        `its address holds ${held} sessions, running and waiting (maxPerSource ${this.#config.maxPerSource} + half the queue)`,
      );
      return false;
    }
    this.#perSource.set(job.source, held + 1);
    const queued: Queued = {
      job,
      timer: setTimeout(() => this.#expire(queued), this.#config.queueTimeoutMs),
      at: Date.now(),
    };
    this.#queue.push(queued);
    this.#pump();
    return true;
  }

  /** Counts and logs a refusal decided by the caller (one line a second at most, with the count since). */
  refuse(label: string, reason: string): void {
    this.#refused++;
    const now = Date.now();
    if (now - this.#lastRefusalLog < 1000) {
      this.#refusalsNotLogged++;
      return;
    }
    const more = this.#refusalsNotLogged > 0 ? ` (${this.#refusalsNotLogged} more since the last line)` : '';
    this.#lastRefusalLog = now;
    this.#refusalsNotLogged = 0;
    this.#config.logger.warn(`hydra-rpc: refused ggml-RPC connection from ${label}: ${reason}${more}`, {
      active: this.#active,
      queued: this.#queue.length,
      poolSize: this.#config.size,
      queueSize: this.#config.queueSize,
    });
  }

  stats(): RpcPoolStats {
    const out: RpcPoolStats = {
      active: this.#active,
      queued: this.#queue.length,
      refused: this.#refused,
      refusedBySource: this.#refusedBySource,
      queueTimeouts: this.#queueTimeouts,
      served: this.#served,
      failed: this.#failed,
      crashed: this.#crashed,
      hosts: this.#hosts.size,
      hostsSpawned: this.#spawned,
      ended: { ...this.#ended },
      refusals: this.#refusals,
      ...this.#totals,
    };
    for (const host of this.#hosts) {
      if (host.running) addStats(out, host.running.live);
    }
    return out;
  }

  /** The running sessions and the process serving each. */
  sessions(): { label: string; source: string; pid: number | undefined }[] {
    return [...this.#hosts]
      .filter((h) => h.running !== undefined)
      .map((h) => ({ label: h.running!.job.label, source: h.running!.job.source, pid: h.pid }));
  }

  /** Process ids of the live hosts (for tests and diagnostics). */
  hostPids(): number[] {
    return [...this.#hosts].map((h) => h.pid).filter((p): p is number => p !== undefined);
  }

  #expire(queued: Queued): void {
    const at = this.#queue.indexOf(queued);
    if (at < 0) return;
    this.#queue.splice(at, 1);
    this.#queueTimeouts++;
    this.#release(queued.job.source);
    this.#config.logger.warn(
      `hydra-rpc: closed queued ggml-RPC connection from ${queued.job.label}: no free host in ${this.#config.queueTimeoutMs} ms`,
    );
    queued.job.abort();
  }

  #release(source: string): void {
    decrement(this.#perSource, source);
  }

  #spawn(): Host {
    const spec = this.#config.host;
    const child = spawn(spec.command ?? process.execPath, [...spec.args], {
      stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
      env: spec.env ?? process.env,
    });
    this.#spawned++;
    const host: Host = {
      child,
      pid: child.pid,
      ready: false,
      running: undefined,
      stopping: false,
      idleTimer: undefined,
      exited: new Promise((resolve) => {
        child.once('exit', (code, signal) => {
          this.#onExit(host, code, signal);
          resolve();
        });
      }),
    };
    this.#hosts.add(host);
    child.on('error', (err) => this.#config.logger.error('hydra-rpc: ggml-RPC host error', { err }));
    child.on('message', (message: HostMessage) => this.#onMessage(host, message));
    this.#forwardStderr(host);
    for (const data of this.#setup) this.#send(host, { t: 'setup', data });
    return host;
  }

  // The host's stderr (ggml's log, native one-liners) goes to the port's logger, a line at a time.
  #forwardStderr(host: Host): void {
    let pending = '';
    host.child.stderr?.setEncoding('utf8');
    host.child.stderr?.on('data', (text: string) => {
      pending += text;
      for (let nl = pending.indexOf('\n'); nl >= 0; nl = pending.indexOf('\n')) {
        const line = pending.slice(0, nl);
        pending = pending.slice(nl + 1);
        if (line.length > 0)
          this.#config.logger.info(`hydra-rpc: host ${host.pid}: ${line.slice(0, MAX_LOG_LINE)}`);
      }
      if (pending.length > MAX_LOG_LINE) pending = pending.slice(0, MAX_LOG_LINE);
    });
  }

  #send(host: Host, message: unknown, handle?: object, callback?: (err: Error | null) => void): void {
    const done = callback ?? (() => {});
    if (!host.child.connected) {
      done(new Error('host has exited'));
      return;
    }
    try {
      host.child.send(message as never, handle as never, {}, done);
    } catch (err) {
      done(err as Error);
    }
  }

  #onMessage(host: Host, message: HostMessage): void {
    if (typeof message !== 'object' || message === null) return;
    const running = host.running;
    switch (message.t) {
      case 'ready':
        host.ready = true;
        return;
      case 'progress':
        if (running && running.id === message.id) running.live = message.stats ?? {};
        return;
      case 'setup-failed':
        this.#config.logger.warn('hydra-rpc: a ggml-RPC host could not apply its setup', {
          data: message.data,
          error: message.error,
        });
        return;
      case 'done':
      case 'failed': {
        if (!running || running.id !== message.id) return;
        host.running = undefined;
        if (message.t === 'done') {
          this.#served++;
          this.#summarize(running.job.label, message.result);
          this.#logEnded(host, running, message.result);
        } else {
          this.#failed++;
          addStats(this.#totals, running.live);
          this.#config.logger.error(
            `hydra-rpc: ggml-RPC session for ${running.job.label} failed (${sessionContext(host, running)})`,
            { err: message.error },
          );
        }
        this.#finish(running);
        this.#pump();
        if (host.running === undefined) this.#lingerIdle(host);
        return;
      }
    }
  }

  // A session's summary: totals, how it ended (counted by kind) and, when a host ended it for a
  // reason (a refused message, a timeout, an upstream assert), one log line saying why.
  #summarize(label: string, result: Record<string, unknown> | undefined): void {
    addStats(this.#totals, result);
    if (typeof result !== 'object' || result === null) return;
    const { ended, reason, refusedCommand, refusals, error } = result;
    if (typeof ended === 'string' && ended !== '') this.#ended[ended] = (this.#ended[ended] ?? 0) + 1;
    if (typeof refusals === 'number' && Number.isFinite(refusals) && refusals > 0) this.#refusals += refusals;
    const why = [reason, error].filter((v) => typeof v === 'string' && v !== '').join('; ');
    if (why !== '' || (typeof ended === 'string' && ended !== 'client' && ended !== '')) {
      const what = typeof refusedCommand === 'string' ? ` (${refusedCommand})` : '';
      this.#config.logger.warn(
        `hydra-rpc: ggml-RPC session for ${label} ended by the host: ${String(ended ?? 'error')}${what}${why ? `: ${why}` : ''}`,
      );
    }
  }

  // One line per session that ended normally: how it ended, where, how long it waited and ran, and
  // whether any message was answered. A client that reports a failed HELLO is found here: a session
  // that ended before its HELLO was answered is a warning, with how long its host took to take it.
  #logEnded(host: Host, running: Running, result: Record<string, unknown> | undefined): void {
    const r = typeof result === 'object' && result !== null ? result : {};
    const ended = typeof r.ended === 'string' && r.ended !== '' ? r.ended : 'unknown';
    const num = (v: unknown): string => (typeof v === 'number' && Number.isFinite(v) ? String(v) : '?');
    const answered = r.messages;
    const noHello = typeof answered === 'number' && answered === 0;
    const line =
      `hydra-rpc: ggml-RPC session for ${running.job.label} ended (${ended}) ` +
      `${noHello ? 'before its HELLO was answered' : `after ${num(answered)} messages`}, ${sessionContext(host, running)}: ` +
      `${num(r.commands)} commands, ${num(r.bytesIn)} bytes in, ${num(r.bytesOut)} bytes out`;
    const logger = this.#config.logger;
    if (noHello) logger.warn(line);
    // A head's liveness probe every second would otherwise put a line a second in every peer's log.
    else if (r.commands === 0 && logger.debug) logger.debug(line);
    else logger.info(line);
  }

  #onExit(host: Host, code: number | null, signal: NodeJS.Signals | null): void {
    this.#hosts.delete(host);
    clearTimeout(host.idleTimer);
    const running = host.running;
    host.running = undefined;
    const cause = signal !== null ? `killed by ${signal}` : `exited with code ${code}`;
    if (running && host.stopping) {
      // Cut by close() at the shutdown timeout: not a crash.
      running.job.sent();
      addStats(this.#totals, running.live);
      this.#config.logger.info(`hydra-rpc: ggml-RPC session for ${running.job.label} cut at shutdown`);
      this.#finish(running);
    } else if (running) {
      // The handle may never have been acknowledged: let go of this process's copy now.
      running.job.sent();
      this.#crashed++;
      addStats(this.#totals, running.live);
      this.#config.logger.error(
        `hydra-rpc: ggml-RPC session for ${running.job.label} ended: its host process ${host.pid} ${cause} (${sessionContext(host, running)})`,
      );
      this.#finish(running);
    } else if (!host.stopping && !this.#closing) {
      this.#config.logger.warn(`hydra-rpc: idle ggml-RPC host process ${host.pid} ${cause}`);
    }
    if (this.#closing) return;
    // A host that died before it was ever ready is not replaced at once: a host that cannot start
    // (a missing addon, a broken driver) must not become a spawn loop. The next session spawns one.
    if (host.ready || running) this.#keepWarm();
    this.#pump();
  }

  #finish(running: Running): void {
    this.#active--;
    decrement(this.#runningBy, running.job.source);
    this.#release(running.job.source);
    try {
      running.job.ended?.();
    } catch (err) {
      this.#config.logger.error('hydra-rpc: ended() failed', { err });
    }
    for (const notify of this.#sessionEnded) notify();
  }

  #idleHosts(): Host[] {
    return [...this.#hosts].filter((h) => h.running === undefined && !h.stopping && h.child.connected);
  }

  #keepWarm(): void {
    if (this.#closing) return;
    if (this.#idleHosts().length > 0) return;
    if (this.#hosts.size >= this.#config.size + 1) return;
    this.#spawn();
  }

  // Short sessions (a head's probes open and close a connection each) must not churn processes:
  // a host that falls idle lingers, and exits only if it is still idle, and not the last idle one,
  // when the linger runs out.
  #lingerIdle(host: Host): void {
    clearTimeout(host.idleTimer);
    host.idleTimer = setTimeout(() => {
      host.idleTimer = undefined;
      if (host.running !== undefined || host.stopping) return;
      if (this.#idleHosts().length > 1) this.#stop(host);
    }, this.#config.idleLingerMs ?? 10_000);
    host.idleTimer.unref();
  }

  #keepWarmSoon(): void {
    if (this.#warmTimer !== undefined) return;
    this.#warmTimer = setTimeout(() => {
      this.#warmTimer = undefined;
      this.#keepWarm();
    }, this.#config.warmDelayMs ?? 250);
    this.#warmTimer.unref();
  }

  #stop(host: Host): void {
    host.stopping = true;
    // The host exits when its IPC channel closes (native-ggml's rpc-host kills itself then).
    if (host.child.connected) host.child.disconnect();
  }

  // The first waiting job whose source runs fewer than maxPerSource sessions: a source at its cap
  // waits (a head's short probes overlap its long sessions for a moment; refusing them would abort
  // the head) without holding up other sources.
  #nextEligible(): Queued | undefined {
    const at = this.#queue.findIndex(
      (q) => (this.#runningBy.get(q.job.source) ?? 0) < this.#config.maxPerSource,
    );
    return at < 0 ? undefined : this.#queue.splice(at, 1)[0];
  }

  #pump(): void {
    while (!this.#closing && this.#active < this.#config.size) {
      const queued = this.#nextEligible();
      if (queued === undefined) break;
      clearTimeout(queued.timer);
      const { job } = queued;
      const idle = this.#idleHosts();
      const host = idle.find((h) => h.ready) ?? idle[0] ?? this.#spawn();
      let start: ReturnType<RpcJob['start']>;
      try {
        start = job.start();
      } catch (err) {
        this.#failed++;
        this.#release(job.source);
        this.#config.logger.error(`hydra-rpc: could not start ggml-RPC session for ${job.label}`, { err });
        job.abort();
        continue;
      }
      this.#active++;
      this.#runningBy.set(job.source, (this.#runningBy.get(job.source) ?? 0) + 1);
      const now = Date.now();
      const running: Running = {
        id: this.#nextId++,
        job,
        live: {},
        startedAt: now,
        waitedMs: now - queued.at,
        coldHost: !host.ready,
      };
      host.running = running;
      clearTimeout(host.idleTimer);
      host.idleTimer = undefined;
      this.#send(host, { t: 'serve', id: running.id, task: start.task }, start.handle, (err) => {
        job.sent();
        if (err && host.running === running) {
          // The host is gone or its channel broke: the exit handler counts it, or this does.
          host.running = undefined;
          this.#failed++;
          this.#config.logger.error(`hydra-rpc: could not hand ${job.label} to a ggml-RPC host`, { err });
          this.#finish(running);
          this.#stop(host);
          this.#pump();
        }
      });
      this.#keepWarmSoon();
    }
  }

  /**
   * Stops admitting, aborts queued jobs, waits for running sessions up to `timeoutMs`, then kills
   * the hosts still serving (which cuts their connections) and stops the rest.
   */
  async close(timeoutMs: number): Promise<void> {
    this.#closing = true;
    clearTimeout(this.#warmTimer);
    for (const host of this.#hosts) clearTimeout(host.idleTimer);
    for (const queued of this.#queue.splice(0)) {
      clearTimeout(queued.timer);
      this.#release(queued.job.source);
      queued.job.abort();
    }
    for (const host of this.#idleHosts()) this.#stop(host);
    if (this.#active > 0) {
      const allEnded = new Promise<void>((resolve) => {
        const check = () => {
          if (this.#active === 0) {
            this.#sessionEnded.delete(check);
            resolve();
          }
        };
        this.#sessionEnded.add(check);
      });
      if (!(await within(allEnded, timeoutMs))) {
        this.#config.logger.warn('hydra-rpc: ggml-RPC sessions still running at shutdown timeout', {
          active: this.#active,
        });
        for (const host of this.#hosts) {
          host.stopping = true;
          host.child.kill('SIGKILL');
        }
      }
    }
    for (const host of this.#hosts) this.#stop(host);
    const exits = Promise.all([...this.#hosts].map((h) => h.exited));
    if (!(await within(exits, 2000))) {
      for (const host of this.#hosts) host.child.kill('SIGKILL');
      await within(exits, 2000);
    }
  }
}

function sessionContext(host: Host, running: Running): string {
  const cold = running.coldHost ? ', a host still starting' : '';
  return `host ${host.pid}, ${Date.now() - running.startedAt} ms served, ${running.waitedMs} ms queued${cold}`;
}

function decrement(map: Map<string, number>, key: string): void {
  const left = (map.get(key) ?? 1) - 1;
  if (left > 0) map.set(key, left);
  else map.delete(key);
}

function addStats(into: RpcSessionStats, from: unknown): void {
  if (typeof from !== 'object' || from === null) return;
  for (const key of STAT_KEYS) {
    const value = (from as Record<string, unknown>)[key];
    if (typeof value === 'number' && Number.isFinite(value) && value > 0) into[key] += value;
  }
}

async function within(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const result = await Promise.race([
    promise.then(() => true),
    new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), Math.max(0, ms));
    }),
  ]);
  clearTimeout(timer);
  return result;
}
