import { GgufType } from '../../src/gguf/reader.js';
import { type KvSpec, kvArr, kvStr, kvU32, type TensorSpec, writeGguf } from './gguf-writer.js';

/** A llama-layout dense model: n_layer blocks of attention + FFN at one weight type. */
export function llamaModel(o: {
  nLayer: number;
  nEmbd: number;
  nHead: number;
  nHeadKv: number;
  nFf: number;
  nVocab: number;
  type?: string;
  nExpert?: number;
  tiedOutput?: boolean;
}) {
  const t = o.type ?? 'q8_0';
  const headDim = o.nEmbd / o.nHead;
  const kv: KvSpec[] = [
    kvStr('general.architecture', 'llama'),
    kvStr('general.name', 'synthetic-llama'),
    kvU32('llama.block_count', o.nLayer),
    kvU32('llama.embedding_length', o.nEmbd),
    kvU32('llama.feed_forward_length', o.nFf),
    kvU32('llama.attention.head_count', o.nHead),
    kvU32('llama.attention.head_count_kv', o.nHeadKv),
    kvU32('llama.context_length', 4096),
    kvU32('llama.vocab_size', o.nVocab),
  ];
  if (o.nExpert) kv.push(kvU32('llama.expert_count', o.nExpert), kvU32('llama.expert_used_count', 2));
  const tensors: TensorSpec[] = [{ name: 'token_embd.weight', dims: [o.nEmbd, o.nVocab], type: t }];
  for (let il = 0; il < o.nLayer; il++) {
    const b = `blk.${il}`;
    tensors.push(
      { name: `${b}.attn_norm.weight`, dims: [o.nEmbd], type: 'f32' },
      { name: `${b}.attn_q.weight`, dims: [o.nEmbd, o.nEmbd], type: t },
      { name: `${b}.attn_k.weight`, dims: [o.nEmbd, headDim * o.nHeadKv], type: t },
      { name: `${b}.attn_v.weight`, dims: [o.nEmbd, headDim * o.nHeadKv], type: t },
      { name: `${b}.attn_output.weight`, dims: [o.nEmbd, o.nEmbd], type: t },
      { name: `${b}.ffn_norm.weight`, dims: [o.nEmbd], type: 'f32' },
    );
    if (o.nExpert) {
      tensors.push(
        { name: `${b}.ffn_gate_inp.weight`, dims: [o.nEmbd, o.nExpert], type: 'f32' },
        { name: `${b}.ffn_gate_exps.weight`, dims: [o.nEmbd, o.nFf, o.nExpert], type: t },
        { name: `${b}.ffn_up_exps.weight`, dims: [o.nEmbd, o.nFf, o.nExpert], type: t },
        { name: `${b}.ffn_down_exps.weight`, dims: [o.nFf, o.nEmbd, o.nExpert], type: t },
      );
    } else {
      tensors.push(
        { name: `${b}.ffn_gate.weight`, dims: [o.nEmbd, o.nFf], type: t },
        { name: `${b}.ffn_up.weight`, dims: [o.nEmbd, o.nFf], type: t },
        { name: `${b}.ffn_down.weight`, dims: [o.nFf, o.nEmbd], type: t },
      );
    }
  }
  tensors.push({ name: 'output_norm.weight', dims: [o.nEmbd], type: 'f32' });
  if (!o.tiedOutput) tensors.push({ name: 'output.weight', dims: [o.nEmbd, o.nVocab], type: t });
  return writeGguf(kv, tensors);
}

/**
 * The 27B hybrid of the split-limit notes, from its dimensions: 64 trunk blocks (full attention
 * every 4th: 3, 7, ..., 63, gated-delta-net linear attention otherwise) plus one MTP block,
 * n_embd 5120, 4 KV heads of 256 (n_embd_k_gqa 1024), Q6_K weights.
 */
export function hybrid27b() {
  const nEmbd = 5120;
  const nLayerAll = 65;
  const nFf = 17408;
  const nVocab = 248320;
  const kv: KvSpec[] = [
    kvStr('general.architecture', 'qwen35'),
    kvU32('qwen35.block_count', nLayerAll),
    kvU32('qwen35.nextn_predict_layers', 1),
    kvU32('qwen35.embedding_length', nEmbd),
    kvU32('qwen35.feed_forward_length', nFf),
    kvU32('qwen35.attention.head_count', 24),
    kvU32('qwen35.attention.head_count_kv', 4),
    kvU32('qwen35.attention.key_length', 256),
    kvU32('qwen35.attention.value_length', 256),
    kvU32('qwen35.full_attention_interval', 4),
    kvU32('qwen35.ssm.conv_kernel', 4),
    kvU32('qwen35.ssm.inner_size', 6144),
    kvU32('qwen35.ssm.state_size', 128),
    kvU32('qwen35.ssm.time_step_rank', 48),
    kvU32('qwen35.ssm.group_count', 16),
    kvU32('qwen35.vocab_size', nVocab),
    kvArr('qwen35.rope.dimension_sections', GgufType.INT32, [11, 11, 10, 0]),
  ];
  const t = 'q6_k';
  const tensors: TensorSpec[] = [{ name: 'token_embd.weight', dims: [nEmbd, nVocab], type: t }];
  for (let il = 0; il < nLayerAll; il++) {
    const b = `blk.${il}`;
    tensors.push({ name: `${b}.attn_norm.weight`, dims: [nEmbd], type: 'f32' });
    if (il < 64 && (il + 1) % 4 !== 0) {
      tensors.push(
        { name: `${b}.attn_qkv.weight`, dims: [nEmbd, 10240], type: t },
        { name: `${b}.attn_gate.weight`, dims: [nEmbd, 6144], type: t },
        { name: `${b}.ssm_out.weight`, dims: [6144, nEmbd], type: t },
      );
    } else {
      tensors.push(
        { name: `${b}.attn_q.weight`, dims: [nEmbd, 12288], type: t },
        { name: `${b}.attn_k.weight`, dims: [nEmbd, 1024], type: t },
        { name: `${b}.attn_v.weight`, dims: [nEmbd, 1024], type: t },
        { name: `${b}.attn_output.weight`, dims: [6144, nEmbd], type: t },
      );
    }
    tensors.push(
      { name: `${b}.ffn_gate.weight`, dims: [nEmbd, nFf], type: t },
      { name: `${b}.ffn_up.weight`, dims: [nEmbd, nFf], type: t },
      { name: `${b}.ffn_down.weight`, dims: [nFf, nEmbd], type: t },
    );
  }
  tensors.push(
    { name: 'output_norm.weight', dims: [nEmbd], type: 'f32' },
    { name: 'output.weight', dims: [nEmbd, nVocab], type: t },
  );
  return writeGguf(kv, tensors);
}
