// MoE + COMBINE: where the experts go.
import { EXPERT_TENSOR_REGEX } from '@hydra-engine/resolver';
import { readGgufFile } from '../placement.js';

/** Whether the GGUF at `path` declares experts (`<arch>.expert_count` > 0), read from its header. */
export async function isMoe(path: string): Promise<boolean> {
  const g = await readGgufFile(path);
  const arch = String(g.get('general.architecture'));
  return Number(g.get(`${arch}.expert_count`) ?? 0) > 0;
}

/**
 * The overrides of the COMBINED placement: the configured ones, plus every expert tensor on
 * `bufferType` (a peer's, e.g. `RPC0[127.0.0.1:50052]`) unless an override already places experts.
 */
export function expertOverrides(overrides: string[] | undefined, bufferType: string): string[] {
  const list = overrides ?? [];
  if (list.some((o) => o.includes('_exps'))) return list;
  return [...list, `${EXPERT_TENSOR_REGEX}=${bufferType}`];
}
