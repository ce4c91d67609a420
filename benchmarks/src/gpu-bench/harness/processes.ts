import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { connect } from 'node:net';

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A spawned process with the start and the tail of its stderr (stdout is discarded). */
export interface Child {
  readonly process: ChildProcess;
  /** The last 4,000 characters of stderr. */
  tail(): string;
  /** The first 64,000 characters of stderr (a start-up line that the tail may have lost). */
  head(): string;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** True once it has exited. */
  done(): boolean;
}

export interface StartOptions {
  env?: Record<string, string>;
}

/**
 * The processes one benchmark run started: each is killed when the run ends, however it ends
 * (exit, SIGINT, SIGTERM, a part's end), so no engine outlives the call.
 */
export class ProcessGroup {
  readonly #children = new Set<Child>();

  /** Kills what is left on exit and on SIGINT/SIGTERM (exit 130). */
  installExitHandlers(): void {
    process.on('exit', () => this.killAll());
    for (const sig of ['SIGINT', 'SIGTERM'] as const)
      process.on(sig, () => {
        this.killAll();
        process.exit(130);
      });
  }

  start(cmd: string, args: readonly string[], options: StartOptions = {}): Child {
    const proc = spawn(cmd, args, {
      env: { ...process.env, ...options.env },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let tail = '';
    let head = '';
    proc.stderr?.on('data', (d: Buffer) => {
      tail = (tail + d.toString()).slice(-4000);
      if (head.length < 64_000) head = (head + d.toString()).slice(0, 64_000);
    });
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((ok) =>
      proc.once('exit', (code, signal) => ok({ code, signal })),
    );
    const child: Child = {
      process: proc,
      tail: () => tail,
      head: () => head,
      exited,
      done: () => proc.exitCode !== null || proc.signalCode !== null,
    };
    this.#children.add(child);
    proc.once('exit', () => this.#children.delete(child));
    return child;
  }

  /** SIGTERM, then SIGKILL after `graceMs`; resolves once it has exited. */
  async stop(child: Child | undefined, graceMs = 15_000): Promise<void> {
    if (!child || child.done()) return;
    child.process.kill('SIGTERM');
    const done = await Promise.race([child.exited.then(() => true), sleep(graceMs).then(() => false)]);
    if (!done) {
      child.process.kill('SIGKILL');
      await child.exited;
    }
  }

  killAll(): void {
    for (const c of this.#children) c.process.kill('SIGKILL');
  }
}

/** Runs a tool to its end; rejects with its stderr tail on a non-zero exit or after `timeoutMs`. */
export function runTool(
  file: string,
  args: readonly string[],
  timeoutMs: number,
  env: Record<string, string> = {},
): Promise<{ stdout: string; stderr: string; ms: number }> {
  const started = performance.now();
  return new Promise((ok, ko) =>
    execFile(
      file,
      args,
      { env: { ...process.env, ...env }, timeout: timeoutMs, maxBuffer: 256 << 20, encoding: 'utf8' },
      (err, stdout, stderr) =>
        err
          ? ko(Object.assign(new Error(`${file}: ${err.message}\n${stderr.slice(-2000)}`), { stderr }))
          : ok({ stdout, stderr, ms: performance.now() - started }),
    ),
  );
}

/**
 * Polls `url` until `accept(status, body)` holds; returns ms since `since`. Fails at once when
 * `child` exits or the body says `state: "error"` (an engine whose load failed).
 */
export async function waitHttp(
  url: string,
  accept: (status: number, body: Record<string, unknown>) => boolean,
  since: number,
  child: Child | undefined,
  timeoutMs: number,
  pollMs = 5,
): Promise<number> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (child?.done()) throw new Error(`process exited before ready:\n${child.tail()}`);
    let body: Record<string, unknown> = {};
    let status = 0;
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
      status = res.status;
      body = ((await res.json().catch(() => ({}))) ?? {}) as Record<string, unknown>;
    } catch {
      // not listening yet, or too busy to answer within 2 s: poll again
    }
    if (status && accept(status, body)) return performance.now() - since;
    if (body.state === 'error') throw new Error(`engine reports state error:\n${child?.tail() ?? ''}`);
    if (Date.now() > end) throw new Error(`not ready after ${timeoutMs} ms:\n${child?.tail() ?? ''}`);
    await sleep(pollMs);
  }
}

/** Resolves once `port` on 127.0.0.1 accepts a connection. */
export async function waitTcp(port: number, child: Child | undefined, timeoutMs: number): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (child?.done()) throw new Error(`process exited before listening:\n${child.tail()}`);
    const ok = await new Promise<boolean>((r) => {
      const s = connect(port, '127.0.0.1');
      s.once('connect', () => {
        s.destroy();
        r(true);
      });
      s.once('error', () => r(false));
    });
    if (ok) return;
    if (Date.now() > end)
      throw new Error(`port ${port} not listening after ${timeoutMs} ms:\n${child?.tail() ?? ''}`);
    await sleep(20);
  }
}
