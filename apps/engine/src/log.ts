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
    close() {
      if (file !== undefined) closeSync(file);
      file = undefined;
    },
  };
}

function round(ms: number): number {
  return Math.round(ms * 10) / 10;
}
