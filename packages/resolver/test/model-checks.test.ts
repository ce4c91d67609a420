import { describe, expect, it } from 'vitest';
import { GgufType, readGguf } from '../src/gguf/reader.js';
import { checkHparams, LLAMA_MAX_LAYERS } from '../src/model-checks.js';
import { modelFactsFromGguf } from '../src/model-facts.js';
import { contextFit } from '../src/planner.js';
import { type KvSpec, kvArr, kvStr, kvU32, writeGguf } from './helpers/gguf-writer.js';
import { llamaModel } from './helpers/models.js';

const MIB = 1024 * 1024;
const GIB = 1024 * MIB;

/** A two-block llama header with `extra` entries replacing or adding metadata. */
async function header(extra: KvSpec[], arch = 'llama') {
  const base: KvSpec[] = [
    kvStr('general.architecture', arch),
    kvU32(`${arch}.block_count`, 2),
    kvU32(`${arch}.embedding_length`, 64),
    kvU32(`${arch}.attention.head_count`, 4),
    kvU32(`${arch}.context_length`, 2048),
  ];
  const keys = new Set(extra.map((e) => e.key));
  const kv = [...base.filter((e) => !keys.has(e.key)), ...extra];
  const tensors = [{ name: 'token_embd.weight', dims: [64, 32], type: 'f32' }];
  return readGguf(writeGguf(kv, tensors).source);
}

async function refusal(extra: KvSpec[], arch?: string): Promise<{ code: string; keys: string[] }> {
  const g = await header(extra, arch);
  try {
    checkHparams(g);
  } catch (err) {
    const e = err as { code: string; keys: string[] };
    return { code: e.code, keys: e.keys };
  }
  return { code: 'none', keys: [] };
}

describe('checkHparams: the asserts of llama_model::load_hparams', () => {
  it('accepts a well-formed header and real llama and MoE layouts', async () => {
    expect(await refusal([])).toEqual({ code: 'none', keys: [] });
    const dense = llamaModel({ nLayer: 4, nEmbd: 256, nHead: 4, nHeadKv: 2, nFf: 512, nVocab: 1000 });
    const g = await readGguf(dense.source);
    expect(() => checkHparams(g)).not.toThrow();
    const moe = llamaModel({ nLayer: 2, nEmbd: 64, nHead: 4, nHeadKv: 4, nFf: 64, nVocab: 32, nExpert: 8 });
    const gm = await readGguf(moe.source);
    expect(() => checkHparams(gm)).not.toThrow();
  });

  it('refuses block_count 0, past 512 and 1e9 (GGML_ASSERT n_layer_all in 1..LLAMA_MAX_LAYERS)', async () => {
    for (const n of [0, LLAMA_MAX_LAYERS + 1, 1e9]) {
      expect(await refusal([kvU32('llama.block_count', n)])).toEqual({
        code: 'HYDRA_ERR_MODEL_METADATA',
        keys: ['llama.block_count'],
      });
    }
    expect((await refusal([kvU32('llama.block_count', LLAMA_MAX_LAYERS)])).code).toBe('none');
  });

  it('refuses nextn layers past the block count', async () => {
    expect(await refusal([kvU32('llama.nextn_predict_layers', 3)])).toEqual({
      code: 'HYDRA_ERR_MODEL_METADATA',
      keys: ['llama.nextn_predict_layers'],
    });
    expect((await refusal([kvU32('llama.nextn_predict_layers', 2)])).code).toBe('none');
  });

  it('refuses expert counts llama.cpp asserts on', async () => {
    const cases: [KvSpec[], string][] = [
      [[kvU32('llama.expert_count', 1025), kvU32('llama.expert_used_count', 2)], 'llama.expert_count'],
      [[kvU32('llama.expert_count', 8), kvU32('llama.expert_used_count', 9)], 'llama.expert_used_count'],
      [[kvU32('llama.expert_count', 8)], 'llama.expert_used_count'],
      [[kvU32('llama.expert_used_count', 2)], 'llama.expert_used_count'],
      [[kvU32('llama.expert_group_count', 2)], 'llama.expert_group_count'],
      [
        [
          kvU32('llama.expert_count', 8),
          kvU32('llama.expert_used_count', 2),
          kvU32('llama.expert_group_count', 8),
        ],
        'llama.expert_group_count',
      ],
      [
        [
          kvU32('llama.expert_count', 8),
          kvU32('llama.expert_used_count', 2),
          kvU32('llama.expert_group_count', 3),
        ],
        'llama.expert_group_count',
      ],
      [
        [
          kvU32('llama.expert_count', 8),
          kvU32('llama.expert_used_count', 2),
          kvU32('llama.expert_group_count', 4),
          kvU32('llama.expert_group_used_count', 4),
        ],
        'llama.expert_group_used_count',
      ],
      [
        [kvU32('llama.expert_count', 8), kvArr('llama.expert_used_count', GgufType.UINT32, [2, 9])],
        'llama.expert_used_count',
      ],
    ];
    for (const [kv, key] of cases) {
      expect(await refusal(kv)).toEqual({ code: 'HYDRA_ERR_MODEL_METADATA', keys: [key] });
    }
    const fine = [
      kvU32('llama.expert_count', 8),
      kvU32('llama.expert_used_count', 2),
      kvU32('llama.expert_group_count', 4),
      kvU32('llama.expert_group_used_count', 2),
    ];
    expect((await refusal(fine)).code).toBe('none');
    // hunyuan-dense drops a single expert (and its used count) before the asserts.
    const hunyuan = [kvU32('hunyuan-dense.expert_count', 1), kvU32('hunyuan-dense.expert_used_count', 1)];
    expect((await refusal(hunyuan, 'hunyuan-dense')).code).toBe('none');
  });

  it('refuses a rope scaling type llama.cpp does not know (it maps to UNSPECIFIED and asserts)', async () => {
    expect(await refusal([kvStr('llama.rope.scaling.type', 'bogus')])).toEqual({
      code: 'HYDRA_ERR_MODEL_METADATA',
      keys: ['llama.rope.scaling.type'],
    });
    for (const t of ['none', 'linear', 'yarn', 'longrope'])
      expect((await refusal([kvStr('llama.rope.scaling.type', t)])).code).toBe('none');
  });

  it('modelFactsFromGguf refuses block_count 1e9 before sizing anything by it', async () => {
    const g = await header([kvU32('llama.block_count', 1e9)]);
    const t0 = performance.now();
    expect(() => modelFactsFromGguf(g)).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_MODEL_METADATA' }),
    );
    expect(performance.now() - t0).toBeLessThan(100);
    expect(modelFactsFromGguf(await header([])).nCtxTrain).toBe(2048);
  });
});

describe('contextFit: a context checked against memory before it is built', () => {
  const facts = async () =>
    modelFactsFromGguf(
      await readGguf(
        llamaModel({ nLayer: 4, nEmbd: 256, nHead: 4, nHeadKv: 2, nFf: 512, nVocab: 1000 }).source,
      ),
    );

  it('refuses n_ctx 2e9 on a 16 GiB host and accepts 4096', async () => {
    const f = await facts();
    const cpu = [{ name: 'CPU', freeBytes: 16 * GIB }];
    const short = contextFit(f, { next: { devices: cpu, nCtx: 2_000_000_000 }, hostFreeBytes: 16 * GIB });
    expect(short?.device).toBe('CPU');
    // 4 layers x (128 + 128 f16 elements) x 2 B x 2e9 cells: about 3.7 TiB.
    expect(short!.needBytes).toBeGreaterThan(4 * 512 * 2e9);
    expect(contextFit(f, { next: { devices: cpu, nCtx: 4096 }, hostFreeBytes: 16 * GIB })).toBeNull();
  });

  it('counts what the context in force holds as free (a rebuild frees it first)', async () => {
    const f = await facts();
    // KV of 65536 cells: 4 x 512 B x 65536 = 128 MiB; with 300 MiB free the margin (256 MiB) and
    // compute do not fit unless the current 65536-cell context is counted as freed.
    const dev = [{ name: 'CUDA0', freeBytes: 300 * MIB }];
    const next = { devices: dev, nCtx: 65536 };
    expect(contextFit(f, { next, hostFreeBytes: GIB })?.device).toBe('CUDA0');
    expect(contextFit(f, { next, current: next, hostFreeBytes: GIB })).toBeNull();
  });

  it('counts the context of another model in force as freed (a reload): currentFacts', async () => {
    const f = await facts();
    const wide = modelFactsFromGguf(
      await readGguf(
        llamaModel({ nLayer: 8, nEmbd: 512, nHead: 8, nHeadKv: 8, nFf: 512, nVocab: 1000 }).source,
      ),
    );
    // The wide model's 65536 cells hold 8 x 2048 B x 65536 = 1 GiB, which the small model's
    // 128 MiB context fits into once it is freed, not before.
    const dev = [{ name: 'CUDA0', freeBytes: 64 * MIB }];
    const next = { devices: dev, nCtx: 65536, marginBytes: 0 };
    expect(contextFit(f, { next, hostFreeBytes: GIB })?.device).toBe('CUDA0');
    expect(contextFit(f, { next, current: next, currentFacts: wide, hostFreeBytes: GIB })).toBeNull();
  });

  it('puts the batch buffers (n_batch capped at n_ctx) on the host', async () => {
    const f = await facts();
    const dev = [{ name: 'CUDA0', freeBytes: 80 * GIB }];
    const r = contextFit(f, { next: { devices: dev, nCtx: 1 << 20 }, nBatch: 1 << 20, hostFreeBytes: MIB });
    expect(r?.device).toBe('host');
    expect(
      contextFit(f, { next: { devices: dev, nCtx: 4096 }, nBatch: 1 << 20, hostFreeBytes: MIB }),
    ).toBeNull();
  });

  it('validates its own options', async () => {
    const f = await facts();
    const next = { devices: [{ name: 'CPU', freeBytes: GIB }], nCtx: 4096 };
    expect(() => contextFit(f, { next, hostFreeBytes: -1 })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_VALUE', keys: ['hostFreeBytes'] }),
    );
    expect(() => contextFit(f, { next, nBatch: 0, hostFreeBytes: GIB })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_VALUE', keys: ['nBatch'] }),
    );
  });
});
