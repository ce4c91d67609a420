import { scanArgv } from '../argv.js';
import { HydraError } from '../errors.js';
import { type SynthModelResult, type SynthProgress, writeSyntheticModel } from './generate.js';
import {
  SYNTH_ARCH_SHAPES,
  SYNTH_ARCHS,
  SYNTH_QUANTS,
  SYNTH_SHAPES,
  type SynthArch,
  type SynthQuant,
  type SynthShape,
} from './shapes.js';

/** The options `synth-model` parses from its flags. */
export interface SynthArgs {
  arch: SynthArch;
  shape: SynthShape;
  quant: SynthQuant;
  seed: number;
  out: string;
  /** `--extra-layers N --extra-scale X`: a speculative target over the plain model (SYNTH.md). */
  extraLayers?: number;
  extraScale?: number;
}

export const SYNTH_USAGE = `usage: hydra-engine synth-model --out FILE [--arch llama|moe|qwen35|qwen35moe]
                               [--shape tiny|1b|8b|27b|small-wide|35b-a3b]
                               [--quant f32|f16|q8_0|q4_0] [--seed N]
                               [--extra-layers N [--extra-scale X]]   (a speculative target)
shapes: llama, moe: tiny 1b 8b 27b small-wide; qwen35: tiny 27b; qwen35moe: tiny 35b-a3b
defaults: --arch llama --shape tiny --quant q8_0 --seed 0`;

const FLAGS = ['arch', 'shape', 'quant', 'seed', 'out', 'extra-layers', 'extra-scale'] as const;
type Flag = (typeof FLAGS)[number];

function bad(key: string, message: string): HydraError {
  return new HydraError('HYDRA_ERR_BAD_ARGUMENT', `${message}\n${SYNTH_USAGE}`, { keys: [key] });
}

function oneOf<T extends string>(key: string, value: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(value)) {
    throw bad(key, `--${key} must be one of ${allowed.join(', ')}, got ${JSON.stringify(value)}`);
  }
  return value as T;
}

/**
 * Parses `--arch --shape --quant --seed --out` (as `--flag value` or `--flag=value`, read by the
 * repository's one argv scanner: a word starting with a dash is no value unless it is a negative
 * number). Unknown, repeated or valueless flags, stray arguments, bad values and a missing `--out`
 * throw a HydraError with code `HYDRA_ERR_BAD_ARGUMENT` whose `keys` name the offending flag.
 */
export function parseSynthArgs(argv: readonly string[]): SynthArgs {
  const seen = new Map<Flag, string>();
  const hits = scanArgv(
    argv,
    (name) => (FLAGS as readonly string[]).find((f) => `--${f}` === name) as Flag | undefined,
    () => ({ takes: 'value' }),
    {
      unknown: (name, arg) =>
        arg.startsWith('--')
          ? bad(name.slice(2), `unknown flag ${name}`)
          : bad(arg, `unexpected argument ${JSON.stringify(arg)}`),
      bad: (name, message) => bad(name.slice(2), message),
    },
  );
  for (const { flag, raw } of hits) {
    if (seen.has(flag)) throw bad(flag, `--${flag} given twice`);
    if (raw === undefined || raw.length === 0) throw bad(flag, `--${flag} needs a value`);
    seen.set(flag, raw);
  }
  const out = seen.get('out');
  if (out === undefined) throw bad('out', '--out FILE is required');
  const seedText = seen.get('seed') ?? '0';
  const seed = /^[0-9]{1,10}$/.test(seedText) ? Number(seedText) : Number.NaN;
  if (!(seed <= 0xffffffff))
    throw bad('seed', `--seed must be an integer in [0, 4294967295], got ${seedText}`);
  const arch = oneOf('arch', seen.get('arch') ?? 'llama', SYNTH_ARCHS);
  const shape = oneOf('shape', seen.get('shape') ?? 'tiny', SYNTH_SHAPES);
  if (!SYNTH_ARCH_SHAPES[arch].includes(shape)) {
    throw bad(
      'shape',
      `--shape ${shape} does not exist for --arch ${arch} (${SYNTH_ARCH_SHAPES[arch].join(', ')})`,
    );
  }
  const parsed: SynthArgs = {
    arch,
    shape,
    quant: oneOf('quant', seen.get('quant') ?? 'q8_0', SYNTH_QUANTS),
    seed,
    out,
  };
  const extraText = seen.get('extra-layers');
  if (extraText !== undefined) {
    const n = /^[0-9]{1,3}$/.test(extraText) ? Number(extraText) : Number.NaN;
    if (!(n >= 1 && n <= 256))
      throw bad('extra-layers', `--extra-layers must be an integer in [1, 256], got ${extraText}`);
    if (arch !== 'llama' && arch !== 'moe')
      throw bad('extra-layers', '--extra-layers needs --arch llama or moe');
    parsed.extraLayers = n;
  }
  const scaleText = seen.get('extra-scale');
  if (scaleText !== undefined) {
    const x = /^[0-9]+(\.[0-9]+)?$/.test(scaleText) ? Number(scaleText) : Number.NaN;
    if (!(x >= 0 && x <= 16))
      throw bad('extra-scale', `--extra-scale must be a number in [0, 16], got ${scaleText}`);
    if (parsed.extraLayers === undefined) throw bad('extra-scale', '--extra-scale needs --extra-layers');
    parsed.extraScale = x;
  }
  return parsed;
}

/** Where {@link runSynthCli} prints. */
export interface SynthCliIo {
  stdout: { write(text: string): unknown };
  stderr: { write(text: string): unknown };
}

const PROGRESS_MIN_BYTES = 256 << 20;
const GIB = 1024 ** 3;

/**
 * The `synth-model` command: prints usage for `--help`/`-h` (and returns null), otherwise writes
 * the model, reports progress on stderr for files over 256 MiB (about once a second), and prints
 * a one-line JSON summary on stdout. Errors propagate as HydraError for the caller to report.
 */
export async function runSynthCli(
  argv: readonly string[],
  io: SynthCliIo = { stdout: process.stdout, stderr: process.stderr },
): Promise<SynthModelResult | null> {
  if (argv.includes('--help') || argv.includes('-h')) {
    io.stdout.write(`${SYNTH_USAGE}\n`);
    return null;
  }
  const args = parseSynthArgs(argv);
  const started = performance.now();
  let lastPrint = 0;
  const onProgress = (p: SynthProgress): void => {
    if (p.totalBytes < PROGRESS_MIN_BYTES) return;
    const now = performance.now();
    if (now - lastPrint < 1000 && p.bytesWritten < p.totalBytes) return;
    lastPrint = now;
    const rate = p.bytesWritten / 1e6 / Math.max((now - started) / 1000, 1e-3);
    io.stderr.write(
      `synth-model: ${(p.bytesWritten / GIB).toFixed(2)}/${(p.totalBytes / GIB).toFixed(2)} GiB ` +
        `(${Math.floor((100 * p.bytesWritten) / p.totalBytes)}%), tensor ${p.tensorsDone}/${p.tensorCount}, ` +
        `${rate.toFixed(0)} MB/s\n`,
    );
  };
  const result = await writeSyntheticModel({ ...args, onProgress });
  io.stdout.write(
    `${JSON.stringify({
      path: result.path,
      bytes: result.bytes,
      nParams: result.nParams,
      tensors: result.tensors,
      arch: result.arch,
      shape: result.shape,
      quant: result.quant,
      seed: result.seed,
      hparams: result.hparams,
      seconds: Number(result.seconds.toFixed(3)),
      mbPerSecond: Number((result.bytesPerSecond / 1e6).toFixed(1)),
    })}\n`,
  );
  return result;
}
