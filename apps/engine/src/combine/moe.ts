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
  /** One expert tensor's name per block (what decides where that block's experts go). */
  expertTensor: Record<number, string>;
  /** The norm weight (`ffn_norm`, `post_attention_norm`) those blocks feed their FFN through; undefined when the file has none. */
  ffnNorm: string | undefined;
  /** The model's block count. */
  nLayer: number;
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
  const expertTensor: Record<number, string> = {};
  const names = new Set<string>();
  for (const t of g.tensors) {
    names.add(t.name);
    const m = /^blk\.(\d+)\./.exec(t.name);
    if (m && experts.test(t.name)) expertTensor[Number(m[1])] ??= t.name;
  }
  const blocks = Object.keys(expertTensor)
    .map(Number)
    .sort((a, b) => a - b);
  const norm = POST_ATTENTION_FFN_NORM.has(arch) ? 'post_attention_norm' : 'ffn_norm';
  const ffnNorm =
    blocks.length > 0 && blocks.every((b) => names.has(`blk.${b}.${norm}.weight`)) ? norm : undefined;
  return { blocks, expertTensor, ffnNorm, nLayer };
}

/**
 * The rest of a MoE block's FFN that COMBINED puts beside its experts: the router
 * (`ffn_gate_inp`), its bias (`exp_probs_b`) and the shared experts with their gate (`*_shexp`),
 * for the blocks `sel` matches (a regex of block indices).
 */
export function moeFfnRestRegex(sel = '\\d+'): string {
  return `blk\\.${sel}\\.(ffn_gate_inp(_shexp)?|exp_probs_b|ffn_(up|down|gate|gate_up)_shexp)\\.`;
}

/** The buffer type of the first override whose pattern matches `name` (llama.cpp's rule), if any. */
function placedOn(overrides: readonly string[], name: string): string | undefined {
  for (const o of overrides) {
    const at = o.lastIndexOf('=');
    try {
      if (at > 0 && new RegExp(o.slice(0, at)).test(name)) return o.slice(at + 1);
    } catch {
      // An invalid pattern is refused by name when the model loads (HYDRA_ERR_BAD_OVERRIDE).
    }
  }
  return undefined;
}

/**
 * The overrides of the COMBINED placement: the configured ones, plus, on `bufferType` (a peer's,
 * e.g. `RPC0[127.0.0.1:50052]`), every expert tensor (`EXPERT_TENSOR_REGEX`) and, for each block
 * whose experts do land there (an earlier override such as `--n-cpu-moe` can keep some on the
 * host), the rest of its FFN ({@link moeFfnRestRegex}) and, given the model's `layout`, its FFN
 * input norm weight; unless an override other than the COMBINE table's own
 * (`EXPERT_TENSOR_REGEX=bufferType`) already places experts: then the configured list is the
 * placement (`-ot ffn_.*_exps=RPC0[...]` runs upstream's own mechanism).
 *
 * Why more than the experts: with only them on the peer (upstream's `-ot ffn_.*_exps`), llama.cpp's
 * scheduler computes the norm and the router logits on the head and ships three inputs to every
 * expert split per decode step (the normed FFN input, a reshaped view of it, the router logits)
 * besides the residual it adds there. With the norm's weight and the router on the peer, the split
 * takes the raw norm and the residual: each MoE layer costs one SET_TENSOR less per step (the
 * split count, the graphs and the bytes back are unchanged). Shared experts left on the head would
 * split each block once more. All of these are vectors or one-expert-wide matrices. A block whose
 * experts stay elsewhere keeps its router and norm too: moving them alone would add a crossing.
 */
export function expertOverrides(
  overrides: string[] | undefined,
  bufferType: string,
  layout?: MoeLayout,
): string[] {
  const list = overrides ?? [];
  // The COMBINE table's own expert override (resolveCombine, `{model, mode, peer}`) is this
  // placement's first line, not an operator's: it is completed like the default.
  const own = `${EXPERT_TENSOR_REGEX}=${bufferType}`;
  if (list.some((o) => o.includes('_exps') && o !== own)) return list;
  const out = [...list.filter((o) => o !== own), own];
  let sel = '\\d+';
  if (layout) {
    const peer = layout.blocks.filter((b) => placedOn(out, layout.expertTensor[b]!) === bufferType);
    if (peer.length === 0) return out;
    if (peer.length < layout.nLayer) sel = `(${peer.join('|')})`;
  }
  out.push(`${moeFfnRestRegex(sel)}=${bufferType}`);
  if (layout?.ffnNorm) out.push(`blk\\.${sel}\\.${layout.ffnNorm}\\.=${bufferType}`);
  return out;
}
