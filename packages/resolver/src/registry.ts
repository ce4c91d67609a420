import { isMap, isScalar, isSeq, LineCounter, type Node, parseDocument } from 'yaml';
import { fail } from './errors.js';
import { KV_CACHE_TYPES } from './gguf/ggml-types.js';
import type { ModelClass } from './model-facts.js';

/** Per-model defaults, keyed by CONFIGURE (common_params) field names. */
export interface ModelDefaults {
  readonly n_ctx?: number;
  readonly cache_type_k?: string;
  readonly cache_type_v?: string;
  readonly n_gpu_layers?: number;
  readonly n_cpu_moe?: number;
  readonly override_tensors?: readonly string[];
  readonly tensor_split?: readonly number[];
}

/** One registry entry: an alias for a GGUF path, with its defaults. */
export interface ModelEntry {
  readonly alias: string;
  readonly path: string;
  /** Declared model class; when absent the caller reads it from the GGUF (modelClassOf). */
  readonly class?: ModelClass;
  /** The COMBINE peer (`host:port`) this model uses by default. */
  readonly peer?: string;
  readonly defaults: ModelDefaults;
}

const ALIAS = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
const PEER = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$/;
const ENTRY_KEYS = [
  'path',
  'class',
  'peer',
  'n_ctx',
  'cache_type_k',
  'cache_type_v',
  'n_gpu_layers',
  'n_cpu_moe',
  'override_tensors',
  'tensor_split',
] as const;

/** True when `peer` is a `host:port` address with a port in 1..65535. */
export function isPeerAddress(peer: unknown): peer is string {
  if (typeof peer !== 'string') return false;
  const m = PEER.exec(peer);
  return m !== null && Number(m[2]) >= 1 && Number(m[2]) <= 65535;
}

/**
 * The model registry: the `models:` map of the engine's YAML config, mapping aliases to GGUF paths
 * and per-model defaults. Other top-level keys belong to the engine and are ignored here.
 */
export class ModelRegistry {
  readonly #entries: Map<string, ModelEntry>;

  private constructor(entries: Map<string, ModelEntry>) {
    this.#entries = entries;
  }

  /**
   * Parses and validates YAML text. Every problem throws HYDRA_ERR_REGISTRY_INVALID whose message
   * starts `file:line:col` and whose `details` carry `{file, line, column, key}`.
   */
  static parse(text: string, file = '<config>'): ModelRegistry {
    if (typeof text !== 'string') fail('HYDRA_ERR_BAD_VALUE', 'text must be a string');
    const lc = new LineCounter();
    const doc = parseDocument(text, { lineCounter: lc, uniqueKeys: true, prettyErrors: false });
    const invalid = (offset: number, key: string, msg: string): never => {
      const { line, col } = lc.linePos(offset);
      return fail('HYDRA_ERR_REGISTRY_INVALID', `${file}:${line}:${col}: ${key ? `${key}: ` : ''}${msg}`, {
        keys: key ? [key] : [],
        details: { file, line, column: col, key },
      });
    };
    const firstError = doc.errors[0];
    if (firstError !== undefined) invalid(firstError.pos[0], '', firstError.message.split('\n')[0] as string);
    const at = (n: Node | null | undefined): number => n?.range?.[0] ?? 0;

    const entries = new Map<string, ModelEntry>();
    const root = doc.contents;
    if (root === null || (isScalar(root) && (root.value === null || root.value === undefined))) {
      return new ModelRegistry(entries);
    }
    if (!isMap(root)) return invalid(at(root), '', 'the config must be a mapping');
    const modelsNode = root.get('models', true) as Node | undefined;
    if (modelsNode === undefined || (isScalar(modelsNode) && modelsNode.value === null)) {
      return new ModelRegistry(entries);
    }
    if (!isMap(modelsNode)) return invalid(at(modelsNode), 'models', 'must be a mapping of alias to model');

    for (const pair of modelsNode.items) {
      const keyNode = pair.key as Node;
      const alias = isScalar(keyNode) ? keyNode.value : undefined;
      if (typeof alias !== 'string' || !ALIAS.test(alias)) {
        invalid(at(keyNode), 'models', `alias ${JSON.stringify(alias)} must match ${ALIAS}`);
      }
      const base = `models.${alias as string}`;
      const body = pair.value as Node | null;
      if (!isMap(body)) return invalid(at(body ?? keyNode), base, 'must be a mapping with at least `path`');

      const seen = new Map<string, Node>();
      for (const p of body.items) {
        const k = isScalar(p.key) ? p.key.value : undefined;
        if (typeof k !== 'string' || !(ENTRY_KEYS as readonly string[]).includes(k)) {
          invalid(at(p.key as Node), `${base}.${String(k)}`, `unknown key (known: ${ENTRY_KEYS.join(', ')})`);
        }
        seen.set(k as string, (p.value ?? p.key) as Node);
      }
      const node = (k: string) => seen.get(k);
      const scalar = (k: string): unknown => {
        const n = node(k);
        if (n === undefined) return undefined;
        if (!isScalar(n)) invalid(at(n), `${base}.${k}`, 'must be a scalar');
        return (n as { value: unknown }).value;
      };
      const str = (k: string, test: (s: string) => boolean, what: string): string | undefined => {
        const v = scalar(k);
        if (v === undefined) return undefined;
        if (typeof v !== 'string' || !test(v)) invalid(at(node(k)), `${base}.${k}`, `must be ${what}`);
        return v as string;
      };
      const int = (k: string, min: number): number | undefined => {
        const v = scalar(k);
        if (v === undefined) return undefined;
        if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) {
          invalid(at(node(k)), `${base}.${k}`, `must be an integer >= ${min}`);
        }
        return v as number;
      };
      const list = <T>(k: string, test: (x: unknown) => x is T, what: string): T[] | undefined => {
        const n = node(k);
        if (n === undefined) return undefined;
        if (!isSeq(n)) return invalid(at(n), `${base}.${k}`, `must be a list of ${what}`);
        return n.items.map((item, i) => {
          const v = isScalar(item) ? item.value : undefined;
          if (!test(v)) invalid(at(item as Node), `${base}.${k}[${i}]`, `must be ${what}`);
          return v as T;
        });
      };

      const path = str('path', (s) => s.trim() !== '', 'a non-empty path');
      if (path === undefined) invalid(at(keyNode), base, 'missing required key `path`');
      const cls = str('class', (s) => s === 'moe' || s === 'dense', '`moe` or `dense`') as
        | ModelClass
        | undefined;
      const peer = str('peer', isPeerAddress, 'host:port');
      const kvType = (s: string) => (KV_CACHE_TYPES as readonly string[]).includes(s);
      const defaults: Record<string, unknown> = {
        n_ctx: int('n_ctx', 1),
        cache_type_k: str('cache_type_k', kvType, `one of ${KV_CACHE_TYPES.join(', ')}`),
        cache_type_v: str('cache_type_v', kvType, `one of ${KV_CACHE_TYPES.join(', ')}`),
        n_gpu_layers: int('n_gpu_layers', -1),
        n_cpu_moe: int('n_cpu_moe', 0),
        override_tensors: list(
          'override_tensors',
          (x): x is string => typeof x === 'string' && /^[^=]+=[^=]+$/.test(x),
          '"<regex>=<buffer type>" strings',
        ),
        tensor_split: list(
          'tensor_split',
          (x): x is number => typeof x === 'number' && Number.isFinite(x) && x >= 0,
          'non-negative numbers',
        ),
      };
      const split = defaults.tensor_split as number[] | undefined;
      if (split !== undefined && !split.some((x) => x > 0)) {
        invalid(at(node('tensor_split')), `${base}.tensor_split`, 'needs at least one positive entry');
      }
      for (const k of Object.keys(defaults)) if (defaults[k] === undefined) delete defaults[k];
      entries.set(alias as string, {
        alias: alias as string,
        path: path as string,
        ...(cls !== undefined ? { class: cls } : {}),
        ...(peer !== undefined ? { peer } : {}),
        defaults: defaults as ModelDefaults,
      });
    }
    return new ModelRegistry(entries);
  }

  /** The entry of `alias`, or undefined. */
  get(alias: string): ModelEntry | undefined {
    return this.#entries.get(alias);
  }

  /** Every alias, in file order. */
  aliases(): string[] {
    return [...this.#entries.keys()];
  }

  /**
   * The entry of an alias; a GGUF path (containing `/` or ending `.gguf`) that is no alias gives a
   * bare entry. Anything else throws HYDRA_ERR_UNKNOWN_MODEL.
   */
  resolve(model: string): ModelEntry {
    const e = this.#entries.get(model);
    if (e !== undefined) return e;
    if (typeof model === 'string' && (model.includes('/') || model.toLowerCase().endsWith('.gguf'))) {
      return { alias: model, path: model, defaults: {} };
    }
    return fail('HYDRA_ERR_UNKNOWN_MODEL', `no model alias ${JSON.stringify(model)} in the registry`, {
      keys: ['model'],
    });
  }
}
