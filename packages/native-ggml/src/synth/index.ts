/**
 * Synthetic GGUF models: random weights with the upstream llama (and Mixtral-style MoE), qwen35 and
 * qwen35moe tensor layouts, a real SentencePiece vocabulary and a chatml template. See SYNTH.md.
 */
export { parseSynthArgs, runSynthCli, SYNTH_USAGE, type SynthArgs, type SynthCliIo } from './cli.js';
export {
  planSyntheticModel,
  type SynthModelOptions,
  type SynthModelPlan,
  type SynthModelResult,
  type SynthProgress,
  writeSyntheticModel,
} from './generate.js';
export {
  SYNTH_ARCH_SHAPES,
  SYNTH_ARCHS,
  SYNTH_QUANTS,
  SYNTH_SHAPES,
  type SynthArch,
  type SynthHparams,
  type SynthHybridHparams,
  type SynthQuant,
  type SynthShape,
  synthHparams,
} from './shapes.js';
