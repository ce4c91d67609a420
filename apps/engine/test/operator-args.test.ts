import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseServeArgs } from '../src/args.js';

describe('operation flags (load failure, shutdown, logs)', () => {
  it('defaults: exit on a failed start-up load, 10 s shutdown, auto JSON/text logs at info', () => {
    const s = parseServeArgs([]).settings;
    expect(s).toMatchObject({
      keepUpOnLoadFailure: false,
      shutdownTimeoutS: 10,
      logFormat: 'auto',
      logLevel: 'info',
      logFile: undefined,
    });
  });

  it('reads the flags and the hydra: keys of --config', () => {
    const s = parseServeArgs([
      '--keep-up-on-load-failure',
      '--shutdown-timeout',
      '3',
      '--log-format',
      'text',
      '--log-level',
      'debug',
      '--log-file',
      '/tmp/x.log',
    ]).settings;
    expect(s).toMatchObject({
      keepUpOnLoadFailure: true,
      shutdownTimeoutS: 3,
      logFormat: 'text',
      logLevel: 'debug',
      logFile: '/tmp/x.log',
    });
    const dir = mkdtempSync(join(tmpdir(), 'hydra-args-'));
    const file = join(dir, 'c.yaml');
    writeFileSync(
      file,
      'hydra:\n  keep_up_on_load_failure: true\n  shutdown_timeout: 7\n  log_format: json\n  log_level: warn\n',
    );
    expect(parseServeArgs(['--config', file]).settings).toMatchObject({
      keepUpOnLoadFailure: true,
      shutdownTimeoutS: 7,
      logFormat: 'json',
      logLevel: 'warn',
    });
  });

  it('refuses bad values by name', () => {
    for (const [argv, key] of [
      [['--log-format', 'xml'], '@logFormat'],
      [['--log-level', 'loud'], '@logLevel'],
      [['--shutdown-timeout', '0'], '@shutdownTimeoutS'],
      [['--keep-up-on-load-failure=yes'], '--keep-up-on-load-failure'],
    ] as const) {
      expect(() => parseServeArgs([...argv]), argv.join(' ')).toThrow(
        expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT', keys: [key] }),
      );
    }
    const dir = mkdtempSync(join(tmpdir(), 'hydra-args-'));
    const file = join(dir, 'c.yaml');
    writeFileSync(file, 'hydra:\n  keep_up_on_load_failure: "yes"\n');
    expect(() => parseServeArgs(['--config', file])).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_CONFIG_INVALID', keys: ['keep_up_on_load_failure'] }),
    );
  });
});
