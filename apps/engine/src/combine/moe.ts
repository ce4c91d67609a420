// MoE + COMBINE: where the experts go.
import { EXPERT_TENSOR_REGEX } from '@hydra-engine/resolver';
import { readGgufFile } from '../placement.js';

/** Whether the GGUF at `path` declares experts (`<arch>.expert_count` > 0), read from its header. */
export async function isMoe(path: string): Promise<boolean> {
  const g = await readGgufFile(path);
  const arch = String(g.get('general.architecture'));
  return Number(g.get(`${arch}.expert_count`) ?? 0) > 0;
}

/** Which blocks of a MoE model hold experts, and the name of their FFN input norm's weight. */
export interface MoeLayout {
  /** Indices of the blocks with expert tensors, ascending. */
  blocks: number[];
  /** The norm weight (`ffn_norm`, `post_attention_norm`) those blocks feed their FFN through; undefined when the file has none. */
  ffnNorm: string | undefined;
  /** Whether every block holds experts (no dense leading blocks). */
  all: boolean;
}

// Architectures whose FFN input norm is `post_attention_norm` (llama.cpp's qwen35moe and
// qwen3next graphs); elsewhere that name is an attention output norm, and `ffn_norm` is the one.
const POST_ATTENTION_FFN_NORM = new Set(['qwen35moe', 'qwen3next']);

/** The {@link MoeLayout} of the GGUF at `path`, undefined for a model without experts. */
export async function moeLayout(path: string): Promise<MoeLayout | undefined> {
  const g = await readGgufFile(path);
  const arch = String(g.get('general.architecture'));
  if (Number(g.get(`${arch}.expert_count`) ?? 0) <= 0) return undefined;
  const nLayer = Number(g.get(`${arch}.block_count`) ?? 0);
  const experts = new RegExp(EXPERT_TENSOR_REGEX);
  const blocks = new Set<number>();
  const names = new Set<string>();
  for (const t of g.tensors) {
    names.add(t.name);
    const m = /^blk\.(\d+)\./.exec(t.name);
    if (m && experts.test(t.name)) blocks.add(Number(m[1]));
  }
  const sorted = [...blocks].sort((a, b) => a - b);
  const norm = POST_ATTENTION_FFN_NORM.has(arch) ? 'post_attention_norm' : 'ffn_norm';
  const ffnNorm =
    sorted.length > 0 && sorted.every((b) => names.has(`blk.${b}.${norm}.weight`)) ? norm : undefined;
  return { blocks: sorted, ffnNorm, all: sorted.length === nLayer };
}

/**
 * The rest of each MoE block's FFN that COMBINED puts beside the experts: the router
 * (`ffn_gate_inp`), its bias (`exp_probs_b`) and the shared experts with their gate (`*_shexp`).
 */
export const MOE_FFN_REST_REGEX =
  'blk\\.\\d+\\.(ffn_gate_inp(_shexp)?|exp_probs_b|ffn_(up|down|gate|gate_up)_shexp)\\.';

/**
 * The overrides of the COMBINED placement: the configured ones, plus, on `bufferType` (a peer's,
 * e.g. `RPC0[127.0.0.1:50052]`), every expert tensor, the rest of each MoE FFN
 * ({@link MOE_FFN_REST_REGEX}) and, given the model's `layout`, the FFN input norm weight of the
 * expert blocks; unless an override already places experts: then the configured list is the
 * placement (`-ot ffn_.*_exps=RPC0[...]` runs upstream's own mechanism).
 *
 * Why more than the experts: with only them on the peer (upstream's `-ot ffn_.*_exps`), llama.cpp's
 * scheduler computes the norm and the router logits on the head and ships three inputs to every
 * expert split per decode step (the normed FFN input, a reshaped view of it, the router logits)
 * besides the residual it adds there. With the norm's weight and the router on the peer, the split
 * takes the raw norm and the residual: each MoE layer costs one SET_TENSOR less per step (the
 * split count, the graphs and the bytes back are unchanged). Shared experts left on the head would
 * split each block once more. All of these are vectors or one-expert-wide matrices.
 */
export function expertOverrides(
  overrides: string[] | undefined,
  bufferType: string,
  layout?: MoeLayout,
): string[] {
  const list = overrides ?? [];
  if (list.some((o) => o.includes('_exps'))) return list;
  const out = [...list, `${EXPERT_TENSOR_REGEX}=${bufferType}`, `${MOE_FFN_REST_REGEX}=${bufferType}`];
  if (layout?.ffnNorm) {
    const blocks = layout.all ? '\\d+' : `(${layout.blocks.join('|')})`;
    out.push(`blk\\.${blocks}\\.${layout.ffnNorm}\\.=${bufferType}`);
  }
  return out;
}
