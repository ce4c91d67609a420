/** Where the port writes its log lines; `console` fits. */
export interface Logger {
  /** Routine lines (a probe session that ran no command); `info` when absent. */
  debug?(message: string, fields?: Record<string, unknown>): void;
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

/** Writes warnings and errors to stderr as one line each; info is dropped. */
export const stderrLogger: Logger = {
  info() {},
  warn(message, fields) {
    process.stderr.write(`${message}${fields === undefined ? '' : ` ${safeJson(fields)}`}\n`);
  },
  error(message, fields) {
    process.stderr.write(`${message}${fields === undefined ? '' : ` ${safeJson(fields)}`}\n`);
  },
};

function safeJson(fields: Record<string, unknown>): string {
  try {
    return JSON.stringify(fields, (_key, value: unknown) =>
      value instanceof Error
        ? { name: value.name, message: value.message, code: (value as { code?: unknown }).code }
        : value,
    );
  } catch {
    return '{}';
  }
}
