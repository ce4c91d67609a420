import { EXPERT_TENSOR_REGEX } from '@hydra-engine/resolver';
import { describe, expect, it } from 'vitest';
import { expertOverrides } from '../src/combine/moe.js';
import { modelParamsFrom } from '../src/core/params.js';

// The engine's two expert overrides (COMBINED placement, --n-cpu-moe) use the resolver's pattern,
// which is llama.cpp's: a model with merged gate_up or channel-wise experts must move them all.
const EXPERTS = ['blk.2.ffn_gate_up_exps.weight', 'blk.2.ffn_down_chexps.weight', 'blk.2.ffn_up_exps.weight'];
const NOT_EXPERTS = ['blk.2.ffn_gate_shexp.weight', 'blk.2.ffn_up.weight', 'blk.2.attn_q.weight'];

function patternOf(override: string): RegExp {
  return new RegExp(override.slice(0, override.lastIndexOf('=')));
}

describe('expert tensor patterns', () => {
  it('COMBINED placement sends merged gate_up and chexps experts to the peer, nothing else', () => {
    const list = expertOverrides(['token_embd=CPU'], 'RPC0[127.0.0.1:50052]');
    expect(list[0]).toBe('token_embd=CPU');
    expect(list).toHaveLength(3);
    for (const o of list.slice(1)) expect(o.endsWith('=RPC0[127.0.0.1:50052]')).toBe(true);
    const re = patternOf(list[1]!);
    for (const n of EXPERTS) expect(re.test(n), n).toBe(true);
    for (const n of NOT_EXPERTS) expect(re.test(n), n).toBe(false);
  });

  it("COMBINED also moves the router, shared experts and, per the layout, only the MoE blocks' FFN norm", () => {
    const layout = {
      blocks: [1, 3],
      expertTensor: { 1: 'blk.1.ffn_up_exps.weight', 3: 'blk.3.ffn_up_exps.weight' },
      ffnNorm: 'ffn_norm',
      nLayer: 4,
    };
    const list = expertOverrides(undefined, 'RPC0[h:1]', layout);
    const res = list.map(patternOf);
    const moved = (n: string) => res.some((re) => re.test(n));
    for (const n of [
      'blk.3.ffn_gate_inp.weight',
      'blk.3.exp_probs_b.bias',
      'blk.3.ffn_gate_shexp.weight',
      'blk.3.ffn_gate_inp_shexp.weight',
      'blk.1.ffn_norm.weight',
      'blk.3.ffn_norm.weight',
    ])
      expect(moved(n), n).toBe(true);
    for (const n of [
      'blk.0.ffn_norm.weight',
      'blk.2.ffn_norm.weight',
      'blk.13.ffn_norm.weight',
      'blk.3.ffn_up.weight',
      'blk.3.attn_norm.weight',
    ])
      expect(moved(n), n).toBe(false);
    // Experts already placed by the configuration: that list is the placement, as written.
    expect(expertOverrides(['ffn_.*_exps=RPC0[h:1]'], 'RPC0[h:1]', layout)).toEqual([
      'ffn_.*_exps=RPC0[h:1]',
    ]);
    // The COMBINE table's own line (CONFIGURE {model, mode, peer}) is completed, not duplicated.
    const table = expertOverrides(
      ['token_embd=CPU', `${EXPERT_TENSOR_REGEX}=RPC0[h:1]`],
      'RPC0[h:1]',
      layout,
    );
    expect(table).toEqual(['token_embd=CPU', ...list]);
  });

  it('COMBINED leaves the router and norm of blocks whose experts an earlier override keeps (n_cpu_moe) on the host', () => {
    const layout = {
      blocks: [0, 1, 2, 3],
      expertTensor: Object.fromEntries([0, 1, 2, 3].map((b) => [b, `blk.${b}.ffn_gate_exps.weight`])),
      ffnNorm: 'ffn_norm',
      nLayer: 4,
    };
    const host = modelParamsFrom({ n_cpu_moe: 2, n_gpu_layers: 99 }, '/m.gguf').overrides ?? [];
    const list = expertOverrides(host, 'RPC0[h:1]', layout);
    const where = (n: string) => {
      const o = list.find((x) => patternOf(x).test(n));
      return o?.slice(o.lastIndexOf('=') + 1);
    };
    expect(where('blk.1.ffn_up_exps.weight')).toBe('CPU');
    expect(where('blk.2.ffn_up_exps.weight')).toBe('RPC0[h:1]');
    for (const n of ['blk.0.ffn_gate_inp.weight', 'blk.1.ffn_norm.weight'])
      expect(where(n), n).toBeUndefined();
    for (const n of ['blk.2.ffn_gate_inp.weight', 'blk.3.ffn_norm.weight'])
      expect(where(n), n).toBe('RPC0[h:1]');
    // Every block's experts kept on the host: nothing but the (unused) expert line is added.
    const all = modelParamsFrom({ n_cpu_moe: 8, n_gpu_layers: 99 }, '/m.gguf').overrides ?? [];
    expect(expertOverrides(all, 'RPC0[h:1]', layout)).toHaveLength(all.length + 1);
  });

  it('n_cpu_moe keeps every expert spelling of the first N blocks on the host, and only those', () => {
    const p = modelParamsFrom({ n_cpu_moe: 3, n_gpu_layers: 99 }, '/m.gguf');
    const host = (p.overrides ?? []).filter((o) => o.endsWith('=CPU')).map(patternOf);
    expect(host).toHaveLength(3);
    for (const n of EXPERTS)
      expect(
        host.some((re) => re.test(n)),
        n,
      ).toBe(true);
    expect(host.some((re) => re.test('blk.3.ffn_gate_up_exps.weight'))).toBe(false);
    for (const n of NOT_EXPERTS)
      expect(
        host.some((re) => re.test(n)),
        n,
      ).toBe(false);
  });
});
