import fc from 'fast-check';
import { FIELDS, type FieldSpec, type FieldType, isRuntimeField, type Params } from '../src/index.js';

const HEX = [...'0123456789abcdef'];

/** Valid values for fields whose strings carry a format. */
const FORMATTED: Record<string, fc.Arbitrary<unknown>> = {
  rpc_servers: fc.array(
    fc
      .tuple(
        fc.constantFrom('localhost', '10.0.0.2', 'peer-1.lan', '[::1]'),
        fc.integer({ min: 1, max: 65_535 }),
      )
      .map(([h, p]) => `${h}:${p}`),
    { maxLength: 3 },
  ),
  override_tensors: fc.array(
    fc.constantFrom(
      'blk\\..*\\.ffn_.*_exps\\.weight=RPC0',
      'token_embd=CPU',
      'output=CPU',
      'output_norm=CPU',
    ),
    { maxLength: 4 },
  ),
  kv_overrides: fc.array(fc.constantFrom('a.b=int:1', 'x=str:hi', 'y=bool:true', 'z=float:0.5'), {
    maxLength: 3,
  }),
  'cpuparams.cpumask': fc.string({ unit: fc.constantFrom(...HEX), maxLength: 8 }),
  'cpuparams_batch.cpumask': fc.string({ unit: fc.constantFrom(...HEX), maxLength: 8 }),
  device_memory_cap: fc.array(
    fc
      .tuple(fc.constantFrom('CPU', 'CUDA0', 'RPC0'), fc.integer({ min: 1, max: 999_999_999 }))
      .map(([n, m]) => `${n}=${m}`),
    { maxLength: 3 },
  ),
  'sampling.logit_bias': fc.dictionary(
    fc.integer({ min: 0, max: 200_000 }).map(String),
    fc.double({ min: -100, max: 100, noNaN: true }),
    {
      maxKeys: 3,
    },
  ),
};

function arbitraryOf(type: FieldType): fc.Arbitrary<unknown> {
  switch (type.kind) {
    case 'int':
      return fc.integer({ min: type.min, max: type.max });
    case 'number':
      return fc.double({ min: type.min, max: type.max, noNaN: true, noDefaultInfinity: true });
    case 'bool':
      return fc.boolean();
    case 'string':
      return fc.string({ maxLength: Math.min(type.maxLength, 12) });
    case 'enum':
      return fc.constantFrom(...type.values);
    case 'list':
      return fc.array(arbitraryOf(type.of), { maxLength: Math.min(type.maxItems, 4) });
    case 'map':
      return fc.dictionary(fc.string({ minLength: 1, maxLength: 6 }), arbitraryOf(type.of), { maxKeys: 3 });
    case 'auto':
      return fc.oneof(fc.constant('auto'), arbitraryOf(type.of));
  }
}

/** A valid value for a field, as the wire would carry it. */
export function validValue(spec: FieldSpec): fc.Arbitrary<unknown> {
  return FORMATTED[spec.key] ?? arbitraryOf(spec.type);
}

/** Fields a CONFIGURE delta may name. */
export const RUNTIME = FIELDS.filter(isRuntimeField);

/** A valid CONFIGURE delta in canonical dotted keys, 1..maxKeys keys. */
export function validDelta(maxKeys = 12): fc.Arbitrary<Params> {
  return fc
    .uniqueArray(fc.constantFrom(...RUNTIME), { minLength: 1, maxLength: maxKeys, selector: (s) => s.key })
    .chain((specs) => fc.tuple(...specs.map((s) => validValue(s).map((v) => [s.key, v] as const))))
    .map((entries) => Object.fromEntries(entries));
}

/** The nested form of a dotted delta: `{"sampling.temp": 1}` -> `{"sampling": {"temp": 1}}`. */
export function nest(delta: Params): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(delta)) {
    const parts = key.split('.');
    let node = out;
    for (const part of parts.slice(0, -1)) {
      node[part] ??= {};
      node = node[part] as Record<string, unknown>;
    }
    node[parts.at(-1)!] = value;
  }
  return out;
}
