import type { HydraError } from '@hydra-engine/errors';
import { describe, expect, it } from 'vitest';
import { defaults, FIELDS, fieldFor, plan, type Tier } from '../src/index.js';

// The tier lists the registry was built from, verbatim: which common_params fields each rebuild
// tier covers. The test parses these lines, so a name that drifts from the registry fails here.
const TIER_LISTS: Record<Tier, string> = {
  T1: 'n_predict, sampling.*, n_keep, n_chunks, n_print, antiprompt, prompt_cache_*, cache_prompt, cache_idle_slots, n_cache_reuse, n_ctx_checkpoints, checkpoint_min_step, cache_ram_mib, slot_prompt_similarity, single_turn, cont_batching, ctx_shift, input_prefix/suffix/bos, prompt, system_prompt, prompt_file, api_keys, chat_template, use_jinja, enable_chat_template, force_pure_content_parser, default_template_kwargs, reasoning_format, enable_reasoning, prefill_assistant, embedding, embd_normalize, embd_out, embd_sep, cls_sep, image, image_min_tokens, image_max_tokens, timeout_read, timeout_write, sse_ping_interval, sleep_idle_seconds, server TTY-related flags, logits_file, logits_output_dir, save_logits, tensor_filter, out_file, load_progress_callback[_user_data]',
  T2: 'n_ctx, n_batch, n_ubatch, n_parallel, n_sequences, n_outputs_max, grp_attn_n, grp_attn_w, cpuparams, cpuparams_batch, cb_eval, cb_eval_user_data, numa, rope_freq_base/scale, yarn_*, rope_scaling_type, pooling_type, attention_type, flash_attn_type, cache_type_k, cache_type_v, kv_unified, swa_full, no_perf, no_kv_offload, no_op_offload, no_extra_bufts, no_host, speculative (lookup-ngram only — the model-draft field is T3)',
  T3: 'model, mmproj, n_gpu_layers, main_gpu, tensor_split, split_mode, devices, use_mmap, use_direct_io, use_mlock, check_tensors, no_alloc, kv_overrides, tensor_buft_overrides, lora_init_without_apply, lora_adapters, control_vectors, the rpc_servers list (stock --rpc-server), n_cpu_moe, speculative.model',
  T4: 'bind ports (--port, --rpc-port, --rpc-server-port), --hostname, --n-threads-http, log config, TLS cert paths, CUDA device selection',
};
const WIRE_TIERS: Record<Exclude<Tier, 'T4'>, string> = {
  T1: 'sampling.temp, sampling.top_p, sampling.top_k, sampling.min_p, sampling.penalty_repeat, seed, n_predict, n_keep, antiprompt',
  T2: 'n_ctx, cache_type_k, cache_type_v, rope_freq_base, yarn_*, rope_scaling_type',
  T3: 'n_gpu_layers, n_cpu_moe, tensor_buft_overrides (for override_tensor), split_mode, tensor_split, model.path',
};

const keysWith = (prefix: string) => FIELDS.filter((f) => f.key.startsWith(prefix)).map((f) => f.key);

/** Phrases of the lists that name a group of fields rather than one field. */
const GROUPS: Record<string, () => string[]> = {
  'sampling.*': () => [...keysWith('sampling.'), 'seed'],
  'prompt_cache_*': () => ['prompt_cache_all', 'prompt_cache_ro', 'path_prompt_cache'],
  'input_prefix/suffix/bos': () => ['input_prefix', 'input_suffix', 'input_prefix_bos'],
  'server TTY-related flags': () => [
    'use_color',
    'simple_io',
    'multiline_input',
    'interactive',
    'interactive_first',
    'display_prompt',
    'verbose_prompt',
    'escape',
    'show_timings',
  ],
  'load_progress_callback[_user_data]': () => ['load_progress_callback', 'load_progress_callback_user_data'],
  cpuparams: () => keysWith('cpuparams.'),
  cpuparams_batch: () => keysWith('cpuparams_batch.'),
  'rope_freq_base/scale': () => ['rope_freq_base', 'rope_freq_scale'],
  'yarn_*': () => keysWith('yarn_'),
  'speculative (lookup-ngram only — the model-draft field is T3)': () =>
    keysWith('speculative.').filter(
      (k) => k !== 'speculative.model' && k !== 'speculative.n_gpu_layers' && k !== 'speculative.devices',
    ),
  'the rpc_servers list (stock --rpc-server)': () => ['rpc_servers'],
  'tensor_buft_overrides (for override_tensor)': () => ['tensor_buft_overrides', 'override_tensor'],
  'bind ports (--port, --rpc-port, --rpc-server-port)': () => ['port', 'rpc_port', 'rpc_server_port'],
  '--hostname': () => ['hostname'],
  '--n-threads-http': () => ['n_threads_http'],
  'log config': () => keysWith('log_'),
  'TLS cert paths': () => keysWith('ssl_'),
  'CUDA device selection': () => ['cuda_visible_devices'],
};

/** Fields the registry holds beyond the tier lists, with the tier each gets and why. */
const EXTRAS: Record<string, Tier> = {
  state_chunk_size: 'T1', // protocol.md's legacy CONFIGURE form
  // COMBINE failover settings (issue 22): read at the next peer loss, so a CONFIGURE reloads nothing.
  failover_policy: 'T1',
  peer_rejoin: 'T1',
  device_memory_cap: 'T1',
  'model.url': 'T3', // common_params_model sub-struct fields of `model`
  'model.hf_repo': 'T3',
  'model.hf_file': 'T3',
  'model.docker_repo': 'T3',
  'speculative.n_gpu_layers': 'T3', // the draft model's load setting: "the model-draft field is T3"
  'speculative.devices': 'T3', // the draft model's devices (-devd), a load setting too
  host: 'T4', // protocol.md names host, control_allow_from is the --control-allow-from allowlist
  control_allow_from: 'T4',
  api_key: 'T4',
  reuse_port: 'T4',
  public_path: 'T4',
  api_prefix: 'T4',
};

function expand(list: string): string[] {
  const items = list.split(/, (?![^(]*\))/);
  return items.flatMap((item) => GROUPS[item.trim()]?.() ?? [item.trim()]);
}

describe('registry tiers pinned against the tier lists', () => {
  const pinned = new Map<string, Tier>();
  for (const [source, lists] of [
    ['tier lists', TIER_LISTS],
    ['wire tier table', WIRE_TIERS],
  ] as const) {
    for (const [tier, list] of Object.entries(lists) as [Tier, string][]) {
      for (const name of expand(list)) {
        it(`${source} ${tier}: ${name}`, () => {
          const spec = fieldFor(name);
          expect(spec, `${name} is missing from the registry`).toBeDefined();
          expect(spec!.tier).toBe(tier);
        });
        const key = fieldFor(name)?.key;
        if (key !== undefined) pinned.set(key, tier);
      }
    }
  }
  for (const [key, tier] of Object.entries(EXTRAS)) pinned.set(key, tier);

  it.each(FIELDS.map((f) => [f.key, f.tier] as const))('%s is pinned at %s', (key, tier) => {
    expect(pinned.get(key), `${key} has no tier in the tier lists or EXTRAS`).toBe(tier);
  });

  it('sends T1 sampling to the sampler, T2 to the context, T3 to the model', () => {
    for (const f of FIELDS) {
      if (f.key.startsWith('sampling.') || f.key === 'seed') expect(f.via).toBe('sampler');
      if (f.tier === 'T2') expect(f.via).toBe('context');
      if (f.tier === 'T3') expect(f.via).toBe('model');
      if (f.tier === 'T4') expect(f.via).toBe('engine');
    }
  });
});

describe('registry entries', () => {
  it('uses the wire names as canonical keys', () => {
    for (const name of [
      'override_tensors',
      'rpc_servers',
      'state_chunk_size',
      'n_ctx',
      'seed',
      'model',
      'flash_attn',
    ]) {
      expect(fieldFor(name)?.key).toBe(name);
    }
    expect(fieldFor('tensor_buft_overrides')?.key).toBe('override_tensors');
    expect(fieldFor('sampling.seed')?.key).toBe('seed');
    expect(fieldFor('model.path')?.key).toBe('model');
    expect(fieldFor('flash_attn_type')?.key).toBe('flash_attn');
  });

  it('has a default inside its own type and bounds for every field', () => {
    for (const f of FIELDS) {
      // An "auto" field's default is a value of its inner type.
      const t = f.type.kind === 'auto' ? f.type.of : f.type;
      const d = f.default;
      if (t.kind === 'int' || t.kind === 'number') {
        expect(typeof d, f.key).toBe('number');
        expect(d as number, f.key).toBeGreaterThanOrEqual(t.min);
        expect(d as number, f.key).toBeLessThanOrEqual(t.max);
        if (t.kind === 'int') expect(Number.isInteger(d), f.key).toBe(true);
      } else if (t.kind === 'enum') expect(t.values, f.key).toContain(d);
      else if (t.kind === 'bool') expect(typeof d, f.key).toBe('boolean');
      else if (t.kind === 'string') expect(typeof d, f.key).toBe('string');
      else if (t.kind === 'list') expect(Array.isArray(d), f.key).toBe(true);
      else expect(typeof d, f.key).toBe('object');
    }
  });

  it('pins the ranges and enums the protocol relies on', () => {
    const sc = fieldFor('state_chunk_size')!;
    expect(sc.type).toMatchObject({ kind: 'int', min: 64 * 1024, max: 64 * 1024 * 1024 });
    expect(sc.clamp).toBe(true);
    expect(fieldFor('split_mode')!.type).toMatchObject({ values: ['none', 'layer', 'row'] });
    expect(fieldFor('cache_type_k')!.type).toMatchObject({
      values: ['f32', 'f16', 'bf16', 'q8_0', 'q4_0', 'q4_1', 'iq4_nl', 'q5_0', 'q5_1'],
    });
    expect(fieldFor('flash_attn')!.type).toMatchObject({ values: ['on', 'off', 'auto'] });
    expect(FIELDS.filter((f) => f.clamp).map((f) => f.key)).toEqual(['state_chunk_size']);
  });

  it('gives layer 1 defaults for runtime fields only', () => {
    const d = defaults();
    expect(d.port).toBeUndefined();
    expect(d.mmproj).toBeUndefined();
    expect(d['sampling.temp']).toBe(0.8);
    expect(d.n_batch).toBe(2048);
    expect(d.split_mode).toBe('layer');
    expect(d.antiprompt).toBeUndefined(); // refused: not implemented by the engine
    d.devices = ['x'];
    expect(defaults().devices).toEqual([]);
  });
});

describe('fields the engine cannot honor', () => {
  const refused = FIELDS.filter((f) => f.tier !== 'T4' && f.unsupported !== undefined);

  it.each(refused.map((f) => [f.key, f]))('%s is refused whole, by name, in every spelling', (_, f) => {
    for (const name of [f.key, ...f.aliases]) {
      let err: HydraError | undefined;
      try {
        plan(defaults(), { 'sampling.temp': 0.5, [name]: structuredClone(f.default) });
      } catch (e) {
        err = e as HydraError;
      }
      expect(err?.code).toBe('HYDRA_ERR_UNSUPPORTED_FIELD');
      expect(err?.keys).toEqual([name]);
    }
  });

  it('refuses every speculative.* field but the n-gram and draft-model ones', () => {
    const spec = FIELDS.filter((f) => f.key.startsWith('speculative.'));
    expect(spec.length).toBeGreaterThan(10);
    expect(spec.filter((f) => f.unsupported === undefined).map((f) => f.key)).toEqual([
      'speculative.types',
      'speculative.n_max',
      'speculative.n_min',
      'speculative.p_min',
      'speculative.ngram_size_n',
      'speculative.ngram_size_m',
      'speculative.ngram_map_k.size_n',
      'speculative.ngram_map_k.size_m',
      'speculative.ngram_map_k.min_hits',
      'speculative.ngram_map_k4v.size_n',
      'speculative.ngram_map_k4v.size_m',
      'speculative.ngram_map_k4v.min_hits',
      'speculative.ngram_mod.n_match',
      'speculative.ngram_mod.n_max',
      'speculative.ngram_mod.n_min',
      'speculative.model',
      'speculative.n_gpu_layers',
      'speculative.devices',
    ]);
    // Every n-gram type, draft_simple and none are implemented: the draft-model heads are refused by name.
    expect(plan(defaults(), { 'speculative.types': ['ngram_simple'] }).paramsApplied).toEqual({
      'speculative.types': ['ngram_simple'],
    });
    expect(
      plan(defaults(), { 'speculative.types': ['ngram-map-k', 'ngram-map-k4v', 'ngram-mod', 'ngram-cache'] })
        .paramsApplied,
    ).toEqual({ 'speculative.types': ['ngram_map_k', 'ngram_map_k4v', 'ngram_mod', 'ngram_cache'] });
    expect(() => plan(defaults(), { 'speculative.types': ['draft_mtp'] })).toThrow(
      expect.objectContaining({ keys: ['speculative.types'] }),
    );
    expect(plan(defaults(), { 'speculative.types': ['draft-simple'] }).paramsApplied).toEqual({
      'speculative.types': ['draft_simple'],
    });
    expect(() => plan(defaults(), { 'speculative.types': ['draft_eagle3'] })).toThrow(
      expect.objectContaining({ keys: ['speculative.types'] }),
    );
  });
});

describe('COMBINE failover settings', () => {
  it('failover_policy takes auto, solo, offload, none and refuses anything else by name', () => {
    for (const v of ['auto', 'solo', 'offload', 'none'])
      expect(plan(defaults(), { failover_policy: v }).paramsApplied).toEqual({ failover_policy: v });
    expect(defaults().failover_policy).toBe('auto');
    expect(() => plan(defaults(), { failover_policy: 'reload' })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_VALUE', keys: ['failover_policy'] }),
    );
  });

  it('device_memory_cap items are NAME=MiB with a positive MiB', () => {
    const r = plan(defaults(), { device_memory_cap: ['CPU=512', 'CUDA0=12288'] });
    expect(r.tier).toBe('T1');
    expect(r.rebuild).toBe('none');
    for (const bad of ['CPU', 'CPU=0', 'CPU=-1', 'CPU=1.5', '=5', 'C PU=5'])
      expect(() => plan(defaults(), { device_memory_cap: [bad] })).toThrow(
        expect.objectContaining({ code: 'HYDRA_ERR_BAD_VALUE' }),
      );
  });
});
