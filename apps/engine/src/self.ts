import { existsSync } from 'node:fs';

/** The command line that runs this program again: `[node, cli.js]`, or the single executable alone. */
export function selfCommand(): { file: string; args: string[] } {
  const script = process.argv[1];
  if (script && script !== process.execPath && existsSync(script) && /\.(c|m)?js$/.test(script)) {
    return { file: process.execPath, args: [script] };
  }
  return { file: process.execPath, args: [] };
}
