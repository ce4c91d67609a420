import { readFileSync } from 'node:fs';
import { ENV_BY_KEY, envBool, UNSUPPORTED_FLAGS } from '../llama-flags.js';
import { badArgument as bad, scanArgv } from './argv.js';
import { FLAGS, type FlagSpec } from './table.js';

function convert(spec: FlagSpec, flag: string, raw: string): unknown {
  switch (spec.kind) {
    case 'int': {
      // llama-server's words: -ngl auto|all, -np auto. -ngl auto: the planner picks the most
      // layers that fit (placement.ts resolveAuto), as upstream's --fit does for it.
      if (spec.key === 'n_gpu_layers' && (raw === 'auto' || raw === 'all'))
        return raw === 'auto' ? 'auto' : -2;
      if (spec.key === 'n_parallel' && raw === 'auto') return -1;
      if (!/^-?\d+$/.test(raw)) throw bad(flag, `${flag} needs an integer, got ${JSON.stringify(raw)}`);
      return Number(raw);
    }
    case 'number': {
      const n = Number(raw);
      if (raw.trim() === '' || !Number.isFinite(n))
        throw bad(flag, `${flag} needs a number, got ${JSON.stringify(raw)}`);
      return n;
    }
    case 'numbers':
      // -ts auto: the planner's split (placement.ts resolveAuto).
      if (spec.key === 'tensor_split' && raw === 'auto') return 'auto';
      return raw.split(/[,/]/).map((s) => convert({ ...spec, kind: 'number' }, flag, s));
    case 'list':
    case 'repeat':
      return raw.split(spec.split ?? ',').filter((s) => s.length > 0);
    case 'file':
      try {
        return readFileSync(raw, 'utf8');
      } catch (err) {
        throw bad(flag, `${flag}: cannot read ${raw}: ${(err as Error).message}`);
      }
    case 'bias': {
      // llama-server's TOKEN_ID(+|-)BIAS.
      const m = /^(\d+)([+-](?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)$/.exec(raw);
      if (!m) throw bad(flag, `${flag} needs TOKEN_ID+BIAS or TOKEN_ID-BIAS, got ${JSON.stringify(raw)}`);
      return { [m[1]!]: Number(m[2]) };
    }
    default:
      if (spec.values && !spec.values.includes(raw)) {
        throw bad(flag, `${flag} must be one of ${spec.values.join(', ')}, got ${JSON.stringify(raw)}`);
      }
      return raw;
  }
}

/** Parses flags into raw values keyed by field key (`@`-keys are engine settings). */
export function parseFlags(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>> = {},
): Map<string, unknown> {
  const out = new Map<string, unknown>();
  const hits = scanArgv(
    argv,
    (name) => FLAGS.find((f) => f.names.includes(name)),
    (f) => ({
      takes: f.kind === 'flag' ? 'none' : f.bare !== undefined ? 'optional' : 'value',
      ...(f.values ? { values: f.values } : {}),
    }),
    (name, arg) => {
      const refused = UNSUPPORTED_FLAGS.find((f) => f.names.includes(name));
      if (refused) return bad(name, `${name} is not supported yet: ${refused.why}`);
      return bad(
        name,
        arg.startsWith('-') ? `unknown flag ${name}` : `unexpected argument ${JSON.stringify(arg)}`,
      );
    },
  );
  for (const { flag: spec, name, raw } of hits) {
    const value = raw === undefined ? spec.bare : convert(spec, name, raw);
    if (spec.key === '@same') continue;
    if (spec.kind === 'repeat') {
      out.set(spec.key, [...((out.get(spec.key) as string[]) ?? []), ...(value as string[])]);
    } else if (spec.kind === 'bias') {
      out.set(spec.key, { ...((out.get(spec.key) as object) ?? {}), ...(value as object) });
    } else {
      if (out.has(spec.key)) throw bad(name, `${name} given twice`);
      out.set(spec.key, value);
    }
  }
  readEnv(out, env);
  return out;
}

// llama-server's LLAMA_ARG_* variables: a flag on the command line wins; a variable of a feature
// that does not exist yet is refused as its flag is (a falsy one asks for what already runs).
function readEnv(out: Map<string, unknown>, env: Readonly<Record<string, string | undefined>>): void {
  for (const f of UNSUPPORTED_FLAGS) {
    const raw = f.env !== undefined ? env[f.env] : undefined;
    if (raw === undefined || raw === '' || (!f.takesValue && envBool(raw) === false)) continue;
    throw bad(f.env!, `${f.env} (${f.names.at(-1)}) is not supported yet: ${f.why}`);
  }
  for (const [key, named] of Object.entries(ENV_BY_KEY)) {
    const inverted = named.startsWith('!');
    const name = inverted ? named.slice(1) : named;
    const raw = env[name];
    if (raw === undefined || out.has(key)) continue;
    const spec = FLAGS.find((f) => f.key === key && f.bare !== false) ?? FLAGS.find((f) => f.key === key)!;
    if (spec.kind === 'flag') {
      const on = envBool(raw);
      if (on === undefined)
        throw bad(name, `${name} must be true|false|1|0|on|off|enabled|disabled, got ${JSON.stringify(raw)}`);
      out.set(key, inverted ? !on : on);
    } else out.set(key, convert(spec, name, raw));
  }
}
