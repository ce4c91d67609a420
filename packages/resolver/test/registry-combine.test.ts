import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { EXPERT_TENSOR_REGEX, expertBlockRegex, resolveCombine } from '../src/combine.js';
import { readGguf } from '../src/gguf/reader.js';
import { modelClassOf } from '../src/model-facts.js';
import { ModelRegistry } from '../src/registry.js';
import { llamaModel } from './helpers/models.js';

const CONFIG = `# engine config
port: 9504
models:
  dense-27b:
    path: /models/dense-27b-Q6_K.gguf
    class: dense
    n_ctx: 262144
    cache_type_k: q8_0
    cache_type_v: f16
    tensor_split: [0.68, 0.32]
    peer: localhost:9506
  moe-35b:
    path: /models/moe-35b-a3b.gguf
    n_cpu_moe: 4
`;

const codeAt = (fn: () => unknown) => {
  try {
    fn();
  } catch (e) {
    return e as { code: string; message: string; details?: Record<string, unknown> };
  }
  throw new Error('did not throw');
};

describe('ModelRegistry', () => {
  it('parses aliases, paths and defaults keyed as CONFIGURE names', () => {
    const r = ModelRegistry.parse(CONFIG, 'engine.yaml');
    expect(r.aliases()).toEqual(['dense-27b', 'moe-35b']);
    expect(r.get('dense-27b')).toEqual({
      alias: 'dense-27b',
      path: '/models/dense-27b-Q6_K.gguf',
      class: 'dense',
      peer: 'localhost:9506',
      defaults: { n_ctx: 262144, cache_type_k: 'q8_0', cache_type_v: 'f16', tensor_split: [0.68, 0.32] },
    });
    expect(r.resolve('/x/other.gguf').path).toBe('/x/other.gguf');
    expect(codeAt(() => r.resolve('nope')).code).toBe('HYDRA_ERR_UNKNOWN_MODEL');
    expect(ModelRegistry.parse('').aliases()).toEqual([]);
  });

  it.each([
    ['unknown key', 'models:\n  a:\n    path: /m.gguf\n    ctx: 5\n', 4, 'models.a.ctx'],
    [
      'bad cache type',
      'models:\n  a:\n    path: /m.gguf\n    cache_type_k: q6_k\n',
      4,
      'models.a.cache_type_k',
    ],
    ['missing path', 'models:\n  a:\n    n_ctx: 4096\n', 2, 'models.a'],
    [
      'bad split entry',
      'models:\n  a:\n    path: /m.gguf\n    tensor_split: [1, -2]\n',
      4,
      'models.a.tensor_split[1]',
    ],
    ['bad peer', 'models:\n  a:\n    path: /m.gguf\n    peer: nohost\n', 4, 'models.a.peer'],
    ['bad class', 'models:\n  a:\n    path: /m.gguf\n    class: big\n', 4, 'models.a.class'],
    ['negative n_cpu_moe', 'models:\n  a:\n    path: /m.gguf\n    n_cpu_moe: -1\n', 4, 'models.a.n_cpu_moe'],
    ['models not a map', 'models: [1]\n', 1, 'models'],
    [
      'bad override',
      'models:\n  a:\n    path: /m.gguf\n    override_tensors: ["noequals"]\n',
      4,
      'models.a.override_tensors[0]',
    ],
    ['duplicate alias', 'models:\n  a:\n    path: /m.gguf\n  a:\n    path: /n.gguf\n', 4, ''],
  ])('%s: HYDRA_ERR_REGISTRY_INVALID naming file, line and key', (_, text, line, key) => {
    const e = codeAt(() => ModelRegistry.parse(text, 'cfg.yaml'));
    expect(e.code).toBe('HYDRA_ERR_REGISTRY_INVALID');
    expect(e.details).toMatchObject({ file: 'cfg.yaml', line, key });
    expect(e.message.startsWith(`cfg.yaml:${line}:`)).toBe(true);
  });
});

describe('resolveCombine: the unified COMBINE table', () => {
  const registry = ModelRegistry.parse(CONFIG);
  it('dense solo and dense combine', () => {
    expect(resolveCombine({ model: 'dense-27b', mode: 'solo', registry })).toEqual({
      model: 'dense-27b',
      n_gpu_layers: 99,
      split_mode: 'none',
    });
    expect(resolveCombine({ model: 'dense-27b', mode: 'combined', registry })).toEqual({
      model: 'dense-27b',
      n_gpu_layers: 99,
      split_mode: 'layer',
      tensor_split: [0.68, 0.32],
      rpc_servers: ['localhost:9506'],
    });
    expect(
      resolveCombine({
        model: 'dense-27b',
        mode: 'combined',
        registry,
        peer: '10.0.0.2:50052',
        tensorSplit: [21, 44],
      }),
    ).toMatchObject({
      tensor_split: [21, 44],
      rpc_servers: ['10.0.0.2:50052'],
    });
  });

  it('moe solo and moe combine, the class read from the GGUF', async () => {
    const g = await readGguf(
      llamaModel({ nLayer: 2, nEmbd: 64, nHead: 4, nHeadKv: 4, nFf: 64, nVocab: 64, nExpert: 4 }).source,
    );
    const modelClass = modelClassOf(g);
    expect(modelClass).toBe('moe');
    const solo = resolveCombine({ model: 'moe-35b', mode: 'solo', registry, modelClass });
    expect(solo).toEqual({
      model: 'moe-35b',
      n_gpu_layers: 99,
      n_cpu_moe: 4,
      override_tensors: ['token_embd=CPU', 'output=CPU', 'output_norm=CPU'],
    });
    const combined = resolveCombine({
      model: 'moe-35b',
      mode: 'combined',
      registry,
      modelClass,
      peer: 'localhost:9506',
    });
    expect(combined).toEqual({
      ...solo,
      override_tensors: [
        ...(solo.override_tensors as string[]),
        `${EXPERT_TENSOR_REGEX}=RPC0[localhost:9506]`,
      ],
      rpc_servers: ['localhost:9506'],
    });
    const re = new RegExp(EXPERT_TENSOR_REGEX);
    expect(g.tensors.filter((t) => re.test(t.name)).map((t) => t.name)).toEqual([
      'blk.0.ffn_gate_exps.weight',
      'blk.0.ffn_up_exps.weight',
      'blk.0.ffn_down_exps.weight',
      'blk.1.ffn_gate_exps.weight',
      'blk.1.ffn_up_exps.weight',
      'blk.1.ffn_down_exps.weight',
    ]);
  });

  it('spells the expert tensors as llama.cpp does: merged gate_up and chexps too, one block alone', () => {
    const all = new RegExp(`^${EXPERT_TENSOR_REGEX}`);
    const three = new RegExp(`^${expertBlockRegex(3)}`);
    for (const name of [
      'blk.3.ffn_gate_up_exps.weight',
      'blk.3.ffn_down_chexps.weight',
      'blk.3.ffn_up_exps.weight',
    ]) {
      expect(all.test(name), name).toBe(true);
      expect(three.test(name), name).toBe(true);
    }
    for (const name of ['blk.3.ffn_gate_shexp.weight', 'blk.3.ffn_up.weight'])
      expect(all.test(name), name).toBe(false);
    expect(three.test('blk.13.ffn_up_exps.weight')).toBe(false);
    expect(three.test('blk.4.ffn_up_exps.weight')).toBe(false);
  });

  it('rejects what it cannot resolve', () => {
    const cases: [Parameters<typeof resolveCombine>[0], string][] = [
      [{ model: 'moe-35b', mode: 'solo', registry }, 'HYDRA_ERR_BAD_VALUE'],
      [{ model: 'missing', mode: 'solo', registry, modelClass: 'dense' }, 'HYDRA_ERR_UNKNOWN_MODEL'],
      [{ model: 'moe-35b', mode: 'combined', registry, modelClass: 'moe' }, 'HYDRA_ERR_BAD_VALUE'],
      [{ model: '/m.gguf', mode: 'combined', modelClass: 'dense', peer: 'h:1' }, 'HYDRA_ERR_BAD_VALUE'],
      [{ model: '/m.gguf', mode: 'both' as never, modelClass: 'dense' }, 'HYDRA_ERR_BAD_VALUE'],
      [
        { model: '/m.gguf', mode: 'combine' as never, modelClass: 'dense', peer: 'h:1' },
        'HYDRA_ERR_BAD_VALUE',
      ],
    ];
    for (const [req, code] of cases) expect(codeAt(() => resolveCombine(req)).code).toBe(code);
  });

  it('names no OT or static mode anywhere in the source', () => {
    const dir = new URL('../src/', import.meta.url);
    const files = readdirSync(dir, { recursive: true }).filter((f) => String(f).endsWith('.ts'));
    for (const f of files) {
      const text = readFileSync(new URL(String(f), dir), 'utf8');
      expect(text).not.toMatch(/\bOT\b|static\b(?!\s+(?:parse|#|readonly|[a-z]+\())/);
    }
  });
});
