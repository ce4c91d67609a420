import { ENV_BY_KEY, flagGroup, HELP_GROUPS, UNSUPPORTED_FLAGS } from '../llama-flags.js';
import { FLAGS, type FlagSpec } from './table.js';

/** Help text for `hydra-engine [serve]`. */
export function usage(): string {
  const envOf = (f: FlagSpec) => ENV_BY_KEY[f.key]?.replace(/^!/, '');
  const rows = HELP_GROUPS.flatMap(([group, title]) => [
    '',
    title,
    ...FLAGS.filter((f) => flagGroup(f) === group).map((f) => {
      const env = f.bare === false ? undefined : envOf(f);
      return `  ${f.names.join(', ').padEnd(34)} ${f.help}${env ? ` (env: ${env})` : ''}`;
    }),
  ]);
  const refused = UNSUPPORTED_FLAGS.map((f) => f.names.join(', ')).join(' | ');
  return [
    'usage: hydra-engine [serve] [flags]',
    '       hydra-engine synth-model --out FILE [--arch ..] [--shape ..] [--quant ..] [--seed N]',
    '       hydra-engine plan --model FILE --device NAME=FREE_MIB ... [--ctx N] [--cache-type-k T] [--json]',
    '       hydra-engine bench-client --url URL [--requests N] [--concurrency N] [--max-tokens N]',
    '       hydra-engine demo',
    '',
    'flags (llama-server names; also --flag=value; LLAMA_ARG_* variables apply when a flag is not given):',
    ...rows,
    '',
    `not supported yet (exit 2): ${refused}`,
  ].join('\n');
}
