import { closeSync, openSync, writeSync } from 'node:fs';
import { pino } from 'pino';
import { HydraError } from './errors.js';
import type { RequestRecord } from './metrics.js';

export type LogFormat = 'auto' | 'json' | 'text';
export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal' | 'silent';

/** Where log lines go: stderr by default; tests pass a sink of their own. */
export interface LogSink {
  write(text: string): unknown;
  isTTY?: boolean;
}

export interface LogOptions {
  /** `json`: one JSON object a line; `text`: `TIME LEVEL message key=value`; `auto`: text on a TTY. */
  format?: LogFormat;
  level?: LogLevel;
  /** Every line (JSON, whatever `format`) is appended to this file as well. */
  file?: string;
  sink?: LogSink;
}

/**
 * A lifecycle event, logged as one structured line whose `event` and `cause` fields name it (the
 * message is for people; tools read the fields). Causes: `startup` (the `-m` load),
 * `configure` (a CONFIGURE or control request applied at once), `deferred` (applied when the slots
 * drained or the drain timeout passed), `watchdog` / `load` / `context` (what saw a peer loss),
 * `peer_answered` (a lost peer answered again).
 */
export type LifecycleEvent =
  | {
      event: 'load';
      cause: 'startup' | 'configure' | 'deferred';
      model: string;
      seconds: number;
      epoch: number;
    }
  | { event: 'load_failed'; cause: 'startup'; code: string; message: string }
  | {
      event: 'reconfigure';
      cause: 'configure' | 'deferred';
      rebuild: 'none' | 'sampler' | 'context' | 'model';
      keys: string[];
      epoch: number;
      ms: number;
    }
  | {
      event: 'reconfigure_failed';
      cause: 'configure' | 'deferred';
      rebuild: 'context' | 'model';
      keys: string[];
      code: string;
      message: string;
      restored: boolean;
    }
  | {
      event: 'failover';
      cause: 'watchdog' | 'load' | 'context';
      reason: string;
      peers: string[];
      action: 'solo' | 'offload' | 'none';
      ended_requests: number;
      rejoin: boolean;
    }
  | { event: 'rejoin'; cause: 'peer_answered'; peers: string[] }
  | { event: 'rejoin_failed'; cause: 'peer_answered'; peers: string[]; message: string };

const FAILED = new Set(['load_failed', 'reconfigure_failed', 'rejoin_failed']);

function lifecycleMessage(e: LifecycleEvent): string {
  switch (e.event) {
    case 'load':
      return `hydra-engine: model loaded (${e.cause}): ${e.model} in ${e.seconds.toFixed(2)} s, epoch ${e.epoch}`;
    case 'load_failed':
      return `hydra-engine: model load failed (${e.cause}): ${e.code}: ${e.message}`;
    case 'reconfigure':
      return `hydra-engine: ${e.rebuild} rebuild of ${e.keys.join(', ')} applied (${e.cause}) in ${e.ms} ms, epoch ${e.epoch}`;
    case 'reconfigure_failed':
      return `hydra-engine: ${e.rebuild} rebuild of ${e.keys.join(', ')} failed (${e.cause}): ${e.code}`;
    case 'failover':
      return `hydra-engine: failover (${e.cause}) from ${e.peers.join(', ')}: ${e.action}; ${e.reason}`;
    case 'rejoin':
      return `hydra-engine: lost peer(s) ${e.peers.join(', ')} answer again; restoring COMBINE`;
    case 'rejoin_failed':
      return `hydra-engine: rejoin of ${e.peers.join(', ')} failed: ${e.message}`;
  }
}

/** The engine's logger: pino's levels and JSON lines, with {@link close} for the log file. */
export interface EngineLogger {
  trace(msg: string, fields?: Record<string, unknown>): void;
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  fatal(msg: string, fields?: Record<string, unknown>): void;
  /** One line per answered request (route, status, tokens, TTFT, duration, epoch). */
  request(rec: RequestRecord): void;
  /** One line per lifecycle event (`event`, `cause` and the event's fields); failures at warn. */
  lifecycle(e: LifecycleEvent): void;
  close(): void;
}

const LEVEL_NAMES: Record<number, string> = {
  10: 'TRACE',
  20: 'DEBUG',
  30: 'INFO',
  40: 'WARN',
  50: 'ERROR',
  60: 'FATAL',
};

// Reformats pino's JSON line for a person; the fields pino adds itself are shown once, in front.
function textLine(json: string): string {
  let o: Record<string, unknown>;
  try {
    o = JSON.parse(json) as Record<string, unknown>;
  } catch {
    return json;
  }
  const { level, time, msg, pid: _pid, hostname: _host, ...rest } = o;
  // A request line's message already reads "METHOD route status".
  if (rest.event === 'request') {
    for (const k of ['event', 'method', 'route', 'status']) delete rest[k];
  }
  const extra = Object.entries(rest)
    .map(([k, v]) => `${k}=${typeof v === 'string' && !/\s/.test(v) ? v : JSON.stringify(v)}`)
    .join(' ');
  const when = typeof time === 'number' ? new Date(time).toISOString() : '';
  const name = LEVEL_NAMES[level as number] ?? String(level);
  return `${when} ${name.padEnd(5)} ${msg ?? ''}${extra ? ` ${extra}` : ''}\n`;
}

const FORMATS = new Set<LogFormat>(['auto', 'json', 'text']);
const LEVELS = new Set<LogLevel>(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']);

/**
 * Creates the engine's logger. Throws `HYDRA_ERR_BAD_ARGUMENT` for an unknown format or level, or
 * a log file that cannot be opened for appending.
 */
export function createLogger(options: LogOptions = {}): EngineLogger {
  const format = options.format ?? 'auto';
  const level = options.level ?? 'info';
  if (!FORMATS.has(format))
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.format must be auto|json|text', {
      keys: ['--log-format'],
    });
  if (!LEVELS.has(level))
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `options.level must be ${[...LEVELS].join('|')}`, {
      keys: ['--log-level'],
    });
  const sink = options.sink ?? process.stderr;
  const text = format === 'text' || (format === 'auto' && sink.isTTY === true);
  let fd: number | undefined;
  if (options.file !== undefined) {
    try {
      fd = openSync(options.file, 'a');
    } catch (err) {
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `cannot open the log file: ${(err as Error).message}`, {
        keys: ['--log-file'],
        cause: err,
      });
    }
  }
  let file = fd;
  // Synchronous writes: the lines before a process.exit (a failed load, a shutdown) must not be lost.
  const stream = {
    write(line: string) {
      sink.write(text ? textLine(line) : line);
      if (file !== undefined) writeSync(file, line);
    },
  };
  const log = pino({ level, base: { pid: process.pid }, timestamp: pino.stdTimeFunctions.epochTime }, stream);
  const at =
    (lvl: 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal') =>
    (msg: string, fields?: Record<string, unknown>) =>
      fields ? log[lvl](fields, msg) : log[lvl](msg);
  return {
    trace: at('trace'),
    debug: at('debug'),
    info: at('info'),
    warn: at('warn'),
    error: at('error'),
    fatal: at('fatal'),
    request(rec) {
      const fields: Record<string, unknown> = {
        event: 'request',
        method: rec.method,
        route: rec.route,
        status: rec.status,
        duration_ms: round(rec.durationMs),
      };
      if (rec.promptTokens !== undefined) {
        fields.prompt_tokens = rec.promptTokens;
        fields.completion_tokens = rec.completionTokens;
        fields.cached_tokens = rec.cachedTokens;
        fields.finish_reason = rec.finishReason;
        fields.epoch = rec.epoch;
        if (rec.slot !== undefined) fields.slot = rec.slot;
        if (rec.queueMs !== undefined) fields.queue_ms = round(rec.queueMs);
      }
      if (rec.ttftMs !== undefined) fields.ttft_ms = round(rec.ttftMs);
      if (rec.code !== undefined) fields.code = rec.code;
      // A status 0 is a client that went away before any answer.
      const lvl = rec.status >= 500 || rec.status === 0 ? 'warn' : 'info';
      log[lvl](fields, `${rec.method} ${rec.route} ${rec.status}`);
    },
    lifecycle(e) {
      log[FAILED.has(e.event) ? 'warn' : 'info']({ ...e }, lifecycleMessage(e));
    },
    close() {
      if (file !== undefined) closeSync(file);
      file = undefined;
    },
  };
}

function round(ms: number): number {
  return Math.round(ms * 10) / 10;
}
