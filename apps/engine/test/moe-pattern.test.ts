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
    expect(list).toHaveLength(2);
    expect(list[1]!.endsWith('=RPC0[127.0.0.1:50052]')).toBe(true);
    const re = patternOf(list[1]!);
    for (const n of EXPERTS) expect(re.test(n), n).toBe(true);
    for (const n of NOT_EXPERTS) expect(re.test(n), n).toBe(false);
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
