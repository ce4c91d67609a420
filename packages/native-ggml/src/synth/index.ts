/**
 * Synthetic GGUF models: random weights with the upstream llama (and Mixtral-style MoE) tensor
 * layout, a real SentencePiece vocabulary and a chatml template. See SYNTH.md.
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
  SYNTH_ARCHS,
  SYNTH_QUANTS,
  SYNTH_SHAPES,
  type SynthArch,
  type SynthHparams,
  type SynthQuant,
  type SynthShape,
  synthHparams,
} from './shapes.js';
